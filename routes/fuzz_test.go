package routes

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{
		"team--demo--web.apps.example.com",
		"team--demo--web.apps.example.com:8443",
		"team--demo--web.apps.example.com.",
		"Team--Demo.Apps.Example.Com.:443",
		"[::1]:8443",
		"[FE80::1]",
		"", ".", "..", ":", ":80", "a..", "a:b:80", "a:123456", "[]", "[::1]x",
		"tëam.example.com", "a b", "a\x00b", "\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, ok := NormalizeHost(in)
		if !ok {
			if out != "" {
				t.Fatalf("NormalizeHost(%q) = %q with ok=false", in, out)
			}
			return
		}
		if out == "" {
			t.Fatalf("NormalizeHost(%q) = \"\", true", in)
		}
		if again, ok := NormalizeHost(out); !ok || again != out {
			t.Fatalf("NormalizeHost(%q) = %q, but NormalizeHost(%q) = %q, %v", in, out, out, again, ok)
		}
		if out != strings.ToLower(out) {
			t.Fatalf("NormalizeHost(%q) = %q contains upper case", in, out)
		}
		if strings.HasSuffix(out, ".") {
			t.Fatalf("NormalizeHost(%q) = %q ends with a dot", in, out)
		}
		for i := 0; i < len(out); i++ {
			if c := out[i]; c <= ' ' || c >= 0x7f {
				t.Fatalf("NormalizeHost(%q) = %q contains byte 0x%02x", in, out, c)
			}
		}
		if strings.HasPrefix(out, "[") {
			if strings.IndexByte(out, ']') != len(out)-1 {
				t.Fatalf("NormalizeHost(%q) = %q: text after the IPv6 literal", in, out)
			}
		} else if strings.Contains(out, ":") {
			t.Fatalf("NormalizeHost(%q) = %q contains a port", in, out)
		}
		if !strings.HasPrefix(strings.ToLower(in), out) {
			t.Fatalf("NormalizeHost(%q) = %q is not a prefix of the lower-cased input", in, out)
		}
	})
}

func FuzzParseHostname(f *testing.F) {
	for _, s := range [][2]string{
		{"team--demo--web.apps.example.com", "apps.example.com"},
		{"team--demo.apps.example.com", "apps.example.com"},
		{"team--demo.apps.example.com.evil.com", "apps.example.com"},
		{"team--demo.example.com", "apps.example.com"},
		{"a.b--c--d.apps.example.com", "apps.example.com"},
		{"team----web.apps.example.com", "apps.example.com"},
		{"a--b--c--d.apps.example.com", "apps.example.com"},
		{"team--demo.", ""},
		{"", ""},
		{"x", "x"},
		{".x", "x"},
		{"h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq.apps.example.com", "apps.example.com"},
		{"h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgb.apps.example.com", "apps.example.com"},
		{"h-hvma5opumihpylo5tjmqpngfhtjz2hpvz23cxmap4z6s7jjnepgq--x.apps.example.com", "apps.example.com"},
		{"team--0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1--jupyter-lab-notebook.apps.example.com", "apps.example.com"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, host, domain string) {
		p, err := ParseHostname(host, domain)
		if err != nil {
			if p != (HostParts{}) {
				t.Fatalf("ParseHostname(%q, %q) = %+v with error %v", host, domain, p, err)
			}
			return
		}
		label := host[:len(host)-len(domain)-1]
		if p.Hashed {
			// A hashed label names nothing and is never readable.
			if p != (HostParts{Hashed: true}) || !IsHashedLabel(label) || strings.Contains(label, "--") {
				t.Fatalf("ParseHostname(%q, %q) = %+v", host, domain, p)
			}
			return
		}
		if IsHashedLabel(label) {
			t.Fatalf("ParseHostname(%q, %q) = %+v, but the label has the hashed form", host, domain, p)
		}
		if back := Hostname(p.Workspace, p.Sandbox, p.Service, domain); back != host {
			t.Fatalf("ParseHostname(%q, %q) = %+v, but Hostname gives %q", host, domain, p, back)
		}
		for _, n := range []string{p.Workspace, p.Sandbox} {
			if err := ValidName(n); err != nil {
				t.Fatalf("ParseHostname(%q, %q) = %+v: %v", host, domain, p, err)
			}
		}
		if p.Service != "" {
			if err := ValidName(p.Service); err != nil {
				t.Fatalf("ParseHostname(%q, %q) = %+v: %v", host, domain, p, err)
			}
		}
	})
}

