package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/cli.md from the flag definitions")

// docs/cli.md is what the flag definitions generate: every command and
// every flag of it is listed, with its environment variable.
func TestCLIReference(t *testing.T) {
	var b bytes.Buffer
	if err := writeCLIReference(&b); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "docs", "cli.md")
	if *update {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, b.Bytes()) {
		t.Fatalf("docs/cli.md is out of date: run go test ./cmd/applistener -run TestCLIReference -update")
	}
	for _, c := range cliCommands() {
		if !strings.Contains(string(have), "## `applistener "+c.path+"`") {
			t.Errorf("no section for %s", c.path)
		}
		c.flagSet().VisitAll(func(f *flag.Flag) {
			want := "| `--" + f.Name + "` | `" + envName(f.Name) + "` |"
			if _, dep := isDeprecated(f); dep {
				want = "`--" + f.Name + "` (use `--"
			}
			if !strings.Contains(string(have), want) {
				t.Errorf("%s: --%s not listed", c.path, f.Name)
			}
		})
	}
}

// -h (and --help) prints a usage line and exits 0 on every command.
func TestHelpEverywhere(t *testing.T) {
	for _, c := range cliCommands() {
		for _, h := range []string{"-h", "--help"} {
			args := append(strings.Fields(c.path), h)
			var stdout, stderr bytes.Buffer
			if code := run(args, &stdout, &stderr); code != 0 {
				t.Errorf("%q: exit %d, stderr %q", args, code, stderr.String())
			}
			if !strings.Contains(stdout.String(), "usage: applistener "+strings.Fields(c.path)[0]) {
				t.Errorf("%q: no usage line in %q", args, stdout.String())
			}
		}
	}
}

// An unknown flag is named with the nearest known one; a bad value is said
// in plain words; neither leaks Go's messages.
func TestFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--app-domian", "x"}, "applistener serve: unknown flag --app-domian (did you mean --app-domain?) (see -h)\n"},
		{[]string{"serve", "--routes"}, "applistener serve: unknown flag --routes (did you mean --routes-file?) (see -h)\n"},
		{[]string{"edge", "--zzzzzz"}, "applistener edge: unknown flag --zzzzzz (see -h)\n"},
		{[]string{"serve", "--app-max-header-bytes", "lots"}, `applistener serve: --app-max-header-bytes "lots": not a valid value`},
		{[]string{"serve", "--routes-file"}, "applistener serve: --routes-file needs a value (see -h)\n"},
		{[]string{"serve", "--app-listener=yes"}, `applistener serve: --app-listener "yes": not true or false (a boolean flag is given alone, or as --app-listener=false) (see -h)` + "\n"},
		{[]string{"serve", "--routes-file", "r.json", "--trusted-proxies", "10.0.0.1"}, "applistener serve: --trusted-proxies: 10.0.0.1 is an address, not a CIDR: write 10.0.0.1/32 for it alone\n"},
		{[]string{"serve", "--routes-file", "r.json", "--trusted-proxies", "ten"}, `applistener serve: --trusted-proxies: "ten" is not a CIDR like 10.0.0.0/8 or fd00::/8` + "\n"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", c.args, code)
		}
		if !strings.HasPrefix(stderr.String(), c.want) {
			t.Errorf("%q: stderr %q, want %q", c.args, stderr.String(), c.want)
		}
		for _, leak := range []string{"parse error", "netip.", "strconv.", "flag provided"} {
			if strings.Contains(stderr.String(), leak) {
				t.Errorf("%q: Go's words in %q", c.args, stderr.String())
			}
		}
	}
}

