#!/bin/sh
# Install Debian's `nginx` package when nginx is missing: the sequence
# affinity tests put a real nginx (started by the tests on loopback, never
# the system service) in front of several gateway processes.
exec sh "$(dirname "$0")/ensure-debian-package.sh" nginx nginx