// FuzzLabel: for valid names, the hostname is a valid DNS name whose label
// is readable exactly when the readable form fits in 63 characters, parses
// back to the names (readable) or as hashed, and is hashed from the names.
func FuzzLabel(f *testing.F) {
	for _, s := range [][3]string{
		{"team", "demo", "web"},
		{"team", "demo", ""},
		{"team", "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1", "jupyter-lab-notebook"},
		{"team", "0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1", "jupyter-lab-noteboo"},
		{strings.Repeat("w", 63), strings.Repeat("s", 63), strings.Repeat("v", 63)},
		{"h-a", "b", ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	const domain = "apps.example.com"
	f.Fuzz(func(t *testing.T, ws, sb, svc string) {
		if ValidName(ws) != nil || ValidName(sb) != nil || (svc != "" && ValidName(svc) != nil) {
			return
		}
		host := Hostname(ws, sb, svc, domain)
		label := Label(ws, sb, svc)
		if host != label+"."+domain {
			t.Fatalf("Hostname = %q, Label = %q", host, label)
		}
		if err := ValidDomain(host); err != nil {
			t.Fatalf("Hostname(%q, %q, %q) = %q: %v", ws, sb, svc, host, err)
		}
		p, err := ParseHostname(host, domain)
		if err != nil {
			t.Fatalf("ParseHostname(Hostname(%q, %q, %q) = %q): %v", ws, sb, svc, host, err)
		}
		readable := len(ws)+2+len(sb)+len(svc)+2*min(len(svc), 1) <= 63
		switch {
		case readable && p != (HostParts{ws, sb, svc, false}):
			t.Fatalf("readable %q parsed as %+v", host, p)
		case !readable && (!p.Hashed || label != HashedLabel(ws, sb, svc)):
			t.Fatalf("hashed %q parsed as %+v", host, p)
		}
	})
}

func FuzzParseDocument(f *testing.F) {
	for _, s := range []string{
		docGood,
		`{"revision":"r","instances":[]}`,
		`{"instances":[5,null,"x",[],{}]}`,
		string(docWith(docEntry("demo", nil), docEntry("demo", nil))),
		string(docWith(docEntry("demo", map[string]string{"extra": "1"}))),
		string(docWith(docEntry("demo", map[string]string{"connector": `{"type":"tcp","host":"localhost"}`}))),
		string(docWith(docEntry("demo", map[string]string{"connector": `{"type":"tcp","host":"0:0::1"}`}))),
		string(docWith(docEntry("demo", map[string]string{"connector": `{"type":"unix","path":"/run/{port}.sock"}`}))),
		string(docWith(docEntry("demo", map[string]string{"connector": `{"type":"netns","path":"/run/netns/x"}`}))),
		string(docWith(docEntry("demo", map[string]string{"connector": `{}`, "limits": `{"Max_Streams":1}`}))),
		string(docWith(docEntry("demo", map[string]string{"services": `[{"name":"web","port":8080,"port":1}]`}))),
		string(docWith(docEntry("demo", map[string]string{"services": `[{"port":"8080"}]`}))),
		string(docWith(docEntry("demo", map[string]string{"services": `[{"port":80,"access":{"mode":"public","generation":2,"login_url":"https://l.example.com/","cors_origins":["https://a.example.com"],"bearer":true,"embed":true}}]`}))),
		string(docWith(docEntry("demo", map[string]string{"services": `[{"port":80,"access":{"mode":"token"}}]`}))),
		string(docWith(docEntry("demo", map[string]string{"services": `[{"port":80,"access":{"mode":"public","cors_origins":["HTTPS://A.example.com:443/"]}}]`}))),
		`{"revision":"r","instances":[]}x`,
		`{"revision":"r","instances":[],"x":1}`,
		`{"instances":{}}`,
		`[`,
		"{\"revision\":\"\xff\",\"instances\":[]}",
		`{"revision":"\`,
		`{"instances":["\`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		data = data[:len(data):len(data)] // no spare capacity to read past the end into
		doc, err := ParseDocument(data)
		if err != nil {
			if doc != nil {
				t.Fatalf("document and error %v", err)
			}
			// The incremental validation must agree with json.Valid: a
			// valid document is never refused as invalid JSON.
			if json.Valid(data) && len(data) <= MaxDocumentBytes && utf8.Valid(data) && strings.HasPrefix(err.Error(), "document: invalid JSON") {
				t.Fatalf("valid JSON refused: %v", err)
			}
			if !json.Valid(data) && !strings.Contains(err.Error(), "document: ") {
				t.Fatalf("invalid JSON refused with a strange error: %v", err)
			}
			return
		}
		// Count the entries independently.
		var top struct {
			Instances []json.RawMessage `json:"instances"`
		}
		if err := json.Unmarshal(data, &top); err != nil {
			t.Fatalf("ParseDocument accepted what encoding/json refuses: %v", err)
		}
		if n := len(doc.Instances) + len(doc.Rejected); n != len(top.Instances) {
			t.Fatalf("%d accepted + %d rejected, but %d entries", len(doc.Instances), len(doc.Rejected), len(top.Instances))
		}
		seen := map[InstanceKey]bool{}
		for _, r := range doc.Rejected {
			if r.Index < 0 || r.Index >= len(top.Instances) || r.Reason == "" || strings.ContainsAny(r.Reason, "\r\n") {
				t.Fatalf("bad rejection %+v", r)
			}
		}
		for i := range doc.Instances {
			spec := doc.Instances[i]
			if seen[spec.Key()] {
				t.Fatalf("instance %v accepted twice", spec.Key())
			}
			seen[spec.Key()] = true
			one, err := json.Marshal(map[string]any{"revision": "x", "instances": []InstanceSpec{spec}})
			if err != nil {
				t.Fatal(err)
			}
			again, err := ParseDocument(one)
			if err != nil {
				t.Fatalf("re-parse of %s: %v", one, err)
			}
			if len(again.Instances) != 1 || len(again.Rejected) != 0 {
				t.Fatalf("re-parse of %s: %+v", one, again)
			}
			if !reflect.DeepEqual(again.Instances[0], spec) {
				t.Fatalf("re-parse of %s = %+v, want %+v", one, again.Instances[0], spec)
			}
		}
	})
}