// APPLISTENER_<FLAG> sets a flag; the command line wins; a bad value names
// the variable; a deprecated name works with a warning.
func TestFlagsFromEnvironmentAndAliases(t *testing.T) {
	t.Setenv("APPLISTENER_ROUTES_FILE", "from-env.json")
	t.Setenv("APPLISTENER_APP_DIAL_TIMEOUT", "7s")
	var o serveOptions
	if err := parseCommand("serve", nil, &o); err != nil {
		t.Fatal(err)
	}
	if o.routesFile != "from-env.json" || o.dialTimeout.String() != "7s" {
		t.Errorf("from the environment: routes file %q, dial timeout %v", o.routesFile, o.dialTimeout)
	}
	o = serveOptions{}
	if err := parseCommand("serve", []string{"--routes-file", "from-flag.json"}, &o); err != nil {
		t.Fatal(err)
	}
	if o.routesFile != "from-flag.json" {
		t.Errorf("the flag did not win over the environment: %q", o.routesFile)
	}
	t.Setenv("APPLISTENER_APP_DIAL_TIMEOUT", "soon")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `APPLISTENER_APP_DIAL_TIMEOUT="soon": invalid value for --app-dial-timeout`) {
		t.Errorf("bad environment value: exit %d, %q", code, stderr.String())
	}
	if err := os.Unsetenv("APPLISTENER_APP_DIAL_TIMEOUT"); err != nil { // t.Setenv restores it at the end
		t.Fatal(err)
	}

	// Deprecated names: the same value, one warning each.
	var warn bytes.Buffer
	old := warnings
	warnings = &warn
	defer func() { warnings = old }()
	var e edgeOptions
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	e.flags(fs)
	if err := parseFlags(fs, []string{"--token-file", "tok", "--hello-timeout", "3s"}); err != nil {
		t.Fatal(err)
	}
	if e.tokenFile != "tok" || e.helloTimeout.String() != "3s" {
		t.Errorf("aliases did not set the flags: %q %v", e.tokenFile, e.helloTimeout)
	}
	for _, w := range []string{
		"applistener edge: warning: --token-file is deprecated and will be removed; use --gateway-token-file\n",
		"applistener edge: warning: --hello-timeout is deprecated and will be removed; use --handshake-timeout\n",
	} {
		if !strings.Contains(warn.String(), w) {
			t.Errorf("warnings %q, want %q", warn.String(), w)
		}
	}
	// A deprecated name has no environment variable of its own.
	warn.Reset()
	t.Setenv("APPLISTENER_TOKEN_FILE", "ignored")
	e = edgeOptions{}
	fs = flag.NewFlagSet("edge", flag.ContinueOnError)
	e.flags(fs)
	if err := parseFlags(fs, nil); err != nil || e.tokenFile != "" || warn.Len() != 0 {
		t.Errorf("APPLISTENER_TOKEN_FILE: %v, token file %q, warnings %q", err, e.tokenFile, warn.String())
	}
}

// The completion scripts load in a real bash and complete commands,
// subcommands and each command's flags.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal("bash is needed for this test:", err)
	}
	var script, stderr bytes.Buffer
	if code := run([]string{"completion", "bash"}, &script, &stderr); code != 0 {
		t.Fatalf("completion bash: exit %d %s", code, stderr.String())
	}
	file := filepath.Join(t.TempDir(), "applistener.bash")
	if err := os.WriteFile(file, script.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	probe := `set -e; source "$1"
t() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _applistener; echo "${COMPREPLY[*]}"; }
t applistener ser; t applistener routes wa; t applistener serve --app-do; t applistener validate gateway --tok; t applistener edge --gateway-tok`
	out, err := exec.Command(bash, "-c", probe, "probe", file).CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	want := "serve\nwatch\n--app-domain\n--tokens\n--gateway-token-file\n"
	if string(out) != want {
		t.Errorf("completions:\n%s\nwant:\n%s", out, want)
	}
	for _, shell := range []string{"zsh", "fish"} {
		var s bytes.Buffer
		if code := run([]string{"completion", shell}, &s, &stderr); code != 0 || !strings.Contains(s.String(), "applistener") {
			t.Errorf("completion %s: exit %d, %d bytes", shell, code, s.Len())
		}
	}
}
