#!/bin/sh
# Make sure shellcheck exists (the tests lint firmware_scripts/install-device.sh with it).
# Installs Debian/Ubuntu's package when run as root; otherwise says how.
if command -v shellcheck >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing shellcheck (apt-get)..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null && exit 0
    echo "apt-get could not install shellcheck" >&2
    exit 1
fi
echo "shellcheck is needed for the tests: sudo apt-get install -y shellcheck (macOS: brew install shellcheck)" >&2
exit 1
