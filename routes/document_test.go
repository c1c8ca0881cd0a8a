package routes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

const docGood = `{
  "revision": "r42",
  "instances": [
    {
      "workspace": "team",
      "sandbox": "demo",
      "generation": "3",
      "connector": {"type": "tcp", "host": "127.0.0.1"},
      "limits": {"max_streams": 256},
      "services": [
        {"name": "web", "port": 8080, "revision": 7},
        {"name": "",    "port": 3000, "revision": 2}
      ]
    },
    {
      "workspace": "team",
      "sandbox": "other",
      "generation": "",
      "connector": {"type": "netns", "path": "/run/netns/sbx-other"},
      "services": [{"name": "api", "port": 9000, "revision": 0}]
    },
    {
      "workspace": "ops",
      "sandbox": "demo",
      "generation": "2024-05-01T10:00:00Z",
      "connector": {"type": "unix", "path": "/run/sbx/demo/{port}.sock"},
      "limits": {},
      "services": [{"name": "", "port": 80}]
    }
  ]
}`

func TestParseDocumentGood(t *testing.T) {
	doc, err := ParseDocument([]byte(docGood))
	if err != nil {
		t.Fatalf("ParseDocument: %v", err)
	}
	want := &Document{
		Revision: "r42",
		Instances: []InstanceSpec{
			{
				Workspace:  "team",
				Sandbox:    "demo",
				Generation: "3",
				Connector:  ConnectorSpec{Type: "tcp", Host: "127.0.0.1"},
				Limits:     Limits{MaxStreams: 256},
				Services: []ServiceSpec{
					{Name: "web", Port: 8080, Revision: 7},
					{Name: "", Port: 3000, Revision: 2},
				},
			},
			{
				Workspace: "team",
				Sandbox:   "other",
				Connector: ConnectorSpec{Type: "netns", Path: "/run/netns/sbx-other"},
				Services:  []ServiceSpec{{Name: "api", Port: 9000}},
			},
			{
				Workspace:  "ops",
				Sandbox:    "demo",
				Generation: "2024-05-01T10:00:00Z",
				Connector:  ConnectorSpec{Type: "unix", Path: "/run/sbx/demo/{port}.sock"},
				Services:   []ServiceSpec{{Port: 80}},
			},
		},
	}
	if !reflect.DeepEqual(doc, want) {
		t.Fatalf("ParseDocument =\n%+v\nwant\n%+v", doc, want)
	}
	if k := doc.Instances[0].Key(); k != (InstanceKey{"team", "demo"}) || k.String() != "team/demo" {
		t.Errorf("Key() = %v (%q)", k, k.String())
	}

	// Round trip: marshal the accepted instances and parse them again.
	again, err := json.Marshal(map[string]any{"revision": doc.Revision, "instances": doc.Instances})
	if err != nil {
		t.Fatal(err)
	}
	doc2, err := ParseDocument(again)
	if err != nil {
		t.Fatalf("ParseDocument(round trip): %v\n%s", err, again)
	}
	if !reflect.DeepEqual(doc2, doc) {
		t.Fatalf("round trip =\n%+v\nwant\n%+v", doc2, doc)
	}
}

// docWith returns a document whose instances are the given entries.
func docWith(entries ...string) []byte {
	return []byte(`{"revision":"r1","instances":[` + strings.Join(entries, ",") + `]}`)
}

// docEntry returns an instance entry for team/<sandbox> with the given extra
// fields; fields overrides the defaults by name.
func docEntry(sandbox string, fields map[string]string) string {
	f := map[string]string{
		"workspace":  `"team"`,
		"sandbox":    fmt.Sprintf("%q", sandbox),
		"generation": `"1"`,
		"connector":  `{"type":"tcp","host":"127.0.0.1"}`,
		"limits":     `{"max_streams":10}`,
		"services":   `[{"name":"web","port":8080,"revision":1}]`,
	}
	for k, v := range fields {
		if v == "" {
			delete(f, k)
		} else {
			f[k] = v
		}
	}
	var b strings.Builder
	b.WriteByte('{')
	first := true
	for _, k := range []string{"workspace", "sandbox", "generation", "connector", "limits", "services"} {
		v, ok := f[k]
		if !ok {
			continue
		}
		delete(f, k)
		if !first {
			b.WriteByte(',')
		}
		first = false
		fmt.Fprintf(&b, "%q:%s", k, v)
	}
	for k, v := range f { // extra fields
		if !first {
			b.WriteByte(',')
		}
		first = false
		fmt.Fprintf(&b, "%q:%s", k, v)
	}
	b.WriteByte('}')
	return b.String()
}

