#!/bin/sh
# Make sure a mosquitto broker binary exists (the integration tests start their own on a
# free loopback port). Installs Debian/Ubuntu's package when run as root; otherwise says how.
if command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing mosquitto (apt-get)..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null && exit 0
    echo "apt-get could not install mosquitto" >&2
    exit 1
fi
echo "mosquitto is needed for the tests: sudo apt-get install -y mosquitto (macOS: brew install mosquitto)" >&2
exit 1
