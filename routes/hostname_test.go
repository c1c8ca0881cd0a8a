package routes

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestNormalizeHost(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{"team--demo--web.apps.example.com", "team--demo--web.apps.example.com", true},
		{"team--demo--web.apps.example.com:8443", "team--demo--web.apps.example.com", true},
		{"team--demo--web.apps.example.com.", "team--demo--web.apps.example.com", true},
		{"team--demo--web.apps.example.com.:8443", "team--demo--web.apps.example.com", true},
		{"Team--Demo--WEB.Apps.Example.COM", "team--demo--web.apps.example.com", true},
		{"TEAM--DEMO.APPS.EXAMPLE.COM.:443", "team--demo.apps.example.com", true},
		{"localhost", "localhost", true},
		{"a:1", "a", true},
		{"a:12345", "a", true},
		{"a:0", "a", true},
		{"[::1]", "[::1]", true},
		{"[::1]:8443", "[::1]", true},
		{"[FE80::1]:80", "[fe80::1]", true},
		{"127.0.0.1:8080", "127.0.0.1", true},

		{"", "", false},
		{".", "", false},
		{":8443", "", false},
		{".:8443", "", false},
		{"host..", "", false},
		{"host..:80", "", false},
		{"host:", "", false},
		{"host:123456", "", false},
		{"host:80a", "", false},
		{"host:+80", "", false},
		{"host:-1", "", false},
		{"host:8443.", "", false},
		{"a:b:80", "", false},
		{"::1", "", false},
		{"[::1", "", false},
		{"[]", "", false},
		{"[]:80", "", false},
		{"[::1]x", "", false},
		{"[::1]:", "", false},
		{"[::1]:123456", "", false},
		{"[::1]]", "", false},
		{"team demo.example.com", "", false},
		{"team\tdemo.example.com", "", false},
		{" team.example.com", "", false},
		{"team.example.com\n", "", false},
		{"team\x00.example.com", "", false},
		{"team\x7f.example.com", "", false},
		{"tëam.example.com", "", false}, // UTF-8
		{"xn--tam-epa.example.com", "xn--tam-epa.example.com", true}, // its IDN A-label is plain ASCII
		{"team\xff.example.com", "", false},
		{"TEAM\u212a.example.com", "", false}, // Kelvin sign folds to k in Unicode, not here
	}
	for _, tt := range tests {
		got, ok := NormalizeHost(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("NormalizeHost(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestNormalizeHostAllocs(t *testing.T) {
	for _, in := range []string{
		"team--demo--web.apps.example.com",
		"team--demo--web.apps.example.com:8443",
		"team--demo--web.apps.example.com.",
		"team--demo--web.apps.example.com.:8443",
		"[::1]:8443",
	} {
		var out string
		allocs := testing.AllocsPerRun(100, func() {
			out, _ = NormalizeHost(in)
		})
		if allocs != 0 {
			t.Errorf("NormalizeHost(%q) allocates %v times, want 0", in, allocs)
		}
		if !strings.HasPrefix(in, out) {
			t.Errorf("NormalizeHost(%q) = %q, not a prefix of the input", in, out)
		}
	}
}

func TestValidName(t *testing.T) {
	tests := []struct {
		name    string
		wantErr string // "" = valid; else a substring of the error
	}{
		{"team", ""},
		{"a", ""},
		{"0", ""},
		{"web-1", ""},
		{"a-b-c", ""},
		{"1234567890123456789", ""}, // 19
		{"0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1", ""}, // a UUID
		{strings.Repeat("a", 63), ""},

		{"", "empty"},
		{strings.Repeat("a", 64), "longer than 63"},
		{"Team", `name "Team": character 'T' not allowed (use [a-z0-9-])`},
		{"teaM", "character 'M' not allowed"},
		{"te_am", "character '_' not allowed"},
		{"te.am", "character '.' not allowed"},
		{"te am", "byte 0x20 not allowed"},
		{"tëam", "byte 0xc3 not allowed"},
		{"-team", "must start with a letter or digit"},
		{"team-", "must end with a letter or digit"},
		{"-", "must start"},
		{"a--b", `must not contain "--"`},
		{"a---b", `must not contain "--"`},
	}
	for _, tt := range tests {
		err := ValidName(tt.name)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("ValidName(%q) = %v, want nil", tt.name, err)
		case tt.wantErr != "" && err == nil:
			t.Errorf("ValidName(%q) = nil, want error containing %q", tt.name, tt.wantErr)
		case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
			t.Errorf("ValidName(%q) = %q, want error containing %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestValidNameLongInputErrorIsBounded(t *testing.T) {
	err := ValidName(strings.Repeat("a", 1<<20))
	if err == nil || len(err.Error()) > 200 {
		t.Fatalf("ValidName(1 MiB) error = %.300v", err)
	}
}

func TestValidDomain(t *testing.T) {
	tests := []struct {
		domain  string
		wantErr string
	}{
		{"apps.example.com", ""},
		{"example.com", ""},
		{"a.b", ""},
		{"x-1.example.io", ""},
		{"1.example.com", ""},
		{strings.Repeat("a", 63) + ".com", ""},
		{strings.Repeat("a.", 125) + "abc", ""}, // 253

		{"", "empty"},
		{"localhost", "at least two labels"},
		{"com", "at least two labels"},
		{"apps.example.com.", "must not end with a dot"},
		{"Apps.example.com", "lower case"},
		{"apps..example.com", "empty label"},
		{".example.com", "empty label"},
		{"-apps.example.com", "starts or ends with '-'"},
		{"apps-.example.com", "starts or ends with '-'"},
		{strings.Repeat("a", 64) + ".com", "label longer than 63"},
		{strings.Repeat("a.", 126) + "ab", "longer than 253"}, // 254
		{"127.0.0.1", "IP address"},
		{"10.1", "all digits"},
		{"example.123", "all digits"},
		{"::1", "IP address"},
		{"apps.example.com:8443", "character ':' not allowed"},
		{"apps_x.example.com", "character '_' not allowed"},
		{"*.example.com", "character '*' not allowed"},
		{"bücher.example", "byte 0xc3"},
	}
	for _, tt := range tests {
		err := ValidDomain(tt.domain)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("ValidDomain(%q) = %v, want nil", tt.domain, err)
		case tt.wantErr != "" && err == nil:
			t.Errorf("ValidDomain(%q) = nil, want error containing %q", tt.domain, tt.wantErr)
		case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
			t.Errorf("ValidDomain(%q) = %q, want error containing %q", tt.domain, err, tt.wantErr)
		}
	}
}

func TestHostname(t *testing.T) {
	tests := []struct {
		ws, sb, svc, domain, want string
	}{
		{"team", "demo", "web", "apps.example.com", "team--demo--web.apps.example.com"},
		{"team", "demo", "", "apps.example.com", "team--demo.apps.example.com"},
	}
	for _, tt := range tests {
		if got := Hostname(tt.ws, tt.sb, tt.svc, tt.domain); got != tt.want {
			t.Errorf("Hostname(%q, %q, %q, %q) = %q, want %q", tt.ws, tt.sb, tt.svc, tt.domain, got, tt.want)
		}
	}
}

// The worked example of README.md ("Long names"): a platform computes the
// same label with
//
//	printf '%s' 'team/0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1/jupyter-lab-notebook' |
//	  openssl dgst -sha256 -binary | base32 | tr -d = | tr A-Z a-z
const (
	exampleSandbox = "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"
	exampleService = "jupyter-lab-notebook"
	exampleLabel   = "h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq"
)

func TestLabelWorkedExample(t *testing.T) {
	// team--<uuid>--jupyter-lab-notebook is 64 characters: one too many.
	if n := len("team--" + exampleSandbox + "--" + exampleService); n != 64 {
		t.Fatalf("readable label is %d characters", n)
	}
	if got := Label("team", exampleSandbox, exampleService); got != exampleLabel {
		t.Errorf("Label = %q, want %q", got, exampleLabel)
	}
	if got := Hostname("team", exampleSandbox, exampleService, "apps.example.com"); got != exampleLabel+".apps.example.com" {
		t.Errorf("Hostname = %q", got)
	}
	// The same sandbox's other services fit and stay readable.
	if got := Hostname("team", exampleSandbox, "web", "apps.example.com"); got != "team--"+exampleSandbox+"--web.apps.example.com" {
		t.Errorf("Hostname(web) = %q", got)
	}
	if got := Hostname("team", exampleSandbox, "", "apps.example.com"); got != "team--"+exampleSandbox+".apps.example.com" {
		t.Errorf("Hostname(unnamed) = %q", got)
	}
	// Hashed labels of the other services (checked with the command above).
	for _, tt := range []struct{ svc, want string }{
		{"web", "h-xsegc5p6j5npbhzgfwgsa4yorlkvfyyj5chxz3ic7wvyjssnscoq"},
		{"", "h-cudem5gwsk2fmchlagh23pq4s2klfci4jhvhycz6lwhsyxvla7dq"},
	} {
		if got := HashedLabel("team", exampleSandbox, tt.svc); got != tt.want {
			t.Errorf("HashedLabel(%q) = %q, want %q", tt.svc, got, tt.want)
		}
	}
}

func TestLabel(t *testing.T) {
	n := func(c string, k int) string { return strings.Repeat(c, k) }
	tests := []struct {
		ws, sb, svc string
		hashed      bool
	}{
		// Readable names are unchanged, up to a 63-character label.
		{"team", "demo", "web", false},
		{"team", "demo", "", false},
		{n("w", 19), n("s", 19), n("v", 19), false},
		{"team", exampleSandbox, "web", false},
		{n("w", 30), n("s", 29), "", false},            // 61
		{n("w", 30), n("s", 31), "", false},            // 63
		{n("w", 20), n("s", 20), n("v", 19), false},    // 63
		{"team", exampleSandbox, n("v", 19), false},    // 63
		{n("w", 63), "s", "", true},                    // 66
		{n("w", 30), n("s", 32), "", true},             // 64
		{n("w", 20), n("s", 20), n("v", 20), true},     // 64
		{"team", exampleSandbox, exampleService, true}, // 64
		{n("w", 63), n("s", 63), n("v", 63), true},
		{n("w", 63), n("s", 63), "", true},
	}
	for _, tt := range tests {
		readable := tt.ws + "--" + tt.sb
		if tt.svc != "" {
			readable += "--" + tt.svc
		}
		got := Label(tt.ws, tt.sb, tt.svc)
		if tt.hashed {
			if got != HashedLabel(tt.ws, tt.sb, tt.svc) || !IsHashedLabel(got) || len(got) != 54 || strings.Contains(got, "--") {
				t.Errorf("Label(%d, %d, %d characters) = %q, want a hashed label", len(tt.ws), len(tt.sb), len(tt.svc), got)
			}
			continue
		}
		if got != readable || IsHashedLabel(got) {
			t.Errorf("Label(%d, %d, %d characters) = %q, want %q", len(tt.ws), len(tt.sb), len(tt.svc), got, readable)
		}
		if h := Hostname(tt.ws, tt.sb, tt.svc, "apps.example.com"); h != got+".apps.example.com" {
			t.Errorf("Hostname = %q, want %q", h, got+".apps.example.com")
		}
	}
	// Distinct inputs give distinct labels; the separator is unambiguous.
	seen := map[string]string{}
	for _, in := range [][3]string{{"a", "b", ""}, {"a", "b", "c"}, {"a", "bc", ""}, {"ab", "c", ""}, {"a-b", "c", ""}, {"a", "b-c", ""}} {
		l := HashedLabel(in[0], in[1], in[2])
		if prev, dup := seen[l]; dup {
			t.Errorf("HashedLabel(%q) = HashedLabel(%s) = %q", in, prev, l)
		}
		seen[l] = fmt.Sprint(in)
	}
}

// No readable label of valid names parses as a hashed one, and every
// hashed label is a valid DNS label that parses as hashed.
func TestLabelKindsDisjoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	name := func() string {
		const alpha = "abcdefghijklmnopqrstuvwxyz0123456789-"
		for {
			b := make([]byte, 1+rng.IntN(MaxNameLen))
			for i := range b {
				b[i] = alpha[rng.IntN(len(alpha))]
			}
			if ValidName(string(b)) == nil {
				return string(b)
			}
		}
	}
	const domain = "apps.example.com"
	readable, hashed := 0, 0
	for range 20000 {
		ws, sb, svc := name(), name(), name()
		if rng.IntN(3) == 0 {
			svc = ""
		}
		host := Hostname(ws, sb, svc, domain)
		label := strings.TrimSuffix(host, "."+domain)
		if err := ValidDomain(host); err != nil {
			t.Fatalf("Hostname(%q, %q, %q) = %q: %v", ws, sb, svc, host, err)
		}
		p, err := ParseHostname(host, domain)
		if err != nil {
			t.Fatalf("ParseHostname(Hostname(%q, %q, %q)): %v", ws, sb, svc, err)
		}
		if readableLen(ws, sb, svc) <= 63 {
			readable++
			if p.Hashed || IsHashedLabel(label) || p != (HostParts{ws, sb, svc, false}) {
				t.Fatalf("readable %q parsed as %+v", host, p)
			}
			continue
		}
		hashed++
		if !p.Hashed || p.Workspace != "" || label != HashedLabel(ws, sb, svc) {
			t.Fatalf("hashed %q (%q, %q, %q) parsed as %+v", host, ws, sb, svc, p)
		}
	}
	if readable < 1000 || hashed < 1000 {
		t.Fatalf("%d readable and %d hashed cases, want both", readable, hashed)
	}
}

func TestParseHostname(t *testing.T) {
	const domain = "apps.example.com"
	long := strings.Repeat("a", 19)
	tests := []struct {
		host    string
		want    HostParts
		wantErr error // nil = success
	}{
		{"team--demo--web.apps.example.com", HostParts{"team", "demo", "web", false}, nil},
		{"team--demo.apps.example.com", HostParts{"team", "demo", "", false}, nil},
		{"t--d--s.apps.example.com", HostParts{"t", "d", "s", false}, nil},
		{"team-1--demo-2--web-3.apps.example.com", HostParts{"team-1", "demo-2", "web-3", false}, nil},
		{long + "--" + long + "--" + long + ".apps.example.com", HostParts{long, long, long, false}, nil},
		// A readable label of exactly 63 characters, with a UUID sandbox.
		{"team--" + exampleSandbox + "--jupyter-lab-noteboo.apps.example.com", HostParts{"team", exampleSandbox, "jupyter-lab-noteboo", false}, nil},
		{long + "a--demo.apps.example.com", HostParts{long + "a", "demo", "", false}, nil},
		// Hashed labels.
		{exampleLabel + ".apps.example.com", HostParts{Hashed: true}, nil},
		{"h-" + strings.Repeat("a", 52) + ".apps.example.com", HostParts{Hashed: true}, nil},
		{"h-" + strings.Repeat("7", 51) + "q.apps.example.com", HostParts{Hashed: true}, nil},
		{"h-" + strings.Repeat("a", 51) + "b.apps.example.com", HostParts{}, ErrHostParts}, // not a 256-bit digest
		{"h-" + strings.Repeat("a", 51) + ".apps.example.com", HostParts{}, ErrHostParts},  // too short
		{"h-" + strings.Repeat("a", 53) + ".apps.example.com", HostParts{}, ErrHostParts},  // too long
		{"h-" + strings.Repeat("1", 51) + "a.apps.example.com", HostParts{}, ErrHostParts}, // not base32
		{"x-" + strings.Repeat("a", 52) + ".apps.example.com", HostParts{}, ErrHostParts},  // other prefix
		// A readable label may start like a hashed one: it contains "--".
		{"h-" + strings.Repeat("a", 52) + "--b.apps.example.com", HostParts{"h-" + strings.Repeat("a", 52), "b", "", false}, nil},

		// Other domains.
		{"team--demo.apps.example.com.evil.com", HostParts{}, ErrOtherDomain},
		{"team--demo.example.com", HostParts{}, ErrOtherDomain},
		{"team--demo.xapps.example.com", HostParts{}, ErrOtherDomain},
		{"team--demoapps.example.com", HostParts{}, ErrOtherDomain},
		{"apps.example.com", HostParts{}, ErrOtherDomain},
		{".apps.example.com", HostParts{}, ErrOtherDomain},
		{"", HostParts{}, ErrOtherDomain},
		{"evil.com", HostParts{}, ErrOtherDomain},
		// Extra labels before the domain.
		{"a.b--c--d.apps.example.com", HostParts{}, ErrOtherDomain},
		{"team--demo.x.apps.example.com", HostParts{}, ErrOtherDomain},
		// Not normalized: the caller must normalize first.
		{"team--demo.apps.example.com.", HostParts{}, ErrOtherDomain},
		{"team--demo.apps.example.com:443", HostParts{}, ErrOtherDomain},
		{"team--demo.APPS.example.com", HostParts{}, ErrOtherDomain},
		// Wrong number of parts.
		{"team.apps.example.com", HostParts{}, ErrHostParts},
		{"a--b--c--d.apps.example.com", HostParts{}, ErrHostParts},
		{"a--b--c--d--e.apps.example.com", HostParts{}, ErrHostParts},
		{"team------web.apps.example.com", HostParts{}, ErrHostParts}, // team, "", "", web
		{"team----web.apps.example.com", HostParts{}, ErrHostName},    // team, "" (empty sandbox), web
		{strings.Repeat("a", 64) + "--b.apps.example.com", HostParts{}, ErrHostParts},
		// Invalid names.
		{"team--demo--.apps.example.com", HostParts{}, ErrHostName},
		{"--demo.apps.example.com", HostParts{}, ErrHostName},
		{"team--.apps.example.com", HostParts{}, ErrHostName},
		{"team---demo.apps.example.com", HostParts{}, ErrHostName},
		{"team--demo---web.apps.example.com", HostParts{}, ErrHostName},
		{"team--demo--web-.apps.example.com", HostParts{}, ErrHostName},
		{"-team--demo.apps.example.com", HostParts{}, ErrHostName},
		{"Team--demo.apps.example.com", HostParts{}, ErrHostName},
		{"te_am--demo.apps.example.com", HostParts{}, ErrHostName},
		{"t\xc3\xabam--demo.apps.example.com", HostParts{}, ErrHostName},
		{"team--" + exampleSandbox + "--jupyter-lab-notebook.apps.example.com", HostParts{}, ErrHostParts}, // 64
	}
	for _, tt := range tests {
		got, err := ParseHostname(tt.host, domain)
		if tt.wantErr == nil {
			if err != nil || got != tt.want {
				t.Errorf("ParseHostname(%q) = %+v, %v; want %+v", tt.host, got, err, tt.want)
				continue
			}
			if got.Hashed {
				continue
			}
			if back := Hostname(got.Workspace, got.Sandbox, got.Service, domain); back != tt.host {
				t.Errorf("Hostname(ParseHostname(%q)) = %q", tt.host, back)
			}
			continue
		}
		if !errors.Is(err, tt.wantErr) {
			t.Errorf("ParseHostname(%q) error = %v, want %v", tt.host, err, tt.wantErr)
		}
		if got != (HostParts{}) {
			t.Errorf("ParseHostname(%q) = %+v with an error, want zero parts", tt.host, got)
		}
	}
}

func TestParseHostnameNormalized(t *testing.T) {
	// Upper case, a trailing dot and a port are accepted once normalized.
	for _, in := range []string{
		"TEAM--Demo--Web.Apps.Example.Com",
		"team--demo--web.apps.example.com.",
		"team--demo--web.apps.example.com:8443",
		"Team--Demo--Web.apps.example.com.:443",
	} {
		host, ok := NormalizeHost(in)
		if !ok {
			t.Errorf("NormalizeHost(%q) failed", in)
			continue
		}
		got, err := ParseHostname(host, "apps.example.com")
		if err != nil || got != (HostParts{"team", "demo", "web", false}) {
			t.Errorf("ParseHostname(NormalizeHost(%q)) = %+v, %v", in, got, err)
		}
	}
}

func TestParseHostnameAllocs(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = ParseHostname("team--demo--web.apps.example.com", "apps.example.com")
	})
	if allocs != 0 {
		t.Errorf("ParseHostname allocates %v times, want 0", allocs)
	}
}

