"""Build the native ExecuTorch shim (``native/fedsdk_executorch.cpp``) with a C++ compiler.

The shim is compiled against the headers and shared libraries the ``executorch`` wheel ships
(``executorch/include``, ``executorch/lib``); nothing of torch is needed, so a device installs
the wheel with ``pip install --no-deps executorch==1.5.1``. Decisions:

* One g++ command, no CMake: ``CXX`` (default ``g++``) with ``-std=c++17``, the compile
  definitions the wheel's CMake config names, and the wheel's runtime, optimized kernels,
  XNNPACK backend and threadpool linked ``--no-as-needed`` (kernels and the delegate register
  themselves when their library loads; a dropped library means "missing operator" later).
* The library's run path is the wheel's ``lib`` directory, so it loads without LD_LIBRARY_PATH.
* Output: ``$FEDSDK_NATIVE_DIR`` or ``~/.cache/fedsdk/native``, file named by a hash of the
  source, the compiler and the ExecuTorch directory, so a new wheel or source rebuilds.
* Cross-compiling: give ``--cxx aarch64-linux-gnu-g++`` (or ``CXX``), ``--executorch-dir``
  pointing at the target's unpacked ``executorch`` package directory, ``--rpath`` its path
  on the device and ``--out``; the device then sets ``FEDSDK_NATIVE_LIB`` to the library.

The fused training kernels (``native/fedsdk_kernels.cpp``, the "fused" kernel set of
``export/fused_ops.py``) are a second library, ``libfedsdk_kernels``, built the same way
(``build(..., kernels=True)``, ``fedsdk runtime build --kernels``) but linked only to
``libexecutorch`` (whose kernel registry they join) and ``libexecutorch_threadpool`` (whose
shared pool they run on) and compiled with ``-O3``; for the build
machine's own architecture also with ``-march=native`` (the library is built where it runs;
a cross-build gets the target's baseline, NEON on arm64). The library path's hash then
includes the CPU's feature flags.

CLI: ``fedsdk runtime build`` or ``python -m sdk_device.runtimes.native_build``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import click

SOURCE = Path(__file__).parent / "native" / "fedsdk_executorch.cpp"
KERNELS_SOURCE = Path(__file__).parent / "native" / "fedsdk_kernels.cpp"
KERNELS_HEADERS = tuple(Path(__file__).parent / "native" / name  # included by KERNELS_SOURCE
                        for name in ("fused_math.h", "fused_norm.h"))
LIBRARIES = ("executorch", "executorch_kernels_optimized", "executorch_backend_xnnpack",
             "executorch_threadpool")
DEFINES = ("C10_USING_CUSTOM_GENERATED_MACROS", "ET_EVENT_TRACER_ENABLED", "ET_USE_THREADPOOL")


class NativeBuildError(RuntimeError):
    """The shim cannot be built here (message: one line saying what is missing)."""


def executorch_dir(given: str | Path | None = None) -> Path:
    """The ``executorch`` package directory holding ``include/`` and ``lib/`` (not imported:
    importing its Python parts would import torch)."""
    if given is None:
        given = os.environ.get("FEDSDK_EXECUTORCH_DIR")
    if given is None:
        try:
            spec = importlib.util.find_spec("executorch")
        except ModuleNotFoundError:
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise NativeBuildError("the executorch wheel is not installed: "
                                   "pip install --no-deps executorch==1.5.1")
        given = list(spec.submodule_search_locations)[0]
    root = Path(given)
    missing = [p for p in ("include/executorch/extension/module/module.h", "lib/libexecutorch.so")
               if not (root / p).is_file()]
    if missing:
        raise NativeBuildError(f"{root} is not an executorch package with native files (no {missing[0]})")
    return root


def cache_dir() -> Path:
    return Path(os.environ.get("FEDSDK_NATIVE_DIR") or Path.home() / ".cache" / "fedsdk" / "native")


def compiler(cxx: str | None = None) -> str | None:
    """The C++ compiler command (``cxx``, else $CXX, else g++) if it exists, else None."""
    name = cxx or os.environ.get("CXX") or "g++"
    return shutil.which(name)


def _is_host_compiler(cxx: str) -> bool:
    """True when ``cxx`` builds for this machine's architecture (not a cross-compiler)."""
    done = subprocess.run([cxx, "-dumpmachine"], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip().startswith(platform.machine())


def _cpu_flags() -> str:
    """This CPU's feature flags (Linux), for the hash of a ``-march=native`` library."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def library_path(et_dir: Path, cxx: str, kernels: bool = False) -> Path:
    """Where the shim (or, ``kernels``, the fused kernels) built by ``cxx`` against ``et_dir`` lives."""
    source = KERNELS_SOURCE if kernels else SOURCE
    digest = hashlib.sha256(source.read_bytes())
    if kernels:
        for header in KERNELS_HEADERS:
            digest.update(header.read_bytes())
    digest.update(f"{et_dir.resolve()}|{Path(cxx).name}|{' '.join(DEFINES)}".encode())
    if kernels and _is_host_compiler(cxx):
        digest.update(_cpu_flags().encode())
    version = et_dir / "version.py"
    if version.is_file():
        digest.update(version.read_bytes())
    stem = "libfedsdk_kernels" if kernels else "libfedsdk_executorch"
    return cache_dir() / f"{stem}-{digest.hexdigest()[:16]}.so"


def compile_command(et_dir: Path, cxx: str, out: Path, rpath: str | None = None,
                    kernels: bool = False) -> list[str]:
    """The g++ command line; ``rpath`` (default: ``et_dir/lib``) is where the library will
    look for the wheel's libraries at run time. ``kernels``: the fused kernels library."""
    include = et_dir / "include"
    lib = et_dir / "lib"
    if kernels:
        flags = ["-O3", "-ffp-contract=fast", *(["-march=native"] if _is_host_compiler(cxx) else [])]
        source, libraries = KERNELS_SOURCE, ("executorch", "executorch_threadpool")
    else:
        flags, source, libraries = ["-O2"], SOURCE, LIBRARIES
    return [cxx, "-std=c++17", *flags, "-fPIC", "-shared", "-Wno-deprecated-declarations",
            *(f"-D{d}" for d in DEFINES),
            f"-I{include}", f"-I{include / 'executorch/runtime/core/portable_type/c10'}",
            str(source), "-o", str(out), f"-L{lib}",
            "-Wl,--no-as-needed", *(f"-l{name}" for name in libraries), "-Wl,--as-needed",
            f"-Wl,-rpath,{rpath or lib.resolve()}"]


def build(et_dir: str | Path | None = None, cxx: str | None = None, out: Path | None = None,
          force: bool = False, rpath: str | None = None, kernels: bool = False) -> Path:
    """Compile the shim (``kernels``: the fused kernels library) if not already built and
    return the library's path. NativeBuildError when the wheel's native files or the
    compiler are missing, or g++ fails."""
    root = executorch_dir(et_dir)
    command = compiler(cxx)
    if command is None:
        raise NativeBuildError(f"no C++ compiler {cxx or os.environ.get('CXX') or 'g++'!r} "
                               f"(apt-get install g++) to build the native ExecuTorch runtime")
    target = Path(out) if out else library_path(root, command, kernels)
    if target.is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    done = subprocess.run(compile_command(root, command, partial, rpath, kernels), capture_output=True,
                          text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
        first = errors[0] if errors else "?"
        what = "the fused training kernels" if kernels else "the native ExecuTorch runtime"
        raise NativeBuildError(f"compiling {what} failed: {first}")
    partial.replace(target)  # atomic: a concurrent loader never sees half a library
    return target


def find_or_build_kernels() -> Path:
    """The fused kernels library for this machine: ``$FEDSDK_KERNELS_LIB``, already built,
    or built now (first use)."""
    built = os.environ.get("FEDSDK_KERNELS_LIB")
    if built:
        return Path(built)
    return build(kernels=True)


def find_or_build() -> Path:
    """The shim for this machine: already built, or built now (first use)."""
    built = os.environ.get("FEDSDK_NATIVE_LIB")
    if built:
        return Path(built)
    return build()


def can_build_or_load() -> bool:
    """True when the runtime is usable here: the wheel's native files and a built shim or a
    compiler to build it (the registry's "installed" test; builds nothing)."""
    if os.environ.get("FEDSDK_NATIVE_LIB"):
        return Path(os.environ["FEDSDK_NATIVE_LIB"]).is_file()
    try:
        executorch_dir()
    except NativeBuildError:
        return False
    return compiler() is not None or any(cache_dir().glob("libfedsdk_executorch-*.so"))


@click.command("build")
@click.option("--executorch-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The executorch package directory (with include/ and lib/); default: the installed wheel.")
@click.option("--cxx", default=None, help="C++ compiler (default: $CXX or g++), e.g. aarch64-linux-gnu-g++.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the library here (default: the per-user cache, $FEDSDK_NATIVE_DIR).")
@click.option("--force", is_flag=True, help="Rebuild even if the library exists.")
@click.option("--kernels", is_flag=True,
              help="Also build the fused training kernels (libfedsdk_kernels, for programs exported with "
                   "kernels='fused') and print their path on a second line; with --out, they are written "
                   "beside it as libfedsdk_kernels.so.")
@click.option("--rpath", default=None,
              help="Where the library finds the wheel's lib/ at run time (default: the --executorch-dir "
                   "lib/); for a cross-build, that directory's path on the device.")
def build_command(executorch_dir: Path | None, cxx: str | None, out: Path | None, force: bool,
                  kernels: bool, rpath: str | None) -> None:
    """Compile the native ExecuTorch runtime (torch-free training) and print its path."""
    try:
        click.echo(build(executorch_dir, cxx, out, force, rpath))
        if kernels:
            kernels_out = out.with_name("libfedsdk_kernels.so") if out else None
            click.echo(build(executorch_dir, cxx, kernels_out, force, rpath, kernels=True))
    except NativeBuildError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    sys.exit(build_command())
