package monitoring_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	rulesFile     = "../prometheus/applistener-rules.yaml"
	rulesTestFile = "../prometheus/applistener-rules.test.yaml"
	dashboardFile = "../grafana/applistener-dashboard.json"
	operationsDoc = "../../docs/operations.md"
	runbookPrefix = "https://github.com/applistener/applistener/blob/main/docs/operations.md#"
)

// externalMetrics are metrics of other exporters that the rules may use;
// every other name must be one the applistener binary exports.
var externalMetrics = map[string]string{
	"kube_pod_status_ready": "kube-state-metrics: the readiness the health listener drives",
}

// afterTrafficOnly are applistener metrics that exist only once a rare
// event has happened, which the scrape in exportedMetrics does not cause.
// Each must still be a string literal in the module's Go sources, so a
// misspelt entry fails too.
var afterTrafficOnly = map[string]string{
	// Per-instance series exist for instances that have been refused at
	// max_streams; the test traffic stays below every limit.
	"applistener_instance_limit_rejections_total": "an instance refused at max_streams",
	// By reason (route_gone, owner_changed, shutdown) once the edge closes a
	// spliced connection; the test opens no splice through the edge.
	"applistener_edge_splices_closed_total": "a splice closed by the edge",
}

// requiredRuleMetrics are the signals the alert rules must cover.
var requiredRuleMetrics = []string{
	"applistener_config_last_success_timestamp_seconds", // route table stale
	"applistener_config_deliveries_total",               // gateway session down
	"kube_pod_status_ready",                             // supervisor not ready
	"applistener_revocation_close_seconds_bucket",       // revocation latency
	"applistener_requests_total",                        // 5xx ratio
	"applistener_certificate_expiry_timestamp_seconds",
	"applistener_log_lines_dropped_total",
	"applistener_client_connections_active", // listener saturation
	"applistener_gateway_store_up",
	"applistener_app_connections_stale_total",
}

// requiredDashboardMetrics are the signals the dashboard must show.
var requiredDashboardMetrics = []string{
	"applistener_requests_total", "applistener_request_denials_total", "applistener_handshake_rejections_total",
	"applistener_request_duration_seconds_bucket",
	"applistener_client_connections_active", "applistener_streams_active", "applistener_websockets_active",
	"applistener_bytes_total", "applistener_connector_dials_total", "applistener_route_revocations_total",
	"applistener_config_deliveries_total", "applistener_gateway_sessions", "applistener_gateway_watchers",
	"applistener_gateway_store_up", "applistener_edge_routes", "applistener_edge_connections_total",
}

// ---------------------------------------------------------------------------
// The rules file.
// ---------------------------------------------------------------------------

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("%s: a group without a name or rules: %q", rulesFile, g.Name)
		}
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rules", rulesFile)
	}
	return rules
}

var durationRE = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)

// TestAlertRulesShape: every alert has an expression, a positive `for:`,
// a severity, a summary, a description and a runbook link to a heading of
// docs/operations.md; names are unique.
func TestAlertRulesShape(t *testing.T) {
	anchors := markdownAnchors(t, operationsDoc)
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			t.Errorf("a rule without an alert name (expr %q)", r.Expr)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("%s: defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if !regexp.MustCompile(`^Applistener[A-Z][A-Za-z0-9]+$`).MatchString(r.Alert) {
			t.Errorf("%s: alert names are ApplistenerCamelCase", r.Alert)
		}
		if strings.TrimSpace(r.Expr) == "" {
			t.Errorf("%s: no expr", r.Alert)
		}
		if !durationRE.MatchString(r.For) || strings.Trim(r.For, "0mshdwy") == "" {
			t.Errorf("%s: for: %q, want a positive duration", r.Alert, r.For)
		}
		switch r.Labels["severity"] {
		case "critical", "warning", "info":
		default:
			t.Errorf("%s: severity label %q, want critical, warning or info", r.Alert, r.Labels["severity"])
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookPrefix)
		if !ok {
			t.Errorf("%s: runbook_url %q does not start with %s", r.Alert, r.Annotations["runbook_url"], runbookPrefix)
		} else if !anchors[anchor] {
			t.Errorf("%s: runbook_url anchor #%s is no heading of %s", r.Alert, anchor, operationsDoc)
		}
		if strings.Contains(r.Expr, "certmanager_") && !strings.Contains(r.Annotations["description"], "does not export") {
			t.Errorf("%s: uses cert-manager's metric but the description does not say that applistener exports none", r.Alert)
		}
	}
}

