#!/usr/bin/env bash
# make release / release-check / release-sign: see README.md "Install" and
# SECURITY.md. Usage:
#   scripts/release.sh build  VERSION [OUT]   artefacts into OUT (default dist/VERSION)
#   scripts/release.sh check  VERSION         two builds (the second with an empty
#                                             build cache), identical SHA256SUMS,
#                                             then tools/release check
#   scripts/release.sh sign   VERSION KEY     ssh-keygen -Y sign SHA256SUMS with KEY
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH = the commit's time,
# binaries are built with -trimpath -buildvcs=false and the version and commit
# stamped with -X (as the Dockerfile does), archives have sorted entries with
# fixed owners and modes, the image is assembled by tools/release without a
# container runtime. Offline: after `go mod download` of both modules (done
# here first), every build step runs with GOPROXY=off.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:?build, check or sign}
VERSION=${2:-}
if ! [[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: VERSION=x.y.z is required (got '${VERSION}')" >&2
	exit 2
fi
GO=${GO:-go}
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
PLATFORMS="linux_amd64 linux_arm64 darwin_arm64"

helm_binary() {
	if [ -n "${APPLISTENER_HELM:-}" ]; then echo "$APPLISTENER_HELM"; return; fi
	if command -v helm >/dev/null 2>&1; then command -v helm; return; fi
	local cached="${XDG_CACHE_HOME:-$HOME/.cache}/applistener/helm-v3.22.0/helm"
	if [ ! -x "$cached" ]; then
		local tmp; tmp=$(mktemp -d)
		GOFLAGS= GOBIN="$tmp" "$GO" install helm.sh/helm/v3/cmd/helm@v3.22.0 >&2
		mkdir -p "$(dirname "$cached")" && mv "$tmp/helm" "$cached" && rm -rf "$tmp"
	fi
	echo "$cached"
}

build() {
	local out=${1:-dist/$VERSION}
	if [ -n "$(git status --porcelain)" ] && [ "${RELEASE_ALLOW_DIRTY:-0}" != 1 ]; then
		echo "release: the working tree has changes; commit them (or RELEASE_ALLOW_DIRTY=1 for a trial)" >&2
		git status --short >&2
		exit 1
	fi
	local commit epoch
	commit=$(git rev-parse HEAD)
	epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}
	export SOURCE_DATE_EPOCH=$epoch
	local start=$SECONDS
	"$GO" mod download
	(cd tools/release && "$GO" mod download)
	export GOPROXY=off

	rm -rf "$out"
	mkdir -p "$out"
	local work; work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	local ldflags="-s -w -X main.version=$VERSION -X main.revision=$commit"
	for p in $PLATFORMS; do
		GOOS=${p%_*} GOARCH=${p#*_} "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" \
			-o "$work/applistener_$p" ./cmd/applistener
	done
	(cd "$work" && for p in $PLATFORMS; do "$GO" version -m "applistener_$p"; done) > "$out/applistener_${VERSION}_buildinfo.txt"
	(cd tools/release && "$GO" build -trimpath -o "$work/release-tool" . &&
		"$GO" build -trimpath -o "$work/cyclonedx-gomod" github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod)
	for p in $PLATFORMS; do
		# -licenses would download the main module by version: not offline.
		"$work/cyclonedx-gomod" bin -json -noserial -notimestamp -std -version "v$VERSION" \
			-output "$out/applistener_${VERSION}_${p}.cdx.json" "$work/applistener_$p" 2>/dev/null
	done
	"$work/release-tool" assemble -version "$VERSION" -commit "$commit" -epoch "$epoch" \
		-bins "$work" -dist "$out" -root .
	echo "release $VERSION (commit $commit, SOURCE_DATE_EPOCH=$epoch) in $out, $((SECONDS - start)) s:"
	(cd "$out" && ls -l --time-style=+ | awk 'NR>1 {printf "  %10d  %s\n", $5, $NF}')
}

check() {
	local a=dist/check-$VERSION-a b=dist/check-$VERSION-b
	local start=$SECONDS
	build "$a"
	local t1=$SECONDS
	# The second build starts from an empty build cache: nothing is reused.
	local cache; cache=$(mktemp -d)
	GOCACHE=$cache build "$b"
	rm -rf "$cache"
	if ! cmp -s "$a/SHA256SUMS" "$b/SHA256SUMS"; then
		echo "release-check: the two builds differ:" >&2
		diff "$a/SHA256SUMS" "$b/SHA256SUMS" >&2 || true
		exit 1
	fi
	echo "release-check: two builds, identical SHA256SUMS ($((t1 - start)) s warm, $((SECONDS - t1)) s with an empty build cache)"
	local epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}
	local work; work=$(mktemp -d)
	trap 'rm -rf "$work"' RETURN
	(cd tools/release && GOPROXY=off "$GO" build -o "$work/release-tool" .)
	"$work/release-tool" check -version "$VERSION" -commit "$(git rev-parse HEAD)" -epoch "$epoch" -dist "$a" -helm "$(helm_binary)"
	# Signing round trip with a throwaway key (the real key stays with the operator).
	ssh-keygen -q -t ed25519 -N '' -C release-check -f "$work/key"
	sign_sums "$a" "$work/key"
	printf 'release-check %s\n' "$(cat "$work/key.pub")" > "$work/allowed_signers"
	ssh-keygen -Y verify -f "$work/allowed_signers" -I release-check -n applistener-release \
		-s "$a/SHA256SUMS.sig" < "$a/SHA256SUMS"
	rm -f "$a/SHA256SUMS.sig"
	rm -rf "$b"
	echo "release-check: passed ($((SECONDS - start)) s); artefacts in $a"
}

sign_sums() {
	local dir=$1 key=$2
	rm -f "$dir/SHA256SUMS.sig"
	ssh-keygen -Y sign -f "$key" -n applistener-release "$dir/SHA256SUMS"
}

case $cmd in
build) build "${3:-}" ;;
check) check ;;
sign) sign_sums "dist/$VERSION" "${3:?the signing key (ssh-keygen -Y sign -f KEY)}" ;;
*) echo "release: unknown command $cmd" >&2; exit 2 ;;
esac
