package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// JSON diagnostics write durations as seconds; text keeps Go's "30s".
func TestLogDurationsInSeconds(t *testing.T) {
	var buf bytes.Buffer
	newLogger("json", "info", &buf).Info("started", "route_freshness", 30*time.Second, "grace", 1500*time.Millisecond)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	if rec["route_freshness"] != 30.0 || rec["grace"] != 1.5 {
		t.Errorf("durations %v and %v, want 30 and 1.5 (seconds): %s", rec["route_freshness"], rec["grace"], buf.Bytes())
	}
	buf.Reset()
	newLogger("text", "info", &buf).Info("started", "route_freshness", 30*time.Second)
	if !strings.Contains(buf.String(), "route_freshness=30s") {
		t.Errorf("text record %q, want route_freshness=30s", buf.String())
	}
}

// Each destination gets its own writer; the access log and OCSF records
// share the diagnostic log's unless given files; a file that cannot be
// opened is a start-up error naming it.
func TestCommandSetupLogFiles(t *testing.T) {
	dir := t.TempDir()
	diag, access := filepath.Join(dir, "diag.log"), filepath.Join(dir, "access.log")
	var stderr bytes.Buffer
	_, logger, sinks, done, err := commandSetup(&stderr, "json", "info", logFiles{diag: diag, access: access})
	if err != nil {
		t.Fatal(err)
	}
	if sinks.diag == sinks.access || sinks.ocsf != sinks.diag {
		t.Errorf("sinks %+v: want access separate, OCSF with the diagnostic log", sinks)
	}
	logger.Info("diagnostic line")
	_, _ = sinks.access.Write([]byte("access line\n"))
	done()
	if b, _ := os.ReadFile(diag); !strings.Contains(string(b), "diagnostic line") || strings.Contains(string(b), "access line") {
		t.Errorf("diagnostic file: %q", b)
	}
	if b, _ := os.ReadFile(access); string(b) != "access line\n" {
		t.Errorf("access file: %q", b)
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr got %q with files set", stderr.String())
	}
	_, _, _, _, err = commandSetup(&stderr, "text", "info", logFiles{diag: filepath.Join(dir, "missing", "x.log")})
	if err == nil || !strings.Contains(err.Error(), "missing/x.log") {
		t.Errorf("unopenable file: %v", err)
	}
}
