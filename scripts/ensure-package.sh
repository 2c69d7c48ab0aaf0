#!/bin/sh
# Usage: ensure-package.sh DEBIAN_PACKAGE PATH
# Make sure a Debian package the tests need is installed, judged by a PATH it installs
# (e.g. dataset-fashion-mnist and /usr/share/datasets/fashion-mnist). Installs it when run
# as root; otherwise says how.
package="$1" path="$2"
if [ -e "$path" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $package (apt-get)..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null && exit 0
    echo "apt-get could not install $package" >&2
    exit 1
fi
echo "$path is needed for the tests: sudo apt-get install -y $package" >&2
exit 1