func TestParseDocumentErrors(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr string
	}{
		{"empty input", ``, "unexpected end"},
		{"whitespace only", "  \n", "unexpected end"},
		{"null", `null`, "must be a JSON object"},
		{"array", `[]`, "must be a JSON object"},
		{"string", `"x"`, "must be a JSON object"},
		{"unknown top-level field", `{"revision":"r","instances":[],"extra":1}`, `unknown field "extra"`},
		{"top-level field case", `{"revision":"r","Instances":[]}`, `unknown field "Instances"`},
		{"duplicate instances", `{"instances":[],"instances":[]}`, `duplicate field "instances"`},
		{"duplicate revision", `{"revision":"a","revision":"b","instances":[]}`, `duplicate field "revision"`},
		{"instances missing", `{"revision":"r"}`, `"instances" is missing`},
		{"instances null", `{"revision":"r","instances":null}`, `"instances" must be an array`},
		{"instances object", `{"revision":"r","instances":{}}`, `"instances" must be an array`},
		{"instances string", `{"revision":"r","instances":"[]"}`, `"instances" must be an array`},
		{"revision number", `{"revision":42,"instances":[]}`, `"revision" must be a string`},
		{"revision null", `{"revision":null,"instances":[]}`, `"revision" must be a string`},
		{"trailing garbage", `{"revision":"r","instances":[]}x`, "data after the top-level object"},
		{"second document", `{"revision":"r","instances":[]} {"revision":"s","instances":[]}`, "data after the top-level object"},
		{"trailing bracket", `{"revision":"r","instances":[]}}`, "data after the top-level object"},
		{"truncated", `{"revision":"r","instances":[`, "unexpected end"},
		{"truncated entry", `{"revision":"r","instances":[{"workspace":"team"`, "unexpected end"},
		{"missing brace", `{"revision":"r","instances":[]`, "unexpected end"},
		{"invalid JSON", `{"revision":"r","instances":[},]}`, "invalid character"},
		{"single quotes", `{'revision':'r','instances':[]}`, "invalid character"},
		{"trailing comma", `{"revision":"r","instances":[],}`, "invalid character"},
		{"invalid UTF-8", "{\"revision\":\"r\xff\",\"instances\":[]}", "not valid UTF-8"},
		{"invalid UTF-8 in entry", "{\"revision\":\"r\",\"instances\":[{\"workspace\":\"\xc3\"}]}", "not valid UTF-8"},
		{"comment", "{\"revision\":\"r\", // c\n\"instances\":[]}", "invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, err := ParseDocument([]byte(tt.doc))
			if err == nil {
				t.Fatalf("ParseDocument(%q) = %+v, want an error", tt.doc, doc)
			}
			if doc != nil {
				t.Errorf("ParseDocument returned a document with an error")
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %q, want it to contain %q", err, tt.wantErr)
			}
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Errorf("error %q is not one line", err)
			}
		})
	}
}

func TestParseDocumentOversized(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"revision":"`)
	b.WriteString(strings.Repeat("a", MaxDocumentBytes))
	b.WriteString(`","instances":[]}`)
	if _, err := ParseDocument(b.Bytes()); err == nil || !strings.Contains(err.Error(), "larger than the limit") {
		t.Fatalf("oversized document: error = %v", err)
	}

	// Exactly at the limit is accepted.
	prefix, suffix := `{"revision":"`, `","instances":[]}`
	at := []byte(prefix + strings.Repeat("a", MaxDocumentBytes-len(prefix)-len(suffix)) + suffix)
	if len(at) != MaxDocumentBytes {
		t.Fatalf("test document is %d bytes", len(at))
	}
	if _, err := ParseDocument(at); err != nil {
		t.Fatalf("document of exactly MaxDocumentBytes: %v", err)
	}
}

func TestParseDocumentEmpty(t *testing.T) {
	for _, in := range []string{
		`{"revision":"r7","instances":[]}`,
		` { "instances" : [ ] , "revision" : "r7" } ` + "\n",
	} {
		doc, err := ParseDocument([]byte(in))
		if err != nil {
			t.Fatalf("ParseDocument(%q): %v", in, err)
		}
		if doc.Revision != "r7" || len(doc.Instances) != 0 || len(doc.Rejected) != 0 {
			t.Errorf("ParseDocument(%q) = %+v", in, doc)
		}
	}
	doc, err := ParseDocument([]byte(`{"instances":[]}`))
	if err != nil || doc.Revision != "" {
		t.Errorf("document without revision = %+v, %v; want revision \"\"", doc, err)
	}
}

