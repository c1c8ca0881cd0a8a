#!/usr/bin/env bash
# Builds, once, the Kubernetes control plane `make test-k8s` runs
# (kube-apiserver, kube-controller-manager, kube-scheduler, kwok) from
# tools/k8s into the user cache, ~/.cache/applistener/k8s-<version>/, where
# <version> is the k8s.io/kubernetes version tools/k8s/go.mod requires (the
# one version to change). Quick and silent when they are there. The first
# build takes about 5 minutes on 2 cores and 2.4 GB of memory at its peak.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
version=$(sed -n 's/^[[:space:]]*k8s\.io\/kubernetes \(v[0-9.]*\)$/\1/p' tools/k8s/go.mod)
if [ -z "$version" ]; then
	echo "k8s-bins: tools/k8s/go.mod does not require k8s.io/kubernetes" >&2
	exit 1
fi
dir="${XDG_CACHE_HOME:-$HOME/.cache}/applistener/k8s-$version"
bins="kube-apiserver kube-controller-manager kube-scheduler kwok"
missing=0
for b in $bins; do [ -x "$dir/$b" ] || missing=1; done
if [ ! -s "$dir/kwok.yaml" ]; then
	# kwok alone (without kwokctl) needs its stages: the node and Pod
	# lifecycles kwokctl uses by default, from the kwok module tools/k8s pins.
	# (`go list -m` names no directory for a module not yet downloaded: on
	# a fresh machine it is downloaded first.)
	(cd tools/k8s && GOFLAGS=-mod=readonly "$GO" mod download sigs.k8s.io/kwok)
	kwok_dir=$(cd tools/k8s && GOFLAGS=-mod=readonly "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
	if [ -z "$kwok_dir" ] || [ ! -d "$kwok_dir/kustomize/stage" ]; then
		echo "k8s-bins: the kwok module's stages are not at '$kwok_dir/kustomize/stage'" >&2
		exit 1
	fi
	mkdir -p "$dir"
	for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
		pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
		cat "$kwok_dir/kustomize/stage/$f"
		echo "---"
	done > "$dir/kwok.yaml.tmp"
	mv "$dir/kwok.yaml.tmp" "$dir/kwok.yaml"
fi
[ $missing = 0 ] && exit 0
echo "k8s-bins: building the Kubernetes $version control plane and kwok into $dir (once; about 5 minutes)" >&2
start=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd tools/k8s && GOFLAGS=-mod=readonly CGO_ENABLED=0 "$GO" build -trimpath -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler sigs.k8s.io/kwok/cmd/kwok)
mkdir -p "$dir"
for b in $bins; do mv "$tmp/$b" "$dir/$b"; done
echo "k8s-bins: built in $((SECONDS - start)) s" >&2
