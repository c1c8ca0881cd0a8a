package gateway

import (
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// invalidConfig has five problems in three documents, each a supervisor
// would reject (an instance entry or the whole document).
const invalidConfig = `{"supervisors": {
  "sup-1": {"revision": "r2", "instances": [
    {"workspace": "team", "sandbox": "demo", "generation": "1", "services": [{"name": "web", "port": 80800, "revision": 1}]},
    {"workspace": "Team", "sandbox": "x", "services": [{"name": "web", "port": 8080}], "limits": {"max_streamz": 1}}
  ]},
  "sup-2": {"instances": [{"workspace": "team", "sandbox": "other", "services": []}]},
  "sup-3": {"revision": 7, "instances": []}
}}`

// invalidConfigPaths are the JSON paths of invalidConfig's problems, as
// `applistener validate gateway` prints them.
var invalidConfigPaths = []string{
	"supervisors.sup-1.instances[0].services[0].port",
	"supervisors.sup-1.instances[1].limits.max_streamz",
	"supervisors.sup-1.instances[1].workspace",
	"supervisors.sup-2.instances[0].services",
	"supervisors.sup-3",
}

// The gateway refuses a configuration file with a document a supervisor
// would not apply in full: every problem is logged at its JSON path, the
// reload counted as failed, and the documents imported last stay served.
// At start, such a file is an error of New, its problems logged.
func TestGatewayRefusesInvalidDocuments(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	writeFileAtomic(t, f.configPath, invalidConfig)
	err := f.g.Reload()
	var pe *ConfigProblemsError
	if !errors.As(err, &pe) {
		t.Fatalf("Reload() = %v", err)
	}
	var paths []string
	for _, p := range pe.Problems {
		paths = append(paths, p.Path)
	}
	slices.Sort(paths)
	if !slices.Equal(paths, invalidConfigPaths) {
		t.Errorf("problems at %q, want %q", paths, invalidConfigPaths)
	}
	if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "(and 4 more problems)") {
		t.Errorf("error %q: want one line with the count of the others", err)
	}
	logs := f.logs.String()
	for _, p := range invalidConfigPaths {
		if !strings.Contains(logs, "at="+p+" ") {
			t.Errorf("no log line at %s:\n%s", p, logs)
		}
	}
	if got := f.metric("applistener_gateway_reloads_total", "file", "config", "result", "failed"); got != 1 {
		t.Errorf("failed config reloads: %v", got)
	}
	resp, body := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil)
	if resp.StatusCode != 200 || resp.Header.Get("ETag") != `"r1"` || body != doc1("r1")+"\n" {
		t.Fatalf("after a refused file: %d ETag %q body %q", resp.StatusCode, resp.Header.Get("ETag"), body)
	}
	// The fixed file is imported (by the reload loop, at its change).
	writeFileAtomic(t, f.configPath, configJSON("r4", "s1"))
	testutil.Eventually(t, 5*time.Second, "the fixed file imported", func() bool {
		resp, _ := f.do(http.MethodGet, "/v1/supervisors/sup-1/config", tokSup1, nil)
		return resp.Header.Get("ETag") == `"r4"`
	})

	// At start.
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.json")
	if err := os.WriteFile(cfg, []byte(invalidConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	startLogs := &logBuffer{}
	_, err = New(Config{ConfigPath: cfg, TokensPath: f.tokensPath, Logger: slog.New(slog.NewTextHandler(startLogs, nil))})
	if !errors.As(err, &pe) || len(pe.Problems) != len(invalidConfigPaths) {
		t.Fatalf("New with an invalid file: %v", err)
	}
	if n := strings.Count(startLogs.String(), "gateway config: invalid document"); n != len(invalidConfigPaths) {
		t.Errorf("%d problem lines at start, want %d:\n%s", n, len(invalidConfigPaths), startLogs)
	}
}
