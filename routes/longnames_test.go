package routes

import (
	"strings"
	"testing"
)

// A UUID sandbox whose readable label does not fit is installed under its
// hashed hostname; the route keeps the readable names; the readable (too
// long) hostname is not a route. Its other services stay readable.
func TestTableLongNames(t *testing.T) {
	tbl, _ := newTB(t)
	spec := InstanceSpec{
		Workspace: "team", Sandbox: exampleSandbox, Generation: "1",
		Services: []ServiceSpec{{Name: exampleService, Port: 8888}, {Name: "web", Port: 8080}, {Name: "", Port: 3000}},
	}
	res := tbApply(t, tbl, "r1", append(tbBase(), spec))
	if res.Installed != len(tbAllHosts)+3 {
		t.Fatalf("Apply = %+v", res)
	}
	hashed := exampleLabel + "." + tbDomain
	r := tbl.Lookup(hashed)
	if r == nil {
		t.Fatalf("Lookup(%q) = nil", hashed)
	}
	if r.Host != hashed || r.Workspace != "team" || r.Sandbox != exampleSandbox || r.Service != exampleService || r.Port != 8888 {
		t.Fatalf("route %+v", r)
	}
	readable := "team--" + exampleSandbox + "--" + exampleService + "." + tbDomain
	if r := tbl.Lookup(readable); r != nil {
		t.Fatalf("Lookup(%q) = %s, want nil (the readable label is too long)", readable, r.Host)
	}
	for host, port := range map[string]int{
		"team--" + exampleSandbox + "--web." + tbDomain: 8080,
		"team--" + exampleSandbox + "." + tbDomain:      3000,
	} {
		if r := tbl.Lookup(host); r == nil || r.Port != port {
			t.Fatalf("Lookup(%q) = %v, want port %d", host, r, port)
		}
	}
	// Upper-case SNI or Host normalizes onto the hashed name.
	if n, ok := NormalizeHost(strings.ToUpper(hashed) + ".:8443"); !ok || tbl.Lookup(n) != r {
		t.Fatalf("normalized upper-case hashed host %q did not find the route", n)
	}
	// The SNI lookup of a hashed name does not allocate either.
	if allocs := testing.AllocsPerRun(1000, func() {
		h, _ := NormalizeHost(hashed)
		if tbl.Lookup(h) == nil {
			panic("lost route")
		}
	}); allocs != 0 {
		t.Errorf("NormalizeHost+Lookup of a hashed name allocates %v times", allocs)
	}
	// Withdrawing the instance withdraws the hashed route.
	tbApply(t, tbl, "r2", tbBase())
	if r := tbl.Lookup(hashed); r != nil {
		t.Fatalf("Lookup(%q) after withdrawal = %s", hashed, r.Host)
	}
}

// Hostname allocates only its result, for readable and hashed labels.
func TestHostnameAllocs(t *testing.T) {
	for _, in := range [][3]string{
		{"team", "demo", "web"},
		{"team", exampleSandbox, exampleService},
		{strings.Repeat("w", 63), strings.Repeat("s", 63), strings.Repeat("v", 63)},
	} {
		if n := testing.AllocsPerRun(100, func() { Hostname(in[0], in[1], in[2], tbDomain) }); n != 1 {
			t.Errorf("Hostname(%d, %d, %d characters) allocates %v times, want 1", len(in[0]), len(in[1]), len(in[2]), n)
		}
	}
}

// BenchmarkHostname: building a readable and a hashed hostname (done for
// every service at every Apply; never on the lookup path).
func BenchmarkHostname(b *testing.B) {
	b.Run("readable", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Hostname("team", exampleSandbox, "web", tbDomain)
		}
	})
	b.Run("hashed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Hostname("team", exampleSandbox, exampleService, tbDomain)
		}
	})
}
