package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// h2specVersion is the h2spec that scripts/test-deps.sh builds into the
// user cache (github.com/summerwind/h2spec, the HTTP/2 conformance suite).
const h2specVersion = "v2.2.1+incompatible"

// h2specMinPassed is the conformance floor: all 145 cases (the HTTP/2
// engine, dispatch/internal/h2engine, passes every one).
const h2specMinPassed = 145

// h2specPath returns the h2spec binary, skipping the test when it is
// missing (failing it when CI is set).
func h2specPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("h2spec"); err == nil {
		return p
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	p := filepath.Join(cache, "applistener", "h2spec-"+strings.TrimSuffix(h2specVersion, "+incompatible"), "h2spec")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	msg := "h2spec " + h2specVersion + " not found at " + p + ": run scripts/test-deps.sh"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestH2Spec runs the HTTP/2 conformance suite against the built binary
// over TLS with the route's name as SNI and :authority (h2spec dials its
// -h host, so the name is made to resolve to 127.0.0.1 in a private mount
// namespace where /etc/hosts says so; nothing on the machine changes). At
// least h2specMinPassed cases must pass.
func TestH2Spec(t *testing.T) {
	bin := h2specPath(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace (unshare -m)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	t.Parallel()
	app := newBackend(t, "h2spec")
	p := startProc(t, routesDoc(service{Name: "web", Port: app.port, Revision: 1}))
	_, port, _ := strings.Cut(p.appAddr, ":")

	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost "+hostWeb+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("mount --bind %s /etc/hosts && exec %s -t -k -h %s -p %s -o 5 -j %s",
		hosts, bin, hostWeb, port, filepath.Join(dir, "report.xml"))
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script).CombinedOutput()
	// h2spec exits 1 when any case fails; the summary decides.
	m := regexp.MustCompile(`(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("h2spec: no summary (%v):\n%s\n%s", err, out, p.output())
	}
	total, _ := strconv.Atoi(string(m[1]))
	passed, _ := strconv.Atoi(string(m[2]))
	t.Logf("h2spec: %s", m[0])
	if passed < h2specMinPassed {
		t.Errorf("h2spec: %d of %d passed, want at least %d:\n%s", passed, total, h2specMinPassed, failures(out))
	}
}

// failures returns the part of h2spec's output that lists the failed cases.
func failures(out []byte) string {
	if _, after, ok := strings.Cut(string(out), "Failures: "); ok {
		return "Failures: " + after
	}
	return string(out)
}
