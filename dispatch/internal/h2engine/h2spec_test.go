package h2engine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// h2specDir is where scripts/test-deps.sh builds h2spec
// (github.com/summerwind/h2spec, the HTTP/2 conformance suite).
const h2specDir = "h2spec-v2.2.1"

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
	p := filepath.Join(cache, "applistener", h2specDir, "h2spec")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	msg := "h2spec not found at " + p + ": run scripts/test-deps.sh"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestH2Spec runs the whole HTTP/2 conformance suite (145 cases) against
// the engine over TLS with the test handler, with extended CONNECT on;
// every case must pass.
func TestH2Spec(t *testing.T) {
	bin := h2specPath(t)
	s := newTestServer(t, true, Config{
		EnableConnectProtocol: true,
		// h2spec leaves streams blocked on a zero window at the end of
		// some cases; they must not hold the run up.
		WriteTimeout:  5 * time.Second,
		HeaderTimeout: 5 * time.Second,
	}, HandlerFunc(testHandler))
	_, port, _ := strings.Cut(s.addr, ":")
	report := filepath.Join(t.TempDir(), "report.xml")
	out, err := exec.Command(bin, "-t", "-k", "-h", "127.0.0.1", "-p", port, "-o", "5", "-j", report).CombinedOutput()
	m := regexp.MustCompile(`(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("h2spec: no summary (%v):\n%s", err, out)
	}
	total, _ := strconv.Atoi(string(m[1]))
	passed, _ := strconv.Atoi(string(m[2]))
	t.Logf("h2spec: %s", m[0])
	if total != 145 || passed != total {
		failed := string(out)
		if _, after, ok := strings.Cut(failed, "Failures: "); ok {
			failed = "Failures: " + after
		}
		t.Errorf("h2spec: %d of %d passed, want all 145:\n%s", passed, total, failed)
	}
	_ = fmt.Sprint()
}
