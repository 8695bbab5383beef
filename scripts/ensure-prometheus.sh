#!/bin/sh
# Install Debian's `prometheus` package (prometheus + promtool) when either is
# missing: the observability tests run a real Prometheus server and promtool.
exec sh "$(dirname "$0")/ensure-debian-package.sh" prometheus prometheus promtool
