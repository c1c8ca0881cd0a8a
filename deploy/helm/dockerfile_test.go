package helm_test

import (
	"debug/elf"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// instruction is one Dockerfile instruction with continuations joined.
type instruction struct {
	line int
	cmd  string // upper case
	args string
}

type stage struct {
	base, name string
	from       int // line
	body       []instruction
}

// parseDockerfile reads instructions: comments dropped, "\" continuations
// joined, grouped by FROM.
func parseDockerfile(t *testing.T, file string) []stage {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var (
		stages []stage
		cur    strings.Builder
		start  int
	)
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			if len(f) == 0 {
				t.Fatalf("Dockerfile:%d: FROM without an image", in.line)
			}
			st := stage{base: f[0], from: in.line}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("Dockerfile:%d: %s before the first FROM", in.line, in.cmd)
			}
			return
		}
		stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
	}
	for i, raw := range strings.Split(string(b), "\n") {
		line := strings.TrimRight(raw, " \t\r")
		if cur.Len() == 0 {
			if strings.HasPrefix(strings.TrimSpace(line), "#") || strings.TrimSpace(line) == "" {
				continue
			}
			start = i + 1
		} else if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // a comment inside a continuation
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

// execForm decodes a JSON-array (exec form) instruction argument.
func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(in.args), &v); err != nil || len(v) == 0 {
		t.Errorf("Dockerfile:%d: %s %s is not in exec (JSON array) form: the final image has no shell", in.line, in.cmd, in.args)
	}
	return v
}

func TestDockerfile(t *testing.T) {
	root := moduleRoot(t)
	stages := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("%d stages: want a multi-stage build (builder + final image)", len(stages))
	}
	final := stages[len(stages)-1]

	// Final base: scratch or a distroless static image (the binary is
	// static: no libc needed).
	if final.base != "scratch" && !strings.HasPrefix(final.base, "gcr.io/distroless/static") && !strings.HasPrefix(final.base, "gcr.io/distroless/base-nossl") {
		t.Errorf("final stage FROM %s: want scratch or gcr.io/distroless/static*", final.base)
	}

	// The build: a Go stage that runs `go build ./cmd/applistener` with
	// CGO_ENABLED=0 (in the RUN itself or an ENV of that stage).
	var (
		built    bool
		outPath  string
		buildStg stage
		buildIdx int
	)
	outFlag := regexp.MustCompile(`-o\s+(\S+)`)
	for i, st := range stages[:len(stages)-1] {
		cgoEnv := false
		for _, in := range st.body {
			if in.cmd == "ENV" && regexp.MustCompile(`\bCGO_ENABLED[= ]0\b`).MatchString(in.args) {
				cgoEnv = true
			}
			if in.cmd != "RUN" || !strings.Contains(in.args, "go build") || !strings.Contains(in.args, "./cmd/applistener") {
				continue
			}
			if !cgoEnv && !regexp.MustCompile(`\bCGO_ENABLED=0\b`).MatchString(in.args) {
				t.Errorf("Dockerfile:%d: go build without CGO_ENABLED=0 (the final image has no libc)", in.line)
			}
			if !strings.Contains(in.args, "-trimpath") {
				t.Errorf("Dockerfile:%d: go build without -trimpath", in.line)
			}
			if m := outFlag.FindStringSubmatch(in.args); m != nil {
				outPath = m[1]
			}
			built, buildStg, buildIdx = true, st, i
		}
	}
	if !built || outPath == "" {
		t.Fatal("no build stage runs `CGO_ENABLED=0 go build -o PATH ./cmd/applistener`")
	}
	if !strings.HasPrefix(buildStg.base, "golang:") {
		t.Errorf("build stage FROM %s: want golang:<version>", buildStg.base)
	}
	if goVersion := goDirective(t, root); !strings.HasPrefix(strings.TrimPrefix(buildStg.base, "golang:"), goVersion) {
		t.Errorf("build stage FROM %s does not match go.mod's go %s", buildStg.base, goVersion)
	}

	// The final stage: copies the binary from the build stage, runs no shell
	// commands, non-root numeric USER, EXPOSE, ENTRYPOINT + CMD = serve.
	var (
		binary     string
		user       string
		exposed    []int
		entrypoint []string
		cmd        []string
	)
	for _, in := range final.body {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && (f[0] == "--from="+buildStg.name || f[0] == "--from="+strconv.Itoa(buildIdx)) && f[1] == outPath {
				binary = f[2]
			}
		case "RUN":
			t.Errorf("Dockerfile:%d: RUN in the final stage (distroless/scratch have no shell)", in.line)
		case "USER":
			user = in.args
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					t.Errorf("Dockerfile:%d: EXPOSE %q", in.line, p)
				}
				exposed = append(exposed, n)
			}
		case "ENTRYPOINT":
			entrypoint = execForm(t, in)
		case "CMD":
			cmd = execForm(t, in)
		}
	}
	if binary == "" {
		t.Fatalf("the final stage does not COPY --from=%s %s", buildStg.name, outPath)
	}
	m := regexp.MustCompile(`^([0-9]+)(?::([0-9]+))?$`).FindStringSubmatch(user)
	if m == nil {
		t.Fatalf("USER %q: want a numeric uid[:gid] (runAsNonRoot can only verify numeric users)", user)
	}
	uid, _ := strconv.Atoi(m[1])
	if uid == 0 || (m[2] != "" && m[2] == "0") {
		t.Errorf("USER %s runs as root", user)
	}
	slices.Sort(exposed)
	if !slices.Equal(exposed, []int{5501, 8443, 9090}) {
		t.Errorf("EXPOSE %v, want 8443 5501 9090", exposed)
	}
	if len(entrypoint) != 1 || entrypoint[0] != binary {
		t.Errorf("ENTRYPOINT %q, want [%q]", entrypoint, binary)
	}
	if !slices.Equal(cmd, []string{"serve"}) {
		t.Errorf("CMD %q: the image must run `applistener serve` by default", cmd)
	}
	if path.Base(binary) != "applistener" {
		t.Errorf("binary installed as %s", binary)
	}

	// The chart agrees with the image: same uid, same ports.
	var values struct {
		SecurityContext struct {
			RunAsUser int `json:"runAsUser"`
		} `json:"securityContext"`
		AppListener struct {
			Port int `json:"port"`
		} `json:"appListener"`
		Health struct {
			Port int `json:"port"`
		} `json:"health"`
		Admin struct {
			Port int `json:"port"`
		} `json:"admin"`
	}
	vb, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(vb, &values); err != nil {
		t.Fatal(err)
	}
	if values.SecurityContext.RunAsUser != uid {
		t.Errorf("chart runAsUser %d, image USER %d", values.SecurityContext.RunAsUser, uid)
	}
	if got := []int{values.Health.Port, values.AppListener.Port, values.Admin.Port}; !slices.Equal(got, exposed) {
		t.Errorf("chart ports (health, app, admin) %v, image EXPOSE %v", got, exposed)
	}
}