// markdownAnchors returns the GitHub anchors of the headings of a
// Markdown file (lower case, punctuation removed, spaces to '-').
func markdownAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var a strings.Builder
		for _, c := range strings.ToLower(h) {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
				a.WriteRune(c)
			case c == ' ':
				a.WriteByte('-')
			}
		}
		anchors[a.String()] = true
	}
	return anchors
}

// targetLabels are attached by Prometheus (the scrape target, the
// ServiceMonitor's relabelling), not by the binary.
var targetLabels = map[string]bool{
	"job": true, "instance": true, "namespace": true, "pod": true,
	"service": true, "endpoint": true, "container": true,
}

// checkNames reports every metric name of expr that is neither exported
// by the binary nor an allowed external or after-traffic metric, every
// label matcher that names a label the metric's samples do not carry, and
// every by/without/on/ignoring label that none of the expression's
// metrics carries.
func checkNames(exported *metricSet, literals map[string]bool, expr string) (names []string, problems []string) {
	info, err := parseExpr(expr)
	if err != nil {
		return nil, []string{fmt.Sprintf("cannot parse %q: %v", expr, err)}
	}
	names, _ = metricNames(expr)
	if len(names) == 0 {
		problems = append(problems, fmt.Sprintf("%q selects no metric", expr))
	}
	for _, n := range names {
		switch {
		case exported.has(n):
		case externalMetrics[n] != "":
		case afterTrafficOnly[n] != "" && literals[n]:
		default:
			problems = append(problems, fmt.Sprintf("%s is not exported by applistener serve, gateway or edge", n))
		}
	}
	// Labels: known only for metrics whose samples were scraped.
	allKnown := true
	carried := map[string]bool{}
	for _, sel := range info.selectors {
		labels, ok := exported.labelsOf(sel.name)
		if !ok {
			allKnown = false
			continue
		}
		for l := range labels {
			carried[l] = true
		}
		for _, l := range sel.labels {
			if labels[l] == nil && !targetLabels[l] {
				problems = append(problems, fmt.Sprintf("%s has no label %q (its labels: %v)", sel.name, l, slices.Sorted(maps.Keys(labels))))
			}
		}
	}
	if allKnown {
		for _, l := range info.grouping {
			if !carried[l] && !targetLabels[l] {
				problems = append(problems, fmt.Sprintf("by/without/on label %q is carried by none of %v", l, names))
			}
		}
	}
	return names, problems
}

