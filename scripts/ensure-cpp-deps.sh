#!/bin/sh
# Make sure the C++ device client (device_cpp/) can be built: a compiler, CMake, and the
# Debian development packages of libmosquitto, nlohmann-json and OpenSSL. The tests build it
# (Release, -j2) against the ExecuTorch runtime of the venv's executorch wheel.
set -e
here="$(dirname "$0")"
sh "$here/ensure-package.sh" g++ /usr/bin/g++
sh "$here/ensure-package.sh" cmake /usr/bin/cmake
sh "$here/ensure-package.sh" libmosquitto-dev /usr/include/mosquitto.h
sh "$here/ensure-package.sh" nlohmann-json3-dev /usr/include/nlohmann/json.hpp
sh "$here/ensure-package.sh" libssl-dev /usr/include/openssl/evp.h
