#!/bin/sh
# ensure-debian-package.sh PACKAGE COMMAND...: install the Debian package
# PACKAGE when any of the COMMANDs is missing (the tests run these programs
# as real peers: prometheus, promtool, redis-server). CI runs as root on a
# fresh Debian machine; elsewhere sudo is tried.
set -eu
PACKAGE=$1
shift
MISSING=""
for COMMAND in "$@"; do
    command -v "$COMMAND" >/dev/null 2>&1 || MISSING="$MISSING $COMMAND"
done
if [ -z "$MISSING" ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo -n"
fi
echo "installing the Debian package $PACKAGE ($*) for the tests" >&2
# The tests start their own servers on loopback: keep the package from
# starting its system service (policy-rc.d exit 101 = "do not start").
TEMP_POLICY=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    TEMP_POLICY=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$TEMP_POLICY" >/dev/null
    $SUDO chmod +x "$TEMP_POLICY"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$PACKAGE" >/dev/null || STATUS=$?
if [ -n "$TEMP_POLICY" ]; then
    $SUDO rm -f "$TEMP_POLICY"
fi
[ "${STATUS:-0}" -eq 0 ]
for COMMAND in "$@"; do
    command -v "$COMMAND" >/dev/null
done
