// Package k8stest installs the Helm chart (deploy/helm/applistener) on a real
// Kubernetes control plane started on loopback, as an operator would with
// the Helm library, and checks what the API server makes of it. It is a
// module of its own so that Helm and client-go stay out of applistener's
// go.mod; `make test-k8s` builds the control plane (tools/k8s) and runs it.
package k8stest
