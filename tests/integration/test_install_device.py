"""firmware_scripts/install-device.sh on this machine, offline: lint, install, re-run, unit file,
uninstall.

The install takes fedsdk from a wheel built from this checkout and reuses the test
environment's packages (``--reuse-site-packages``) instead of downloading them; the venv, the
script's platform checks, the pip install and the rendered unit file are all real.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "firmware_scripts" / "install-device.sh"
UNIT_TEMPLATE = REPO / "firmware_scripts" / "fedsdk-agent.service"
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def test_install_script_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: sh scripts/ensure-tool.sh shellcheck shellcheck "
                    "(make test does this)")
    scripts = [str(SCRIPT), str(REPO / "scripts" / "ensure-tool.sh"),
               str(REPO / "scripts" / "ensure-mosquitto.sh"), str(REPO / "scripts" / "build-arm64-root.sh")]
    out = subprocess.run(["shellcheck", "--severity=style", *scripts], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def unit_file_problems(text: str) -> list[str]:
    """A systemd unit parser check (used with, or instead of, systemd-analyze verify): known
    sections, Key=Value lines, no template placeholders left, absolute executable ExecStart."""
    problems, section, seen = [], None, {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            if section not in ("Unit", "Service", "Install"):
                problems.append(f"line {number}: unknown section {line}")
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None or not re.fullmatch(r"[A-Za-z]+", key):
            problems.append(f"line {number}: not a Key=Value line in a section: {line!r}")
            continue
        seen[(section, key)] = value
    problems += [f"placeholder left: {p}" for p in re.findall(r"@[A-Z_]+@", text)]
    for needed in [("Unit", "Description"), ("Service", "ExecStart"), ("Service", "User"),
                   ("Service", "Restart"), ("Install", "WantedBy")]:
        if needed not in seen:
            problems.append(f"missing {needed[0]}.{needed[1]}")
    exec_path = seen.get(("Service", "ExecStart"), "").split()[0:1]
    if not exec_path or not os.path.isabs(exec_path[0]) or not os.access(exec_path[0], os.X_OK):
        problems.append(f"ExecStart is not an absolute executable: {exec_path}")
    if seen.get(("Service", "Restart")) not in ("on-failure", "always"):
        problems.append("the agent must restart on failure")
    return problems


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """fedsdk's wheel, built offline from a copy of this checkout (the tree stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in ("fedcore", "sdk_device", "server_toolkit", "export"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    out_dir = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(out_dir), str(src)], check=True, capture_output=True)
    (built,) = out_dir.glob("fedsdk-*.whl")
    return built


def install(prefix: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = ["bash", str(SCRIPT), "--prefix", str(prefix), "--state-dir", str(state), "--no-systemd", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


def test_install_run_again_verify_unit_and_uninstall(wheel, tmp_path):
    prefix, state = tmp_path / "opt" / "fedsdk", tmp_path / "state"
    site = sysconfig.get_paths()["purelib"]  # this environment's packages (numpy, paho, torch...)
    offline = ["--wheel", str(wheel), "--reuse-site-packages", site, "--pip-args", "--no-index"]

    first = install(prefix, state, *offline)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "creating the venv" in first.stdout
    assert f"FEDSDK_CONFIG_DIR={state} {prefix}/venv/bin/fedsdk pair --server mqtts://" in first.stdout
    # torch-free by default off a Jetson: the executorch wheel and the native shim built with g++
    native = prefix / "native" / "libfedsdk_executorch.so"
    assert "building the native ExecuTorch runtime" in first.stdout and native.is_file()
    assert (f"FEDSDK_NATIVE_LIB={native} FEDSDK_KERNELS_LIB={prefix}/native/libfedsdk_kernels.so "
            f"{prefix}/venv/bin/fedsdk run") in first.stdout

    # The installed CLI starts, from the venv (not from this checkout).
    fedsdk = prefix / "venv" / "bin" / "fedsdk"
    shown = subprocess.run([str(fedsdk), "--help"], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert shown.returncode == 0 and "run" in shown.stdout and "info" in shown.stdout, shown.stderr
    where = subprocess.run([str(prefix / "venv" / "bin" / "python"), "-c",
                            "import sdk_device; print(sdk_device.__file__)"],
                           capture_output=True, text=True, env=ENV, cwd=tmp_path, check=True).stdout
    assert where.startswith(str(prefix / "venv")), where

    # Idempotent: a second run reuses the venv and ends the same way.
    second = install(prefix, state, *offline)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "creating the venv" not in second.stdout and "installed in" in second.stdout

    # The unit file it rendered: systemd's own verifier when there is one, and our parser check.
    unit = prefix / "fedsdk-agent.service"
    text = unit.read_text()
    assert f"ExecStart={fedsdk} -v run" in text and f"FEDSDK_CONFIG_DIR={state}" in text
    assert f"FEDSDK_NATIVE_LIB={prefix}/native/libfedsdk_executorch.so" in text
    assert unit_file_problems(text) == []
    assert unit_file_problems(UNIT_TEMPLATE.read_text())  # the raw template still has placeholders
    if shutil.which("systemd-analyze"):
        verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
        assert verified.returncode == 0 and verified.stderr.strip() == "", verified.stderr
    else:
        print("systemd-analyze not installed: only the parser check ran")

    # Bad input gets a clear error.
    bad = install(prefix, state, "--runtime", "cuda")
    assert bad.returncode != 0 and "--runtime must be auto, executorch, torch or none" in bad.stderr
    not_a_wheel = install(prefix, state, "--wheel", str(UNIT_TEMPLATE))
    assert not_a_wheel.returncode != 0 and "--wheel needs a .whl file" in not_a_wheel.stderr

    # Uninstall keeps the pairing state; --purge removes it too.
    (state / "device.json").write_text("{}")
    gone = install(prefix, state, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert not prefix.exists() and (state / "device.json").exists()
    purged = install(prefix, state, "--uninstall", "--purge")
    assert purged.returncode == 0 and not state.exists()


def test_outside_a_checkout_without_a_wheel_the_script_says_fedsdk_is_not_on_pypi(tmp_path):
    alone = tmp_path / "firmware_scripts"
    alone.mkdir()
    shutil.copy(SCRIPT, alone / SCRIPT.name)
    cmd = ["bash", str(alone / SCRIPT.name), "--prefix", str(tmp_path / "p"), "--no-systemd"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode != 0 and "fedsdk is not on PyPI" in out.stderr and "--wheel FILE" in out.stderr
    assert not (tmp_path / "p").exists()


def test_uninstall_refuses_a_venv_it_did_not_make(tmp_path):
    foreign = tmp_path / "prefix"
    (foreign / "venv").mkdir(parents=True)
    out = install(foreign, tmp_path / "state", "--uninstall")
    assert out.returncode != 0 and "not made by this script" in out.stderr
    assert (foreign / "venv").is_dir()


def test_service_mode_needs_root_and_a_running_systemd(tmp_path):
    """Without --no-systemd the script stops before touching anything it cannot finish."""
    cmd = ["bash", str(SCRIPT), "--prefix", str(tmp_path / "p")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=60)
    if os.geteuid() != 0:
        assert out.returncode != 0 and "needs root" in out.stderr
    elif not os.path.isdir("/run/systemd/system"):
        assert out.returncode != 0 and "systemd is not running here" in out.stderr
    else:  # a real systemd host run as root: this test must not install a system service
        return
    assert not (tmp_path / "p").exists()
