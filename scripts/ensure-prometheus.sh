#!/bin/sh
# Install Debian's `prometheus` package (prometheus + promtool) when either is
# missing: the observability tests run a real Prometheus server and promtool.
# CI runs as root on a fresh Debian machine; elsewhere sudo is tried.
set -eu
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo -n"
fi
echo "installing the Debian package prometheus (prometheus, promtool) for the tests" >&2
# The tests start their own servers on loopback: keep the package from
# starting its system service (policy-rc.d exit 101 = "do not start").
TEMP_POLICY=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    TEMP_POLICY=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$TEMP_POLICY" >/dev/null
    $SUDO chmod +x "$TEMP_POLICY"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null || STATUS=$?
if [ -n "$TEMP_POLICY" ]; then
    $SUDO rm -f "$TEMP_POLICY"
fi
[ "${STATUS:-0}" -eq 0 ]
command -v prometheus >/dev/null && command -v promtool >/dev/null
