#!/usr/bin/env bash
# Installs, once, what `make test` needs beyond the Go toolchain:
#   chromium        the real browser the e2e browser tests drive (e2e/browser_*_test.go)
#   libnss3-tools   certutil, which puts the test CA into the browser's NSS database
# Quick and silent when everything is there already. Without root, it only
# says what is missing: those tests then skip (or fail when CI is set).
set -euo pipefail

need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v certutil >/dev/null 2>&1 || need+=(libnss3-tools)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "test-deps: not root and ${need[*]} missing; the e2e browser tests will skip" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: no apt-get to install ${need[*]}; the e2e browser tests will skip" >&2
	exit 0
fi
echo "test-deps: installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