func TestParseDocumentInstances(t *testing.T) {
	tests := []struct {
		name       string
		fields     map[string]string // changes to the good entry; "" deletes
		wantReason string            // "" = accepted
		check      func(t *testing.T, s InstanceSpec)
	}{
		{name: "good"},

		// Unknown, duplicate and non-lower-case fields.
		{name: "unknown field", fields: map[string]string{"extra": `1`}, wantReason: `extra: unknown field`},
		{name: "unknown field in connector", fields: map[string]string{"connector": `{"type":"tcp","host":"127.0.0.1","port":1}`}, wantReason: `connector.port: unknown field`},
		{name: "unknown field in limits", fields: map[string]string{"limits": `{"max_stream":10}`}, wantReason: `limits.max_stream: unknown field`},
		{name: "unknown field in service", fields: map[string]string{"services": `[{"name":"web","port":8080,"host":"x"}]`}, wantReason: `services[0].host: unknown field`},
		{name: "field name case", fields: map[string]string{"limits": `{"Max_Streams":10}`}, wantReason: `field name "Max_Streams" not allowed`},
		{name: "field name unicode fold", fields: map[string]string{"limits": `{"max_ſtreams":10}`}, wantReason: `not allowed`},
		{name: "field name escaped", fields: map[string]string{"limits": `{"max_stream\u0073":10}`}, wantReason: `not allowed`},
		{name: "duplicate field in limits", fields: map[string]string{"limits": `{"max_streams":10,"max_streams":0}`}, wantReason: `duplicate field "max_streams"`},
		{name: "duplicate field in service", fields: map[string]string{"services": `[{"name":"web","port":8080,"port":8081}]`}, wantReason: `duplicate field "port"`},

		// Names.
		{name: "workspace missing", fields: map[string]string{"workspace": ""}, wantReason: "workspace: name is empty"},
		{name: "workspace upper case", fields: map[string]string{"workspace": `"Team"`}, wantReason: `workspace: name "Team": character 'T' not allowed`},
		{name: "workspace with --", fields: map[string]string{"workspace": `"a--b"`}, wantReason: `workspace: name "a--b": must not contain "--"`},
		{name: "workspace too long", fields: map[string]string{"workspace": `"` + strings.Repeat("w", 64) + `"`}, wantReason: "longer than 63"},
		{name: "sandbox too long", fields: map[string]string{"sandbox": `"` + strings.Repeat("s", 64) + `"`}, wantReason: "sandbox: name"},
		{name: "service too long", fields: map[string]string{"services": `[{"name":"` + strings.Repeat("v", 64) + `","port":80}]`}, wantReason: "longer than 63"},
		{name: "uuid sandbox", fields: map[string]string{"sandbox": `"0b5cbd64-4f9e-4a59-9d65-0c4d8ad3a4e1"`}},
		{name: "workspace number", fields: map[string]string{"workspace": `5`}, wantReason: "workspace: must be a string, not a number"},
		{name: "sandbox trailing hyphen", fields: map[string]string{"sandbox": `"demo-"`}, wantReason: "sandbox: name"},

		// Generation.
		{name: "generation empty", fields: map[string]string{"generation": `""`}},
		{name: "generation missing", fields: map[string]string{"generation": ""}},
		{name: "generation 64", fields: map[string]string{"generation": `"` + strings.Repeat("g", 64) + `"`}},
		{name: "generation 65", fields: map[string]string{"generation": `"` + strings.Repeat("g", 65) + `"`}, wantReason: "generation: longer than 64"},
		{name: "generation space", fields: map[string]string{"generation": `"a b"`}, wantReason: "generation: byte 0x20 not allowed"},
		{name: "generation unicode", fields: map[string]string{"generation": `"é"`}, wantReason: "generation: byte 0xc3"},
		{name: "generation number", fields: map[string]string{"generation": `3`}, wantReason: "generation: must be a string, not a number"},

		// Connector.
		{name: "connector missing", fields: map[string]string{"connector": ""}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "127.0.0.1"})},
		{name: "connector empty", fields: map[string]string{"connector": `{}`}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "127.0.0.1"})},
		{name: "connector null", fields: map[string]string{"connector": `null`}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "127.0.0.1"})},
		{name: "tcp without host", fields: map[string]string{"connector": `{"type":"tcp"}`}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "127.0.0.1"})},
		{name: "tcp localhost", fields: map[string]string{"connector": `{"type":"tcp","host":"localhost"}`}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "127.0.0.1"})},
		{name: "tcp 127.1.2.3", fields: map[string]string{"connector": `{"type":"tcp","host":"127.1.2.3"}`}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "127.1.2.3"})},
		{name: "tcp ::1", fields: map[string]string{"connector": `{"type":"tcp","host":"::1"}`}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "::1"})},
		{name: "tcp ::1 long form", fields: map[string]string{"connector": `{"type":"tcp","host":"0:0:0:0:0:0:0:1"}`}, check: docWantConnector(ConnectorSpec{Type: "tcp", Host: "::1"})},
		{name: "tcp 10.0.0.1", fields: map[string]string{"connector": `{"type":"tcp","host":"10.0.0.1"}`}, wantReason: `connector.host: tcp host "10.0.0.1" is not a loopback address`},
		{name: "tcp 0.0.0.0", fields: map[string]string{"connector": `{"type":"tcp","host":"0.0.0.0"}`}, wantReason: "not a loopback address"},
		{name: "tcp ::", fields: map[string]string{"connector": `{"type":"tcp","host":"::"}`}, wantReason: "not a loopback address"},
		{name: "tcp example.com", fields: map[string]string{"connector": `{"type":"tcp","host":"example.com"}`}, wantReason: `tcp host "example.com" is not an IP address or localhost`},
		{name: "tcp LOCALHOST", fields: map[string]string{"connector": `{"type":"tcp","host":"LOCALHOST"}`}, wantReason: "not an IP address or localhost"},
		{name: "tcp host with port", fields: map[string]string{"connector": `{"type":"tcp","host":"127.0.0.1:8080"}`}, wantReason: "not an IP address"},
		{name: "tcp bracketed", fields: map[string]string{"connector": `{"type":"tcp","host":"[::1]"}`}, wantReason: "not an IP address"},
		{name: "tcp zone", fields: map[string]string{"connector": `{"type":"tcp","host":"::1%lo"}`}, wantReason: "not an IP address"},
		{name: "tcp mapped", fields: map[string]string{"connector": `{"type":"tcp","host":"::ffff:127.0.0.1"}`}, wantReason: "not an IP address"},
		{name: "tcp with path", fields: map[string]string{"connector": `{"type":"tcp","path":"/x"}`}, wantReason: "tcp connector takes no path"},
		{name: "type missing with host", fields: map[string]string{"connector": `{"host":"127.0.0.1"}`}, wantReason: `"type" is missing`},
		{name: "type unknown", fields: map[string]string{"connector": `{"type":"udp"}`}, wantReason: `type "udp" not supported`},
		{name: "type upper case", fields: map[string]string{"connector": `{"type":"TCP"}`}, wantReason: `type "TCP" not supported`},
		{name: "netns", fields: map[string]string{"connector": `{"type":"netns","path":"/var/run/netns/x"}`}, check: docWantConnector(ConnectorSpec{Type: "netns", Path: "/var/run/netns/x"})},
		{name: "netns relative", fields: map[string]string{"connector": `{"type":"netns","path":"run/netns/x"}`}, wantReason: `netns path "run/netns/x" is not absolute`},
		{name: "netns unclean", fields: map[string]string{"connector": `{"type":"netns","path":"/run/netns/../x"}`}, wantReason: "is not clean"},
		{name: "netns trailing slash", fields: map[string]string{"connector": `{"type":"netns","path":"/run/netns/x/"}`}, wantReason: "is not clean"},
		{name: "netns no path", fields: map[string]string{"connector": `{"type":"netns"}`}, wantReason: "netns path is missing"},
		{name: "netns with host", fields: map[string]string{"connector": `{"type":"netns","host":"127.0.0.1","path":"/run/netns/x"}`}, wantReason: "netns connector takes no host"},
		{name: "netns control char", fields: map[string]string{"connector": `{"type":"netns","path":"/run/netns/x\u0000"}`}, wantReason: "control character"},
		{name: "unix", fields: map[string]string{"connector": `{"type":"unix","path":"/run/sbx/{port}.sock"}`}, check: docWantConnector(ConnectorSpec{Type: "unix", Path: "/run/sbx/{port}.sock"})},
		{name: "unix twice", fields: map[string]string{"connector": `{"type":"unix","path":"/run/{port}/{port}.sock"}`}},
		{name: "unix without {port}", fields: map[string]string{"connector": `{"type":"unix","path":"/run/sbx/app.sock"}`}, wantReason: `does not contain {port}`},
		{name: "unix {PORT}", fields: map[string]string{"connector": `{"type":"unix","path":"/run/sbx/{PORT}.sock"}`}, wantReason: `does not contain {port}`},
		{name: "unix relative", fields: map[string]string{"connector": `{"type":"unix","path":"sbx/{port}.sock"}`}, wantReason: "not absolute"},
		{name: "unix unclean", fields: map[string]string{"connector": `{"type":"unix","path":"/run//{port}.sock"}`}, wantReason: "not clean"},
		{name: "unix with host", fields: map[string]string{"connector": `{"type":"unix","host":"localhost","path":"/run/{port}.sock"}`}, wantReason: "unix connector takes no host"},
		{name: "unix longest path", fields: map[string]string{"connector": `{"type":"unix","path":"/` + strings.Repeat("a", 100) + `{port}.s"}`}}, // 108 bytes with a 5-digit port
		{name: "unix path too long", fields: map[string]string{"connector": `{"type":"unix","path":"/` + strings.Repeat("a", 101) + `{port}.s"}`}, wantReason: "too long"},
		{name: "connector string", fields: map[string]string{"connector": `"tcp"`}, wantReason: "connector: must be an object, not a string"},

		// Limits.
		{name: "limits missing", fields: map[string]string{"limits": ""}},
		{name: "max_streams 0", fields: map[string]string{"limits": `{"max_streams":0}`}},
		{name: "max_streams 1000000", fields: map[string]string{"limits": `{"max_streams":1000000}`}},
		{name: "max_streams 1000001", fields: map[string]string{"limits": `{"max_streams":1000001}`}, wantReason: "limits.max_streams: 1000001 out of range"},
		{name: "max_streams -1", fields: map[string]string{"limits": `{"max_streams":-1}`}, wantReason: "limits.max_streams: -1 out of range"},
		{name: "max_streams float", fields: map[string]string{"limits": `{"max_streams":1.5}`}, wantReason: "limits.max_streams: 1.5 is not a whole number"},
		{name: "max_streams string", fields: map[string]string{"limits": `{"max_streams":"10"}`}, wantReason: "limits.max_streams: must be a whole number, not a string"},
		{name: "weight 0", fields: map[string]string{"limits": `{"weight":0}`}},
		{name: "weight 1", fields: map[string]string{"limits": `{"weight":1}`}},
		{name: "weight 100", fields: map[string]string{"limits": `{"weight":100}`}},
		{name: "weight 101", fields: map[string]string{"limits": `{"weight":101}`}, wantReason: "limits.weight: 101 out of range 1..100"},
		{name: "weight -1", fields: map[string]string{"limits": `{"weight":-1}`}, wantReason: "limits.weight: -1 out of range 1..100"},
		{name: "weight float", fields: map[string]string{"limits": `{"weight":2.5}`}, wantReason: "limits.weight: 2.5 is not a whole number"},
		{name: "rates", fields: map[string]string{"limits": `{"requests_per_second":50,"requests_burst":10,"bytes_per_second":262144,"bytes_burst":65536}`}},
		{name: "rates without bursts", fields: map[string]string{"limits": `{"requests_per_second":1,"bytes_per_second":1024}`}},
		{name: "rates 0", fields: map[string]string{"limits": `{"requests_per_second":0,"requests_burst":0,"bytes_per_second":0,"bytes_burst":0}`}},
		{name: "rates largest", fields: map[string]string{"limits": `{"requests_per_second":1000000,"requests_burst":1000000,"bytes_per_second":1099511627776,"bytes_burst":1073741824}`}},
		{name: "requests_per_second too large", fields: map[string]string{"limits": `{"requests_per_second":1000001}`}, wantReason: "limits.requests_per_second: 1000001 out of range 0..1000000"},
		{name: "requests_per_second negative", fields: map[string]string{"limits": `{"requests_per_second":-1}`}, wantReason: "limits.requests_per_second: -1 out of range"},
		{name: "requests_per_second float", fields: map[string]string{"limits": `{"requests_per_second":0.5}`}, wantReason: "limits.requests_per_second: 0.5 is not a whole number"},
		{name: "requests_per_second string", fields: map[string]string{"limits": `{"requests_per_second":"5"}`}, wantReason: "limits.requests_per_second: must be a whole number, not a string"},
		{name: "requests_burst without rate", fields: map[string]string{"limits": `{"requests_burst":10}`}, wantReason: "limits.requests_burst: set without limits.requests_per_second"},
		{name: "requests_burst too large", fields: map[string]string{"limits": `{"requests_per_second":1,"requests_burst":1000001}`}, wantReason: "limits.requests_burst: 1000001 out of range 0..1000000"},
		{name: "requests_burst negative", fields: map[string]string{"limits": `{"requests_per_second":1,"requests_burst":-1}`}, wantReason: "limits.requests_burst: -1 out of range"},
		{name: "requests_burst float", fields: map[string]string{"limits": `{"requests_per_second":1,"requests_burst":2.5}`}, wantReason: "limits.requests_burst: 2.5 is not a whole number"},
		{name: "bytes_per_second too small", fields: map[string]string{"limits": `{"bytes_per_second":1023}`}, wantReason: "limits.bytes_per_second: 1023 out of range: 0 (unlimited) or 1024..1099511627776"},
		{name: "bytes_per_second too large", fields: map[string]string{"limits": `{"bytes_per_second":1099511627777}`}, wantReason: "limits.bytes_per_second: 1099511627777 out of range"},
		{name: "bytes_per_second negative", fields: map[string]string{"limits": `{"bytes_per_second":-1024}`}, wantReason: "limits.bytes_per_second: -1024 out of range"},
		{name: "bytes_per_second float", fields: map[string]string{"limits": `{"bytes_per_second":1e6}`}, wantReason: "limits.bytes_per_second: 1e6 is not a whole number"},
		{name: "bytes_per_second huge", fields: map[string]string{"limits": `{"bytes_per_second":99999999999999999999}`}, wantReason: "limits.bytes_per_second: 99999999999999999999 is not a whole number"},
		{name: "bytes_burst without rate", fields: map[string]string{"limits": `{"bytes_burst":65536}`}, wantReason: "limits.bytes_burst: set without limits.bytes_per_second"},
		{name: "bytes_burst too small", fields: map[string]string{"limits": `{"bytes_per_second":1024,"bytes_burst":16383}`}, wantReason: "limits.bytes_burst: 16383 out of range: 0 (default) or 16384..1073741824"},
		{name: "bytes_burst too large", fields: map[string]string{"limits": `{"bytes_per_second":1024,"bytes_burst":1073741825}`}, wantReason: "limits.bytes_burst: 1073741825 out of range"},
		{name: "bytes_burst string", fields: map[string]string{"limits": `{"bytes_per_second":1024,"bytes_burst":"64k"}`}, wantReason: "limits.bytes_burst: must be a whole number, not a string"},

		// Services.
		{name: "services missing", fields: map[string]string{"services": ""}, wantReason: "at least one service"},
		{name: "services empty", fields: map[string]string{"services": `[]`}, wantReason: "at least one service"},
		{name: "services null", fields: map[string]string{"services": `null`}, wantReason: "at least one service"},
		{name: "services object", fields: map[string]string{"services": `{"name":"web","port":1}`}, wantReason: "services: must be an array, not an object"},
		{name: "service not an object", fields: map[string]string{"services": `[5]`}, wantReason: "services[0]: must be an object, not a number"},
		{name: "64 services", fields: map[string]string{"services": docServices(64)}},
		{name: "65 services", fields: map[string]string{"services": docServices(65)}, wantReason: "65 services, more than 64"},
		{name: "unnamed only", fields: map[string]string{"services": `[{"name":"","port":8080}]`}},
		{name: "name missing is unnamed", fields: map[string]string{"services": `[{"port":8080}]`}},
		{name: "duplicate names", fields: map[string]string{"services": `[{"name":"web","port":8080},{"name":"web","port":8081}]`}, wantReason: `services[1].name: duplicate service "web"`},
		{name: "two unnamed", fields: map[string]string{"services": `[{"name":"","port":8080},{"port":8081}]`}, wantReason: "services[1].name: more than one unnamed service"},
		{name: "same port twice", fields: map[string]string{"services": `[{"name":"a","port":8080},{"name":"b","port":8080}]`}},
		{name: "bad service name", fields: map[string]string{"services": `[{"name":"Web","port":8080}]`}, wantReason: `services[0].name: name "Web"`},
		{name: "service name with --", fields: map[string]string{"services": `[{"name":"w--b","port":8080}]`}, wantReason: `must not contain "--"`},
		{name: "port 0", fields: map[string]string{"services": `[{"name":"web","port":0}]`}, wantReason: "port 0 out of range 1..65535"},
		{name: "port missing", fields: map[string]string{"services": `[{"name":"web"}]`}, wantReason: "port 0 out of range"},
		{name: "port 1", fields: map[string]string{"services": `[{"name":"web","port":1}]`}},
		{name: "port 65535", fields: map[string]string{"services": `[{"name":"web","port":65535}]`}},
		{name: "port 65536", fields: map[string]string{"services": `[{"name":"web","port":65536}]`}, wantReason: "port 65536 out of range"},
		{name: "port -1", fields: map[string]string{"services": `[{"name":"web","port":-1}]`}, wantReason: "port -1 out of range"},
		{name: "port string", fields: map[string]string{"services": `[{"name":"web","port":"8080"}]`}, wantReason: "services[0].port: must be a whole number, not a string"},
		{name: "port float", fields: map[string]string{"services": `[{"name":"web","port":8080.0}]`}, wantReason: "services[0].port: 8080.0 is not a whole number"},
		{name: "port exponent", fields: map[string]string{"services": `[{"name":"web","port":8e3}]`}, wantReason: "services[0].port: 8e3 is not a whole number"},
		{name: "port huge", fields: map[string]string{"services": `[{"name":"web","port":99999999999999999999}]`}, wantReason: "services[0].port: 99999999999999999999 is not a whole number"},
		{name: "port null", fields: map[string]string{"services": `[{"name":"web","port":null}]`}, wantReason: "port 0 out of range"},
		{name: "revision negative", fields: map[string]string{"services": `[{"name":"web","port":80,"revision":-1}]`}, wantReason: "revision -1 is negative"},
		{name: "protocol h2c", fields: map[string]string{"services": `[{"name":"web","port":80,"protocol":"h2c"}]`}, check: docWantProtocol(ProtocolH2C)},
		{name: "protocol http1 is the default", fields: map[string]string{"services": `[{"name":"web","port":80,"protocol":"http1"}]`}, check: docWantProtocol("")},
		{name: "protocol missing", fields: map[string]string{"services": `[{"name":"web","port":80}]`}, check: docWantProtocol("")},
		{name: "protocol empty", fields: map[string]string{"services": `[{"name":"web","port":80,"protocol":""}]`}, check: docWantProtocol("")},
		{name: "protocol h2", fields: map[string]string{"services": `[{"name":"web","port":80,"protocol":"h2"}]`}, wantReason: `service "web": protocol "h2" not supported (use http1 or h2c)`},
		{name: "protocol upper case", fields: map[string]string{"services": `[{"name":"web","port":80,"protocol":"H2C"}]`}, wantReason: `protocol "H2C" not supported`},
		{name: "protocol number", fields: map[string]string{"services": `[{"name":"web","port":80,"protocol":2}]`}, wantReason: "services[0].protocol: must be a string, not a number"},
		{name: "revision large", fields: map[string]string{"services": `[{"name":"web","port":80,"revision":9223372036854775807}]`}},
		{name: "revision string", fields: map[string]string{"services": `[{"name":"web","port":80,"revision":"7"}]`}, wantReason: "services[0].revision: must be a whole number, not a string"},
		{name: "start grace absent", fields: map[string]string{"services": `[{"name":"web","port":80}]`}, check: docWantStartGrace(nil)},
		{name: "start grace 0", fields: map[string]string{"services": `[{"name":"web","port":80,"start_grace_seconds":0}]`}, check: docWantStartGrace(new(0))},
		{name: "start grace 300", fields: map[string]string{"services": `[{"name":"web","port":80,"start_grace_seconds":300}]`}, check: docWantStartGrace(new(300))},
		{name: "start grace 301", fields: map[string]string{"services": `[{"name":"web","port":80,"start_grace_seconds":301}]`}, wantReason: `services[0].start_grace_seconds: service "web": start_grace_seconds 301 out of range 0..300`},
		{name: "start grace negative", fields: map[string]string{"services": `[{"name":"web","port":80,"start_grace_seconds":-1}]`}, wantReason: "start_grace_seconds -1 out of range"},
		{name: "start grace float", fields: map[string]string{"services": `[{"name":"web","port":80,"start_grace_seconds":1.5}]`}, wantReason: "services[0].start_grace_seconds: 1.5 is not a whole number"},
		{name: "start grace string", fields: map[string]string{"services": `[{"name":"web","port":80,"start_grace_seconds":"5"}]`}, wantReason: "services[0].start_grace_seconds: must be a whole number, not a string"},
		// Names whose readable label does not fit get a hashed one; the
		// names themselves may have up to 63 characters each.
		{name: "longest names", fields: map[string]string{
			"workspace": `"` + strings.Repeat("w", 63) + `"`,
			"sandbox":   `"` + strings.Repeat("s", 63) + `"`,
			"services":  `[{"name":"` + strings.Repeat("v", 63) + `","port":80},{"port":81}]`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := docEntry("demo", tt.fields)
			doc, err := ParseDocument(docWith(docEntry("ok", nil), e))
			if err != nil {
				t.Fatalf("ParseDocument: %v\nentry: %s", err, e)
			}
			if len(doc.Instances) == 0 || doc.Instances[0].Sandbox != "ok" {
				t.Fatalf("the good entry was not accepted: %+v", doc)
			}
			if tt.wantReason == "" {
				if len(doc.Rejected) != 0 || len(doc.Instances) != 2 {
					t.Fatalf("entry rejected: %+v\nentry: %s", doc.Rejected, e)
				}
				if tt.check != nil {
					tt.check(t, doc.Instances[1])
				}
				return
			}
			if len(doc.Instances) != 1 || len(doc.Rejected) != 1 {
				t.Fatalf("got %d accepted, %d rejected (%+v), want 1 and 1\nentry: %s", len(doc.Instances), len(doc.Rejected), doc.Rejected, e)
			}
			r := doc.Rejected[0]
			if r.Index != 1 {
				t.Errorf("Index = %d, want 1", r.Index)
			}
			if !strings.Contains(r.Reason, tt.wantReason) {
				t.Errorf("Reason = %q, want it to contain %q", r.Reason, tt.wantReason)
			}
			if strings.ContainsAny(r.Reason, "\n\r") {
				t.Errorf("Reason %q is not one line", r.Reason)
			}
			if r.Sandbox != "demo" && tt.fields["sandbox"] == "" {
				t.Errorf("Rejected.Sandbox = %q, want demo", r.Sandbox)
			}
		})
	}
}

