#!/bin/sh
# Make sure a mosquitto broker binary exists (the integration tests start their own on a
# free loopback port).
exec sh "$(dirname "$0")/ensure-tool.sh" mosquitto mosquitto /usr/sbin/mosquitto
