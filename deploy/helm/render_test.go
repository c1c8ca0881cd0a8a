package helm_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// helmVersion is the Helm release built when no helm is on PATH. The module
// proxy serves it; the build takes a few minutes once and is cached under
// os.UserCacheDir()/applistener/helm-<version>/.
const helmVersion = "v3.22.0"

const (
	chartDir    = "applistener"
	releaseName = "rel"
	namespace   = "sbx"
)

// inCI reports whether the tests run in CI, where a missing renderer or
// binary is a failure, never a skip.
func inCI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "", "0", "false", "no":
		return false
	}
	return true
}

// unavailable fails the test in CI and skips it elsewhere.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if inCI() {
		t.Fatalf("CI: %s", msg)
	}
	t.Skipf("%s (set CI=1 to make this a failure)", msg)
}

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helmBinary returns a helm executable: $APPLISTENER_HELM, helm on PATH, or
// the cached build of helmVersion (built now when missing).
func helmBinary(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath, helmErr = findOrBuildHelm() })
	if helmErr != nil {
		unavailable(t, "cannot render the chart: %v", helmErr)
	}
	return helmPath
}

func findOrBuildHelm() (string, error) {
	if p := os.Getenv("APPLISTENER_HELM"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "applistener", "helm-"+helmVersion)
	bin := filepath.Join(dir, "helm")
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	goBin, err := goCommand()
	if err != nil {
		return "", errors.New("no helm on PATH and no go command to build it")
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
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "install", "helm.sh/helm/v3/cmd/helm@"+helmVersion)
	cmd.Dir = tmp // outside this module: its go.mod must not interfere
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go install helm.sh/helm/v3/cmd/helm@%s: %v\n%s", helmVersion, err, lastLines(out, 20))
	}
	fmt.Fprintf(os.Stderr, "built helm %s in %s (cached at %s)\n", helmVersion, time.Since(start).Round(time.Second), bin)
	if err := os.Rename(filepath.Join(tmp, filepath.Base(bin)), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// goCommand returns the go command of the toolchain running the tests:
// `go test` puts that toolchain's $GOROOT/bin first on the PATH it gives
// the test binary.
func goCommand() (string, error) {
	return exec.LookPath("go")
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------------------
// The applistener binary and the flags it accepts.
// ---------------------------------------------------------------------------

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// applistenerBinary builds ./cmd/applistener once per test process (or
// uses $APPLISTENER_BIN).
func applistenerBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("APPLISTENER_BIN"); p != "" {
			binPath = p // a prebuilt binary (e.g. CI's bin/applistener)
			return
		}
		dir, err := os.MkdirTemp("", "applistener-chart-test-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "applistener")
		goBin, err := goCommand()
		if err != nil {
			binErr = err
			return
		}
		// Built as the Dockerfile builds it: static, trimmed.
		cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags", "-s -w", "-o", binPath, "./cmd/applistener")
		cmd.Dir = moduleRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/applistener: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" && os.Getenv("APPLISTENER_BIN") == "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}

var (
	flagsMu    sync.Mutex
	flagsCache = map[string]map[string]bool{}
	flagLine   = regexp.MustCompile(`^\s+-{1,2}([A-Za-z0-9][A-Za-z0-9._-]*)`)
)

// acceptedFlags runs `applistener <command> -h` and returns the flag names
// it lists (flag.PrintDefaults: "  -name type" lines).
func acceptedFlags(t *testing.T, command string) map[string]bool {
	t.Helper()
	flagsMu.Lock()
	defer flagsMu.Unlock()
	if f, ok := flagsCache[command]; ok {
		return f
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(applistenerBinary(t), command, "-h")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("applistener %s -h: %v\n%s%s", command, err, stdout.String(), stderr.String())
	}
	flags := map[string]bool{}
	sc := bufio.NewScanner(io.MultiReader(&stdout, &stderr))
	for sc.Scan() {
		if m := flagLine.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if len(flags) < 5 {
		t.Fatalf("applistener %s -h listed %d flags; output:\n%s%s", command, len(flags), stdout.String(), stderr.String())
	}
	flagsCache[command] = flags
	return flags
}

// parseArgs splits container args after the subcommand into flag name →
// value ("" for a bare boolean flag). A repeated flag is an error.
func parseArgs(t *testing.T, args []string, command string) map[string]string {
	t.Helper()
	if len(args) == 0 || args[0] != command {
		t.Fatalf("container args %q do not start with the %q subcommand", args, command)
	}
	out := map[string]string{}
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "-") {
			t.Fatalf("positional argument %q in %q (every argument must be a --flag)", a, args)
		}
		name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, dup := out[name]; dup {
			t.Errorf("flag --%s given twice in %q", name, args)
		}
		out[name] = val
	}
	return out
}

// ---------------------------------------------------------------------------
// Rendering and strict decoding.
// ---------------------------------------------------------------------------

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor that
// the chart renders; decoding is strict, so any other field is an error.
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is one release's objects, decoded.
type rendered struct {
	Deployments     []*appsv1.Deployment
	Services        []*corev1.Service
	Secrets         []*corev1.Secret
	ConfigMaps      []*corev1.ConfigMap
	ServiceAccounts []*corev1.ServiceAccount
	NetworkPolicies []*networkingv1.NetworkPolicy
	PDBs            []*policyv1.PodDisruptionBudget
	ServiceMonitors []*serviceMonitor
}

// operatorValues is what every install must set: the gateway the supervisors
// use. A default install without it fails at render time with one line
// saying so (TestChartDefaultInstallSaysWhatToSet); helmTemplate puts these
// values under every case's values.
var operatorValues = map[string]any{"controlPlane": map[string]any{"gatewayEndpoint": "https://gateway:8080"}}

// helmTemplate renders the chart with operatorValues and values (each
// marshalled to a values file, the latter overriding) and returns helm's
// output and error.
func helmTemplate(t *testing.T, values map[string]any) ([]byte, error) {
	t.Helper()
	return helmTemplateFiles(t, operatorValues, values)
}

// helmTemplateFiles renders the chart with one values file per map, in order.
func helmTemplateFiles(t *testing.T, valueSets ...map[string]any) ([]byte, error) {
	t.Helper()
	helm := helmBinary(t)
	args := []string{"template", releaseName, chartDir, "--namespace", namespace}
	for i, values := range valueSets {
		vb, err := json.Marshal(values)
		if err != nil {
			t.Fatal(err)
		}
		vf := filepath.Join(t.TempDir(), fmt.Sprintf("values-%d.json", i))
		if err := os.WriteFile(vf, vb, 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", vf)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// render renders the chart and decodes every object strictly.
func render(t *testing.T, values map[string]any) *rendered {
	t.Helper()
	out, err := helmTemplate(t, values)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	r := &rendered{}
	seen := map[string]bool{}
	for _, doc := range docSep.Split(string(out), -1) {
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			t.Fatalf("rendered object: %v\n%s", err, doc)
		}
		var obj any
		switch tm.APIVersion + "/" + tm.Kind {
		case "apps/v1/Deployment":
			o := &appsv1.Deployment{}
			r.Deployments, obj = append(r.Deployments, o), o
		case "v1/Service":
			o := &corev1.Service{}
			r.Services, obj = append(r.Services, o), o
		case "v1/Secret":
			o := &corev1.Secret{}
			r.Secrets, obj = append(r.Secrets, o), o
		case "v1/ConfigMap":
			o := &corev1.ConfigMap{}
			r.ConfigMaps, obj = append(r.ConfigMaps, o), o
		case "v1/ServiceAccount":
			o := &corev1.ServiceAccount{}
			r.ServiceAccounts, obj = append(r.ServiceAccounts, o), o
		case "networking.k8s.io/v1/NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			r.NetworkPolicies, obj = append(r.NetworkPolicies, o), o
		case "policy/v1/PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			r.PDBs, obj = append(r.PDBs, o), o
		case "monitoring.coreos.com/v1/ServiceMonitor":
			o := &serviceMonitor{}
			r.ServiceMonitors, obj = append(r.ServiceMonitors, o), o
		default:
			t.Fatalf("unexpected object %s %s in the rendered chart", tm.APIVersion, tm.Kind)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(obj); err != nil {
			t.Fatalf("strict decoding of %s: %v\n%s", tm.Kind, err, doc)
		}
		meta := objectMeta(obj)
		key := tm.Kind + "/" + meta.Name
		if seen[key] {
			t.Errorf("%s rendered twice", key)
		}
		seen[key] = true
		if meta.Namespace != namespace {
			t.Errorf("%s: namespace %q, want the release namespace %q", key, meta.Namespace, namespace)
		}
		if errs := validName(meta.Name); errs != "" {
			t.Errorf("%s: %s", key, errs)
		}
	}
	if len(seen) == 0 {
		t.Fatal("the chart rendered no objects")
	}
	return r
}

func objectMeta(obj any) metav1.ObjectMeta {
	switch o := obj.(type) {
	case *serviceMonitor:
		return o.Metadata
	case metav1.ObjectMetaAccessor:
		return *o.GetObjectMeta().(*metav1.ObjectMeta)
	}
	panic(fmt.Sprintf("no metadata on %T", obj))
}

var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// validName checks an object name as a DNS-1123 label of at most 63
// characters (Services need that; the chart uses it for everything).
func validName(name string) string {
	if len(name) > 63 || !dns1123.MatchString(name) {
		return fmt.Sprintf("name %q is not a DNS-1123 label", name)
	}
	return ""
}

// sortedKeys returns m's keys in order, for stable messages.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