// docServices returns a services array of n named services.
func docServices(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf(`{"name":"s%d","port":%d}`, i, 8000+i)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func docWantStartGrace(want *int) func(t *testing.T, s InstanceSpec) {
	return func(t *testing.T, s InstanceSpec) {
		t.Helper()
		got := s.Services[0].StartGraceSeconds
		if (got == nil) != (want == nil) || (got != nil && *got != *want) {
			t.Errorf("StartGraceSeconds = %v, want %v", fmtIntPtr(got), fmtIntPtr(want))
		}
	}
}

func fmtIntPtr(p *int) string {
	if p == nil {
		return "nil"
	}
	return strconv.Itoa(*p)
}

func docWantConnector(want ConnectorSpec) func(t *testing.T, s InstanceSpec) {
	return func(t *testing.T, s InstanceSpec) {
		t.Helper()
		if s.Connector != want {
			t.Errorf("Connector = %+v, want %+v", s.Connector, want)
		}
	}
}

func docWantProtocol(want string) func(t *testing.T, s InstanceSpec) {
	return func(t *testing.T, s InstanceSpec) {
		t.Helper()
		if got := s.Services[0].Protocol; got != want {
			t.Errorf("Protocol = %q, want %q", got, want)
		}
	}
}

func TestParseDocumentRejectedEntries(t *testing.T) {
	tests := []struct {
		name    string
		entries []string
		want    []RejectedInstance // Reason is matched as a substring
		valid   []string           // sandboxes accepted
	}{
		{
			name:    "not objects",
			entries: []string{`5`, docEntry("a", nil), `"team/demo"`, `null`, `[]`, `true`},
			want: []RejectedInstance{
				{Index: 0, Reason: "entry is a number, not an object"},
				{Index: 2, Reason: "entry is a string, not an object"},
				{Index: 3, Reason: "entry is null, not an object"},
				{Index: 4, Reason: "entry is an array, not an object"},
				{Index: 5, Reason: "entry is a boolean, not an object"},
			},
			valid: []string{"a"},
		},
		{
			name:    "duplicate instances",
			entries: []string{docEntry("demo", nil), docEntry("b", nil), docEntry("demo", map[string]string{"generation": `"2"`})},
			want: []RejectedInstance{
				{Index: 0, Workspace: "team", Sandbox: "demo", Reason: "duplicate instance team/demo"},
				{Index: 2, Workspace: "team", Sandbox: "demo", Reason: "duplicate instance team/demo"},
			},
			valid: []string{"b"},
		},
		{
			name:    "identical duplicates",
			entries: []string{docEntry("demo", nil), docEntry("demo", nil)},
			want: []RejectedInstance{
				{Index: 0, Workspace: "team", Sandbox: "demo", Reason: "duplicate instance team/demo"},
				{Index: 1, Workspace: "team", Sandbox: "demo", Reason: "duplicate instance team/demo"},
			},
		},
		{
			name: "duplicate of an invalid entry",
			entries: []string{
				docEntry("demo", map[string]string{"services": `[{"name":"web","port":0}]`}),
				docEntry("demo", nil),
			},
			want: []RejectedInstance{
				{Index: 0, Workspace: "team", Sandbox: "demo", Reason: "port 0 out of range"},
				{Index: 1, Workspace: "team", Sandbox: "demo", Reason: "duplicate instance team/demo"},
			},
		},
		{
			name: "duplicate of an entry with an unknown field",
			entries: []string{
				docEntry("demo", nil),
				docEntry("demo", map[string]string{"extra": `{}`}),
			},
			want: []RejectedInstance{
				{Index: 0, Workspace: "team", Sandbox: "demo", Reason: "duplicate instance team/demo"},
				{Index: 1, Workspace: "team", Sandbox: "demo", Reason: `extra: unknown field`},
			},
		},
		{
			name:    "same sandbox in other workspaces",
			entries: []string{docEntry("demo", nil), docEntry("demo", map[string]string{"workspace": `"ops"`})},
			valid:   []string{"demo", "demo"},
		},
		{
			name: "lenient names of a broken entry",
			entries: []string{
				`{"workspace":"Team X","sandbox":7,"services":"x"}`,
				`{"workspace":"` + strings.Repeat("w", 100) + `","sandbox":"s"}`,
			},
			want: []RejectedInstance{
				{Index: 0, Workspace: "Team X", Reason: "sandbox: must be a string, not a number (and 2 more problems)"},
				{Index: 1, Workspace: strings.Repeat("w", 64), Sandbox: "s", Reason: "longer than 63"},
			},
		},
		{
			name: "reason is bounded",
			entries: []string{
				`{"` + strings.Repeat("x", 10000) + `":1}`,
			},
			want: []RejectedInstance{{Index: 0, Reason: "unknown field"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, err := ParseDocument(docWith(tt.entries...))
			if err != nil {
				t.Fatalf("ParseDocument: %v", err)
			}
			if len(doc.Instances)+len(doc.Rejected) != len(tt.entries) {
				t.Errorf("%d accepted + %d rejected != %d entries", len(doc.Instances), len(doc.Rejected), len(tt.entries))
			}
			var valid []string
			for _, s := range doc.Instances {
				valid = append(valid, s.Sandbox)
			}
			if !reflect.DeepEqual(valid, tt.valid) {
				t.Errorf("accepted %q, want %q", valid, tt.valid)
			}
			if len(doc.Rejected) != len(tt.want) {
				t.Fatalf("rejected %+v, want %+v", doc.Rejected, tt.want)
			}
			for i, r := range doc.Rejected {
				w := tt.want[i]
				if r.Index != w.Index || r.Workspace != w.Workspace || r.Sandbox != w.Sandbox || !strings.Contains(r.Reason, w.Reason) {
					t.Errorf("rejected[%d] = %+v, want %+v", i, r, w)
				}
				if len(r.Reason) > 300 || strings.ContainsAny(r.Reason, "\n\r") {
					t.Errorf("rejected[%d].Reason is not one short line: %.400q", i, r.Reason)
				}
			}
		})
	}
}

func TestDocumentCheckKeys(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string
	}{
		{`{}`, ""},
		{`{"a":1,"b":[{"a":1},{"a":2}],"c":{"a":"x\"y"}}`, ""},
		{` { "a" : [ ] , "b" : { } } `, ""},
		{`{"a":"{\"A\":1}"}`, ""}, // keys inside strings are not keys
		{`{"A":1}`, "not allowed"},
		{`{"a":1,"a":2}`, "duplicate"},
		{`{"x":{"a":1,"a":2}}`, "duplicate"},
		{`{"x":[{"a":1,"a":2}]}`, "duplicate"},
		{`{"a\"":1}`, "not allowed"},
		{`{"":1}`, ""},
		{strings.Repeat(`{"a":`, 20) + `1` + strings.Repeat(`}`, 20), "nested too deeply"},
		{`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17}`, "more than 16 fields"},
		{`{"a":1`, "invalid JSON"},
		{`{"a`, "invalid JSON"},
	}
	for _, tt := range tests {
		err := checkKeys([]byte(tt.in))
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("checkKeys(%s) = %v", tt.in, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("checkKeys(%s) = %v, want %q", tt.in, err, tt.wantErr)
		}
	}
}

func BenchmarkParseDocument10000(b *testing.B) {
	entries := make([]string, 10000)
	for i := range entries {
		entries[i] = fmt.Sprintf(`{"workspace":"team","sandbox":"sb-%d","generation":"1","connector":{"type":"tcp","host":"127.0.0.1"},"limits":{"max_streams":256},"services":[{"name":"web","port":8080,"revision":1}]}`, i)
	}
	data := docWith(entries...)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		doc, err := ParseDocument(data)
		if err != nil || len(doc.Instances) != 10000 {
			b.Fatal(err)
		}
	}
}

