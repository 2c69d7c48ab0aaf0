#!/bin/sh
# Usage: ensure-tool.sh COMMAND DEBIAN_PACKAGE [ALSO_ACCEPTED_PATH]
# Make sure a command the tests need exists (mosquitto, shellcheck). Installs the
# Debian/Ubuntu package when run as root; otherwise says how.
tool="$1" package="$2" path="${3:-}"
if command -v "$tool" >/dev/null 2>&1 || { [ -n "$path" ] && [ -x "$path" ]; }; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $package (apt-get)..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null && exit 0
    echo "apt-get could not install $package" >&2
    exit 1
fi
echo "$tool is needed for the tests: sudo apt-get install -y $package (macOS: brew install $package)" >&2
exit 1