func BenchmarkNormalizeHost(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		NormalizeHost("team--demo--web.apps.example.com:8443")
	}
}

// matchHost is the normalized hostname TestHostMatches matches against.
const matchHost = "team--demo--web.apps.test"

// TestHostMatches: the Host header (or absolute-form authority) check that
// dispatch applies to every request, HTTP/1.1 and HTTP/2.
func TestHostMatches(t *testing.T) {
	tests := []struct {
		host string
		want bool
	}{
		{matchHost, true},
		{"TEAM--DEMO--WEB.APPS.TEST", true},
		{"Team--Demo--Web.Apps.Test", true},
		{matchHost + ".", true},
		{matchHost + ":443", true},
		{matchHost + ":8443", true},
		{matchHost + ":1", true},
		{matchHost + ".:443", true},
		{strings.ToUpper(matchHost) + ".:65535", true},
		{matchHost + "..", false},
		{matchHost + ":abc", false},
		{matchHost + ":", false},
		{matchHost + ":123456", false},
		{matchHost + ":-1", false},
		{matchHost + ": 443", false},
		{matchHost + ":443:443", false},
		{matchHost + ":+443", false},
		{matchHost + " ", false},
		{" " + matchHost, false},
		{"[::1]", false},
		{"[::1]:443", false},
		{"[" + matchHost + "]", false},
		{"[" + matchHost + "]:443", false},
		{"::1", false},
		{"", false},
		{".", false},
		{":443", false},
		{".:443", false},
		{"other--demo--web.apps.test", false},
		{"team--demo.apps.test", false},
		{"team--demo--web.apps.test.evil", false},
		{"team--demo--web.apps.test.evil:443", false},
		{"xteam--demo--web.apps.test", false},
		{"team--demo--web.apps.tes", false},
		{"eam--demo--web.apps.test", false},
		{"team--demo--web.apps.test\x00", false},
		{"team--demo--web.apps.test/", false},
		{"team--demo--web.apps.test@evil", false},
		{"evil@team--demo--web.apps.test", false},
		{"team--demo--web\xc0apps.test", false},
	}
	for _, tc := range tests {
		if got := HostMatches([]byte(tc.host), matchHost); got != tc.want {
			t.Errorf("HostMatches(%q, %q) = %v; want %v", tc.host, matchHost, got, tc.want)
		}
	}
	// The SNI given is already normalized; an empty SNI never matches.
	if HostMatches([]byte(""), "") || HostMatches([]byte(":443"), "") || HostMatches([]byte("."), "") {
		t.Error("an empty host matched an empty SNI")
	}
}

func TestHostMatchesAllocs(t *testing.T) {
	hosts := [][]byte{[]byte(matchHost), []byte("TEAM--DEMO--WEB.APPS.TEST.:8443"), []byte("evil.test"), []byte("[::1]:1")}
	allocs := testing.AllocsPerRun(1000, func() {
		for _, h := range hosts {
			HostMatches(h, matchHost)
		}
	})
	if allocs != 0 {
		t.Errorf("hostMatches allocates %.1f times per run; want 0", allocs)
	}
}
