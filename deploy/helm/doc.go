// Package helm holds the applistener Helm chart (./applistener) and its
// validation tests. The tests render the chart with Helm (from PATH, or built
// once with `go install` into the user cache directory), decode every
// rendered object strictly into the Kubernetes API types, check the facts the
// deployment depends on (probes, flags, mounts, network policy, security
// context) against the flags that the built `applistener` binary accepts, and
// check the repository's Dockerfile.
package helm
