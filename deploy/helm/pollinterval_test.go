package helm_test

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestChartShortFreshnessWithoutPollInterval: the chart with a short
// routeFreshness and no pollInterval gives no --gateway-poll-interval, and
// the binary accepts those arguments (`applistener validate`, which checks
// serve's flags and files without starting: the poll interval is derived
// from the freshness); a pollInterval the freshness cannot keep is passed
// as given and refused with the binary's message (exit 2).
func TestChartShortFreshnessWithoutPollInterval(t *testing.T) {
	const domain = "apps.chart.test"
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, "chart-poll-token\n")
	tlsDir, _ := writeWildcard(t, filepath.Join(dir, "tls"), domain)
	free := freeAddrs(t)
	for _, c := range []struct {
		name, pollInterval string
		wantOK             bool
	}{
		{name: "pollInterval empty", wantOK: true},
		{name: "pollInterval 1s", pollInterval: "1s", wantOK: true},
		{name: "pollInterval 5s", pollInterval: "5s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cp := map[string]any{
				"source":          "gateway",
				"gatewayEndpoint": "http://gateway.example:8080",
				"token":           map[string]any{"secretName": "supervisor-token"},
				"routeFreshness":  "3s",
			}
			if c.pollInterval != "" {
				cp["pollInterval"] = c.pollInterval
			}
			r := render(t, map[string]any{
				"appListener": map[string]any{
					"enabled": true,
					"domain":  domain,
					"tls":     map[string]any{"secretName": "wildcard", "mountPath": "/var/run/tls/app"},
				},
				"controlPlane": cp,
			})
			args := supervisorContainer(t, supervisorDeployment(t, r)).Args
			givesPoll := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--gateway-poll-interval") })
			if givesPoll != (c.pollInterval != "") {
				t.Fatalf("pollInterval %q: the chart's arguments %q", c.pollInterval, args)
			}
			run := []string{"validate"}
			for _, a := range args[1:] {
				name, val, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !hasValue {
					run = append(run, a)
					continue
				}
				switch {
				case name == "gateway-token-file":
					val = tokenFile
				case name == "app-tls-dir":
					val = tlsDir
				case strings.HasPrefix(val, "0.0.0.0:"):
					val = free()
				case strings.HasPrefix(val, "$("): // the Pod's name or IP
					val = "127.0.0.1"
				}
				run = append(run, "--"+name+"="+val)
			}
			out, err := exec.Command(applistenerBinary(t), run...).CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if c.wantOK {
				if code != 0 || !strings.Contains(string(out), "configuration ok") {
					t.Fatalf("applistener %q: exit %d:\n%s", run, code, out)
				}
				return
			}
			want := "--gateway-poll-interval must be positive and shorter than --route-freshness"
			if code != 2 || !strings.Contains(string(out), want) {
				t.Fatalf("applistener %q: exit %d, want 2 and %q:\n%s", run, code, want, out)
			}
		})
	}

}
