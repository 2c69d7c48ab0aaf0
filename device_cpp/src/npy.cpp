#include "npy.h"

#include <cstring>
#include <regex>

namespace fedsdk {
namespace {

struct Npy {
  std::string descr;
  std::vector<int64_t> shape;
  std::string data;
};

// .npy v1/v2/v3: magic "\x93NUMPY", version, header length, a Python dict literal, data.
Npy read_npy(const std::string& path) {
  std::string bytes = read_file(path);
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw std::runtime_error(path + ": not a .npy file");
  size_t header_len, start;
  if (bytes[6] == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    start = 10;
  } else {
    if (bytes.size() < 12) throw std::runtime_error(path + ": truncated .npy header");
    header_len = 0;
    for (int i = 11; i >= 8; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
    start = 12;
  }
  if (start + header_len > bytes.size()) throw std::runtime_error(path + ": truncated .npy header");
  std::string header = bytes.substr(start, header_len);
  std::smatch m;
  Npy out;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'"))) throw std::runtime_error(path + ": no descr");
  out.descr = m[1];
  if (std::regex_search(header, m, std::regex("'fortran_order':\\s*True")))
    throw std::runtime_error(path + ": Fortran order is not supported");
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) throw std::runtime_error(path + ": no shape");
  std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    out.shape.push_back(std::stoll(it->str()));
  out.data = bytes.substr(start + header_len);
  return out;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

Dataset load_dataset_dir(const std::string& dir) {
  Npy x = read_npy(dir + "/x.npy"), y = read_npy(dir + "/y.npy");
  if (x.descr != "<f4" || x.shape.size() != 4) throw std::runtime_error("x.npy must be float32 (N, C, H, W)");
  if (y.shape.size() != 1 || y.shape[0] != x.shape[0]) throw std::runtime_error("y.npy must be (N,) like x.npy");
  Dataset d;
  d.n = x.shape[0], d.c = x.shape[1], d.h = x.shape[2], d.w = x.shape[3];
  if (static_cast<int64_t>(x.data.size()) != numel(x.shape) * 4) throw std::runtime_error("x.npy: wrong data length");
  d.x.resize(numel(x.shape));
  std::memcpy(d.x.data(), x.data.data(), x.data.size());
  d.y.resize(d.n);
  if (y.descr == "<i8" && static_cast<int64_t>(y.data.size()) == d.n * 8) {
    std::memcpy(d.y.data(), y.data.data(), y.data.size());
  } else if (y.descr == "<i4" && static_cast<int64_t>(y.data.size()) == d.n * 4) {
    std::vector<int32_t> tmp(d.n);
    std::memcpy(tmp.data(), y.data.data(), y.data.size());
    for (int64_t i = 0; i < d.n; ++i) d.y[i] = tmp[i];
  } else {
    throw std::runtime_error("y.npy must be int64 or int32");
  }
  return d;
}

}  // namespace fedsdk
