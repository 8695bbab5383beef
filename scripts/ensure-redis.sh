#!/bin/sh
# Install Debian's `redis-server` package when redis-server is missing: the
# rate-limit tests run a real Redis server (started by the tests on loopback,
# never the system service).
exec sh "$(dirname "$0")/ensure-debian-package.sh" redis-server redis-server
