package k8stest

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestStagingReplacesMatch: tools/k8s/go.mod has one version,
// k8s.io/kubernetes v1.M.P, and replaces each of its staging modules with
// the published v0.M.P; none is missing, none has another version.
func TestStagingReplacesMatch(t *testing.T) {
	b, err := os.ReadFile("../../tools/k8s/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes v1\.([0-9]+\.[0-9]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("tools/k8s/go.mod does not require k8s.io/kubernetes v1.M.P")
	}
	want := "v0." + string(m[1])
	replaces := regexp.MustCompile(`(?m)^\s*(k8s\.io/[a-z0-9-]+) => (k8s\.io/[a-z0-9-]+) (v[0-9.]+)$`).FindAllSubmatch(b, -1)
	if len(replaces) < 30 {
		t.Fatalf("%d staging replaces in tools/k8s/go.mod, want every staging module (30+)", len(replaces))
	}
	for _, r := range replaces {
		if string(r[1]) != string(r[2]) || string(r[3]) != want {
			t.Errorf("replace %s => %s %s: want %s => %s %s", r[1], r[2], r[3], r[1], r[1], want)
		}
	}
	if strings.Count(string(b), "=> ./") != 0 {
		t.Error("tools/k8s/go.mod replaces a module with a local directory")
	}
}
