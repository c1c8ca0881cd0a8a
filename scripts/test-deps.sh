#!/usr/bin/env bash
# Installs, once, what `make test` needs beyond the Go toolchain:
#   chromium        the real browser the e2e browser tests drive (e2e/browser_*_test.go)
#   libnss3-tools   certutil, which puts the test CA into the browser's NSS database
#   etcd-server     /usr/bin/etcd: the e2e control-plane tests start their own
#                   three-member cluster on loopback (e2e/etcd_harness_test.go)
#   haproxy         the PROXY protocol v2 codec is checked against HAProxy in
#                   both directions (internal/proxyproto/haproxy_test.go)
# Quick and silent when everything is there already. Without root, it only
# says what is missing: those tests then skip (or fail when CI is set).
#
# The etcd package's own service is never started (nor left enabled): the
# tests start their members themselves, on free ports with their own data
# directories, and must not depend on (or collide with) a system etcd.
#   promtool        checks and unit-tests deploy/prometheus's rules
#                   (deploy/monitoring); built once from the Go module proxy
#                   into the user cache, where the test looks for it
#   h2spec          the HTTP/2 conformance suite e2e/h2spec_test.go runs against
#                   the binary; built once from the Go module proxy likewise
set -euo pipefail

# promtool: the version deploy/monitoring/monitoring_test.go names.
promtool_version=$(sed -n 's/^const promtoolVersion = "\(.*\)"$/\1/p' "$(dirname "$0")/../deploy/monitoring/monitoring_test.go")
promtool_dir="${XDG_CACHE_HOME:-$HOME/.cache}/applistener/promtool-$promtool_version"
if [ -n "$promtool_version" ] && ! command -v promtool >/dev/null 2>&1 && [ ! -x "$promtool_dir/promtool" ]; then
	echo "test-deps: building promtool $promtool_version (once; a few minutes)" >&2
	tmp=$(mktemp -d)
	if (cd "$tmp" && GOBIN="$tmp" GOFLAGS=-mod=mod CGO_ENABLED=0 go install -tags remove_all_sd \
		"github.com/prometheus/prometheus/cmd/promtool@$promtool_version"); then
		mkdir -p "$promtool_dir" && mv "$tmp/promtool" "$promtool_dir/promtool"
	else
		echo "test-deps: could not build promtool; the rule tests will say so" >&2
	fi
	rm -rf "$tmp"
fi

# h2spec: the version e2e/h2spec_test.go names.
h2spec_version=$(sed -n 's/^const h2specVersion = "\(.*\)"$/\1/p' "$(dirname "$0")/../e2e/h2spec_test.go")
h2spec_dir="${XDG_CACHE_HOME:-$HOME/.cache}/applistener/h2spec-${h2spec_version%+incompatible}"
if [ -n "$h2spec_version" ] && ! command -v h2spec >/dev/null 2>&1 && [ ! -x "$h2spec_dir/h2spec" ]; then
	echo "test-deps: building h2spec $h2spec_version (once)" >&2
	tmp=$(mktemp -d)
	if (cd "$tmp" && GOBIN="$tmp" GOFLAGS=-mod=mod CGO_ENABLED=0 go install \
		"github.com/summerwind/h2spec/cmd/h2spec@$h2spec_version"); then
		mkdir -p "$h2spec_dir" && mv "$tmp/h2spec" "$h2spec_dir/h2spec"
	else
		echo "test-deps: could not build h2spec; the conformance test will say so" >&2
	fi
	rm -rf "$tmp"
fi

need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v certutil >/dev/null 2>&1 || need+=(libnss3-tools)
[ -x /usr/bin/etcd ] || need+=(etcd-server)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "test-deps: not root and ${need[*]} missing; the e2e tests that need them will skip" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: no apt-get to install ${need[*]}; the e2e tests that need them will skip" >&2
	exit 0
fi

# Keep maintainer scripts from starting services (etcd-server's postinst
# would start etcd on 127.0.0.1:2379). An existing policy-rc.d is kept as it
# is; one created here is removed again.
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\n# test-deps.sh: no service starts during this install\nexit 101\n' >"$policy"
	chmod 755 "$policy"
	made_policy=1
fi
cleanup() { [ -z "$made_policy" ] || rm -f "$policy"; }
trap cleanup EXIT

echo "test-deps: installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

# On a systemd host the package still enables its unit (policy-rc.d only
# governs starting): disable it, and stop it should it run after all.
if [[ " ${need[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl disable --now etcd.service >/dev/null 2>&1 || true
fi
if [[ " ${need[*]} " == *" haproxy "* ]] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
	systemctl disable --now haproxy.service >/dev/null 2>&1 || true
fi