// TestParseDocumentInvalidJSON checks that the incremental validation of
// the top level refuses exactly what json.Valid refuses, with the same
// message as a whole-document check, and that an invalid document is
// reported as such before any other error.
func TestParseDocumentInvalidJSON(t *testing.T) {
	for _, in := range []string{
		`{"instances":[1,]}`,
		`{"instances":[1 2]}`,
		`{"instances":[{"a":1}}]}`,
		`{"instances":[{"a":[1}]}`,
		`{"instances":[],}`,
		`{"instances" []}`,
		`{"instances":[]`,
		`{"instances":[]}}`,
		`{"instances":[]} x`,
		`{"instances":[]}{}`,
		`{,}`,
		`{"revision":"x" "instances":[]}`,
		`{"\x":1,"instances":[]}`,
		`{"revision":"\u12","instances":[]}`,
		`{"instances":[tru]}`,
		`{"instances":[01]}`,
		`{"instances":["a\qb"]}`,
		`{"unknown":1,"instances":[nul]}`,
		`{"revision":1,"revision":2,"instances":{"a":}}`,
		`{"instances":[]`,
		`{"instances":[{}],"revision":"r"`,
		`{"instances":[],"revision":"r\`,
		// Input ending in a backslash (read with no spare capacity).
		`{"revision":"\`,
		`{"instances":["\`,
		`{"instances":[{"a":"\`,
		`{"x\`,
		// One level deeper than encoding/json allows (10,000) for the
		// whole document, though each entry alone would be within it.
		`{"instances":[` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `]}`,
		`{"x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `,"instances":[]}`,
	} {
		data := []byte(in)
		data = data[:len(data):len(data)]
		if json.Valid(data) {
			t.Fatalf("%.60s is valid JSON: fix the table", in)
		}
		_, err := ParseDocument(data)
		want := invalidJSON([]byte(in))
		if err == nil || err.Error() != want.Error() {
			t.Errorf("ParseDocument(%.60s) = %v, want %v", in, err, want)
		}
	}
	// At the limit exactly: valid, and accepted as such.
	deepest := `{"instances":[` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `]}`
	if !json.Valid([]byte(deepest)) {
		t.Fatal("the deepest valid document is not valid: fix the test")
	}
	if doc, err := ParseDocument([]byte(deepest)); err != nil || len(doc.Rejected) != 1 {
		t.Errorf("deepest valid document: %v (%+v); want one rejected entry", err, doc)
	}
	for in, want := range map[string]string{
		`{"revision":1,"instances":[]}`:                  `document: "revision" must be a string`,
		`{"revision":"a","revision":"b","instances":[]}`: `document: duplicate field "revision"`,
		`{"instances":[],"instances":[]}`:                `document: duplicate field "instances"`,
		`{"instances":{}}`:                               `document: "instances" must be an array`,
		`{"x":[1,{"y":2}],"instances":[]}`:               `document: unknown field "x"`,
		`{"revision":"r"}`:                               `document: "instances" is missing`,
		` [1] `:                                          `document: top level must be a JSON object`,
	} {
		_, err := ParseDocument([]byte(in))
		if err == nil || err.Error() != want {
			t.Errorf("ParseDocument(%s) = %v, want %s", in, err, want)
		}
	}
	doc, err := ParseDocument([]byte(" {\n\"instances\" : [ ] , \"revision\" : \"r\\u0031\" }\n"))
	if err != nil || doc.Revision != "r1" || len(doc.Instances) != 0 {
		t.Fatalf("spaced document: %+v, %v", doc, err)
	}
}

// Every problem of an entry is reported, each at its JSON path, and the
// entry's one-line reason is the first of them with the count of the rest.
func TestParseDocumentEveryProblem(t *testing.T) {
	entry := `{"workspace":"Team","sandbox":"demo","generation":"a b","extra":1,
	  "connector":{"type":"tcp","host":"10.0.0.1"},
	  "limits":{"max_streams":-1,"max_streamz":3},
	  "services":[{"name":"web","port":80800},{"name":"web","port":"8080"},{"name":"api","port":1,"protocol":"h3"}]}`
	doc, err := ParseDocument(docWith(entry))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Rejected) != 1 {
		t.Fatalf("rejected %+v, want one entry", doc.Rejected)
	}
	var got []string
	for _, p := range doc.Rejected[0].Problems {
		got = append(got, p.String())
	}
	want := []string{
		"extra: unknown field",
		"limits.max_streamz: unknown field",
		"services[1].port: must be a whole number, not a string",
		`workspace: name "Team": character 'T' not allowed (use [a-z0-9-])`,
		"generation: byte 0x20 not allowed (use printable ASCII without spaces)",
		`connector.host: tcp host "10.0.0.1" is not a loopback address`,
		"limits.max_streams: -1 out of range 0..1000000",
		`services[0].port: service "web": port 80800 out of range 1..65535`,
		`services[1].name: duplicate service "web"`,
		`services[2].protocol: service "api": protocol "h3" not supported (use http1 or h2c)`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r := doc.Rejected[0].Reason; r != "extra: unknown field (and 9 more problems)" {
		t.Errorf("reason %q", r)
	}
	// A valid entry that only breaks a semantic rule keeps a one-problem
	// reason without a count.
	doc, _ = ParseDocument(docWith(docEntry("demo", map[string]string{"services": `[{"name":"web","port":0}]`})))
	if len(doc.Rejected) != 1 || doc.Rejected[0].Reason != `services[0].port: service "web": port 0 out of range 1..65535` {
		t.Errorf("one problem: %+v", doc.Rejected)
	}
}

// A document that is not JSON says where: line and column of the byte at
// fault.
func TestParseDocumentSyntaxPosition(t *testing.T) {
	for in, want := range map[string]SyntaxError{
		"{\n \"instances\": [1,]\n}":       {Line: 2, Column: 18, Msg: "invalid character ']' looking for beginning of value"},
		"{\"instances\":[]} x":             {Line: 1, Column: 18, Msg: "data after the top-level object"},
		"{\"instances\":[]":                {Line: 1, Column: 16, Msg: "unexpected end of JSON input"},
		"{\n\n  \"instances\" []}":         {Line: 3, Column: 15, Msg: "invalid character '[' after object key"},
		"\n\n\n{\"instances\":[{\"a\":}]}": {Line: 4, Column: 20, Msg: "invalid character '}' looking for beginning of value"},
	} {
		_, err := ParseDocument([]byte(in))
		var se *SyntaxError
		if !errors.As(err, &se) || *se != want {
			t.Errorf("ParseDocument(%q) = %v, want %+v", in, err, want)
		}
	}
}
