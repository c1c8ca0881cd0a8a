//go:build unix

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/applistener/applistener/internal/testutil"
)

// TestLogFilesReopenOnSIGUSR1: the built binary writes its diagnostic log
// and its access log to files of their own; after logrotate's rename and
// SIGUSR1, new access lines land in a new file of the old name and the
// earlier ones stay in the renamed file, none lost, over HTTP/1.1 and
// HTTP/2; the process lives on, and its start-up line names its version.
func TestLogFilesReopenOnSIGUSR1(t *testing.T) {
	t.Parallel()
	web := newBackend(t, "web")
	dir := t.TempDir()
	diag, access := filepath.Join(dir, "applistener.log"), filepath.Join(dir, "access.log")
	p := startProc(t, routesDoc(service{Name: "web", Port: web.port, Revision: 1}),
		"--access-log", "json", "--log-file", diag, "--access-log-file", access)

	h1, _ := p.client(t, hostWeb)
	h2 := p.h2Client(t, hostWeb)
	get := func(round int) {
		for i, c := range []*http.Client{h1, h2} {
			for j := range 3 {
				resp, err := c.Get(fmt.Sprintf("https://%s/round-%d/%d-%d", hostWeb, round, i, j))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 200 || resp.ProtoMajor != i+1 {
					t.Fatalf("%s status %d", resp.Proto, resp.StatusCode)
				}
			}
		}
	}
	paths := func(file string) []string {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil
		}
		var out []string
		for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil || m["msg"] != "access" {
				t.Fatalf("access file holds %q (%v)", line, err)
			}
			out = append(out, m["path"].(string))
		}
		return out
	}

	get(1)
	testutil.Eventually(t, waitTimeout, "six access lines in the access file", func() bool { return len(paths(access)) == 6 })
	rotated := access + ".1"
	if err := os.Rename(access, rotated); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "the reopen logged", func() bool {
		b, _ := os.ReadFile(diag)
		return strings.Contains(string(b), `"msg":"log file reopened","path":"`+access+`"`)
	})
	get(2)
	testutil.Eventually(t, waitTimeout, "six access lines in the new access file", func() bool { return len(paths(access)) == 6 })

	for file, round := range map[string]string{rotated: "/round-1/", access: "/round-2/"} {
		got := paths(file)
		if len(got) != 6 {
			t.Errorf("%s: %d lines, want 6", file, len(got))
		}
		for _, path := range got {
			if !strings.HasPrefix(path, round) {
				t.Errorf("%s holds %s, want only %s*", file, path, round)
			}
		}
	}
	b, err := os.ReadFile(diag)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"msg":"applistener started","version":"`) || !regexp.MustCompile(`"route_freshness":`+fmt.Sprint(freshness.Seconds())+`[,}]`).Match(b) {
		t.Errorf("start-up line without version or with a duration not in seconds:\n%s", b)
	}
	if strings.Contains(string(b), `"msg":"access"`) {
		t.Error("access lines in the diagnostic log file")
	}
	if out := p.output(); strings.Contains(out, `"msg":"access"`) || strings.Contains(out, "applistener started") {
		t.Errorf("log lines on stderr with files set:\n%s", out)
	}
	select {
	case <-p.done:
		t.Fatal("the process exited on SIGUSR1")
	default:
	}
}