// TestBinaryIsStatic: the binary built as the Dockerfile builds it
// (CGO_ENABLED=0) has no ELF interpreter and no shared libraries, so it runs
// on distroless/static or scratch.
func TestBinaryIsStatic(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("ELF check on Linux only")
	}
	f, err := elf.Open(applistenerBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a %s program header: it is dynamically linked", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
}

func goDirective(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go\s+([0-9]+\.[0-9]+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("no go directive in go.mod")
	}
	return string(m[1])
}

// TestDockerfileBuildsTheReleaseBinary: the Dockerfile's go build uses the
// flags `make release` (scripts/release.sh) uses, so that with the same Go
// version both produce the same binary.
func TestDockerfileBuildsTheReleaseBinary(t *testing.T) {
	root := moduleRoot(t)
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	norm := strings.NewReplacer("${VERSION}", "V", "$VERSION", "V", "${REVISION}", "C", "$commit", "C")
	docker := regexp.MustCompile(`go build (-trimpath -buildvcs=false) -ldflags "([^"]*)"`).FindStringSubmatch(read("Dockerfile"))
	script := read("scripts/release.sh")
	rel := regexp.MustCompile(`build (-trimpath -buildvcs=false) -ldflags "\$ldflags"`).FindStringSubmatch(script)
	relLdflags := regexp.MustCompile(`local ldflags="([^"]*)"`).FindStringSubmatch(script)
	if docker == nil || rel == nil || relLdflags == nil {
		t.Fatalf("go build flags not found (Dockerfile %q, release.sh %q, %q)", docker, rel, relLdflags)
	}
	if docker[1] != rel[1] || norm.Replace(docker[2]) != norm.Replace(relLdflags[1]) {
		t.Errorf("Dockerfile builds with %s -ldflags %q; make release with %s -ldflags %q", docker[1], docker[2], rel[1], relLdflags[1])
	}
	if want := "-s -w -X main.version=V -X main.revision=C"; norm.Replace(docker[2]) != want {
		t.Errorf("Dockerfile -ldflags %q, want %q", norm.Replace(docker[2]), want)
	}
}