// sourceLiterals returns the "applistener_*" string literals of the
// module's non-test Go files (to check the after-traffic allow-list).
func sourceLiterals(t *testing.T) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"(applistener_[a-z0-9_]+)"`)
	found := map[string]bool{}
	root := moduleRoot(t)
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "e2e" || d.Name() == "bench") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllSubmatch(b, -1) {
			found[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for n := range afterTrafficOnly {
		if !found[n] {
			t.Errorf("afterTrafficOnly lists %s, which no Go source of the module names", n)
		}
	}
	return found
}

// TestAlertRulesUseExportedMetrics: every metric name in every rule
// expression is one the built binary exports (or an allowed external
// one), and the rules cover the required signals.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	rules := loadRules(t)
	exported := exportedMetrics(t)
	literals := sourceLiterals(t)
	used := map[string]bool{}
	for _, r := range rules {
		names, problems := checkNames(exported, literals, r.Expr)
		for _, p := range problems {
			t.Errorf("%s%s: %s", r.Alert, r.Record, p)
		}
		for _, n := range names {
			used[n] = true
		}
	}
	for _, n := range requiredRuleMetrics {
		if !used[n] {
			t.Errorf("no alert rule uses %s", n)
		}
	}
	// The 5xx ratio matches code=~"5..": the scrape after a 200 and a 502
	// must show that convention (exact three-digit codes, as on every
	// applistener metric that labels a status, not classes such as "5xx").
	for _, name := range []string{"applistener_requests_total", "applistener_request_denials_total", "applistener_gateway_requests_total"} {
		labels, _ := exported.labelsOf(name)
		if len(labels["code"]) == 0 {
			t.Errorf("%s has no code label values after traffic; labels %v", name, slices.Sorted(maps.Keys(labels)))
		}
		for v := range labels["code"] {
			if len(v) != 3 || v[0] < '1' || v[0] > '5' || strings.Trim(v, "0123456789") != "" {
				t.Errorf("%s{code=%q}: want a three-digit status code", name, v)
			}
		}
	}
	codes, _ := exported.labelsOf("applistener_requests_total")
	if !codes["code"]["502"] || !codes["code"]["200"] {
		t.Errorf(`ApplistenerHighErrorRatio matches applistener_requests_total{code=~"5.."}, but after a 200 and a 502 the binary exports codes %v`, slices.Sorted(maps.Keys(codes["code"])))
	}
}

// TestMetricCheckCatchesTypos: the check above fails on a misspelt name,
// an unknown histogram series and a name only in a string.
func TestMetricCheckCatchesTypos(t *testing.T) {
	exported := exportedMetrics(t)
	literals := sourceLiterals(t)
	for _, expr := range []string{
		`sum by (status) (rate(applistener_requests_total{code="5xx"}[5m]))`,
		`rate(applistener_requests_total{status="500"}[5m])`,
		`applistener_routes{cause="x"}`,
		`rate(applistener_request_total[5m])`,
		`histogram_quantile(0.9, rate(applistener_revocation_close_second_bucket[5m]))`,
		`applistener_routes_bucket`,
		`applistener_client_connection_active > 1`,
		`label_replace(vector(1), "a", "applistener_routes", "", "")`,
	} {
		if _, problems := checkNames(exported, literals, expr); len(problems) == 0 {
			t.Errorf("checkNames(%q) found no problem", expr)
		}
	}
	for _, expr := range []string{
		`sum(rate(applistener_requests_total{code=~"5.."}[5m]))`,
		`histogram_quantile(0.9, rate(applistener_revocation_close_seconds_bucket[5m]))`,
		`applistener_gateway_store_up == 0`,
		`applistener_edge_routes`,
	} {
		if _, problems := checkNames(exported, literals, expr); len(problems) != 0 {
			t.Errorf("checkNames(%q): %q", expr, problems)
		}
	}
}

// ---------------------------------------------------------------------------
// The dashboard.
// ---------------------------------------------------------------------------

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
}

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels flattens rows (collapsed rows hold their panels).
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// TestDashboard: schemaVersion ≥ 36, unique panel ids, every non-row panel
// has targets, every target's metric names are exported, and the required
// signals are shown.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want ≥ 36", d.SchemaVersion)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are needed for provisioning", d.UID, d.Title)
	}
	exported := exportedMetrics(t)
	literals := sourceLiterals(t)
	used := map[string]bool{}
	ids := map[int]bool{}
	panels := allPanels(d.Panels)
	if len(panels) < 10 {
		t.Errorf("%d panels", len(panels))
	}
	for _, p := range panels {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d is zero or not unique", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %d: title %q, %d targets", p.ID, p.Title, len(p.Targets))
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			names, problems := checkNames(exported, literals, tg.Expr)
			for _, pr := range problems {
				t.Errorf("panel %q, target %s: %s", p.Title, tg.RefID, pr)
			}
			for _, n := range names {
				used[n] = true
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		// Grafana stores a query variable's query as a string or as
		// {"query": "..."}.
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var o struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &o); err != nil {
				t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
				continue
			}
			q = o.Query
		}
		names, err := grafanaQueryNames(q)
		if err != nil {
			t.Errorf("variable %s: %q: %v", v.Name, q, err)
		}
		for _, n := range names {
			if !exported.has(n) {
				t.Errorf("variable %s: %s is not exported", v.Name, n)
			}
		}
	}
	for _, n := range requiredDashboardMetrics {
		if !used[n] {
			t.Errorf("no dashboard panel shows %s", n)
		}
	}
}

// ---------------------------------------------------------------------------
// promtool: check rules and the rule unit tests.
// ---------------------------------------------------------------------------

// promtoolVersion is the Prometheus module version built when promtool is
// not on PATH (v0.316.0 is Prometheus 3.16), without service discovery. The
// build takes a few minutes once and is cached under
// os.UserCacheDir()/applistener/promtool-<version>/.
const promtoolVersion = "v0.316.0"

// promtoolBuildWithin bounds the one-time build; a build that does not
// finish in time leaves its compiled packages in the Go build cache, so a
// later run finishes it.
const promtoolBuildWithin = 5 * time.Minute

var (
	promtoolOnce sync.Once
	promtoolPath string
	promtoolErr  error
)

// promtool returns a promtool executable ($APPLISTENER_PROMTOOL, PATH, or
// the cached build), or skips the test when none can be had (fails it
// under CI): the metric name checks above do not depend on it.
func promtool(t *testing.T) string {
	t.Helper()
	promtoolOnce.Do(func() { promtoolPath, promtoolErr = findOrBuildPromtool() })
	if promtoolErr != nil {
		if os.Getenv("CI") != "" {
			// make test builds it beforehand (scripts/test-deps.sh).
			t.Fatalf("promtool unavailable under CI: %v", promtoolErr)
		}
		t.Skipf("promtool unavailable, rules checked by the metric-name tests only: %v", promtoolErr)
	}
	return promtoolPath
}

func findOrBuildPromtool() (string, error) {
	if p := os.Getenv("APPLISTENER_PROMTOOL"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "applistener", "promtool-"+promtoolVersion)
	bin := filepath.Join(dir, "promtool")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("no promtool on PATH and no go command to build it")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Install into a private directory, then rename: a concurrent run never
	// sees a half-written binary.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	ctx, cancel := context.WithTimeout(context.Background(), promtoolBuildWithin)
	defer cancel()
	// remove_all_sd leaves out the service-discovery plugins (cloud SDKs):
	// checking and unit-testing rules needs none of them, and the build
	// shrinks from well over five minutes to a fraction of that.
	cmd := exec.CommandContext(ctx, goBin, "install", "-tags", "remove_all_sd", "github.com/prometheus/prometheus/cmd/promtool@"+promtoolVersion)
	cmd.Dir = tmp // outside this module: its go.mod must not interfere
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go install github.com/prometheus/prometheus/cmd/promtool@%s (after %s): %v\n%s",
			promtoolVersion, time.Since(start).Round(time.Second), err, lastLines(out, 20))
	}
	fmt.Fprintf(os.Stderr, "built promtool %s in %s (cached at %s)\n", promtoolVersion, time.Since(start).Round(time.Second), bin)
	if err := os.Rename(filepath.Join(tmp, filepath.Base(bin)), bin); err != nil {
		return "", err
	}
	return bin, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func runPromtool(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = "../prometheus"
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestPromtoolCheckRules: `promtool check rules` (with its linter)
// accepts the rules file.
func TestPromtoolCheckRules(t *testing.T) {
	out, err := runPromtool(t, "check", "rules", "--lint=all", "--lint-fatal", filepath.Base(rulesFile))
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if n := len(loadRules(t)); !strings.Contains(out, fmt.Sprintf("%d rules found", n)) {
		t.Errorf("promtool check rules did not find the %d rules:\n%s", n, out)
	}
}

// TestPromtoolRuleUnitTests: `promtool test rules` passes, and the unit
// tests cover at least three alerts, each with a firing and a silent
// evaluation.
func TestPromtoolRuleUnitTests(t *testing.T) {
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	firing, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	var both []string
	for a := range firing {
		if silent[a] {
			both = append(both, a)
		}
	}
	slices.Sort(both)
	if len(both) < 3 {
		t.Errorf("%s: alerts tested both firing and silent: %q, want at least 3", rulesTestFile, both)
	}

	out, err := runPromtool(t, "test", "rules", filepath.Base(rulesTestFile))
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules did not report SUCCESS:\n%s", out)
	}
}

// TestPromtoolRuleUnitTestsCanFail: the same unit tests against rules
// whose thresholds are changed fail, so a passing run means something.
func TestPromtoolRuleUnitTestsCanFail(t *testing.T) {
	bin := promtool(t)
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(b), "applistener_gateway_store_up == 0", "applistener_gateway_store_up == 1", 1)
	if broken == string(b) {
		t.Fatal("the store-down expression to break is not in the rules file")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(rulesFile)), []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(rulesTestFile)), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "test", "rules", filepath.Base(rulesTestFile))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("promtool test rules passed against a broken store-down rule:\n%s", out)
	}
	if !strings.Contains(string(out), "ApplistenerGatewayStoreDown") {
		t.Errorf("the failure does not name the broken alert:\n%s", out)
	}
}
