package ocsftest

import (
	"strings"
	"testing"
)

// good is a valid HTTP Activity record.
const good = `{"activity_id":3,"activity_name":"Get","category_uid":4,"category_name":"Network Activity",
"class_uid":4002,"class_name":"HTTP Activity","type_uid":400203,"type_name":"HTTP Activity: Get",
"severity_id":2,"severity":"Low","status_id":2,"status":"Failure","time":1777636800001,"timezone_offset":0,
"metadata":{"product":{"name":"applistener","vendor_name":"applistener"},"version":"1.8.0"},
"src_endpoint":{"ip":"198.51.100.7","port":51234},"dst_endpoint":{"hostname":"a.example.com","port":8443},
"http_request":{"http_method":"GET","url":{"path":"/"}},"http_response":{"code":421},
"unmapped":{"workspace":"team"}}`

// TestValidatorAcceptsGood: the reference record is valid, so each
// failure below is the one change made to it.
func TestValidatorAcceptsGood(t *testing.T) {
	if err := Validate([]byte(good)); err != nil {
		t.Fatal(err)
	}
}

// TestValidatorRejects: each kind of mistake is found.
func TestValidatorRejects(t *testing.T) {
	for _, c := range []struct{ name, from, to, want string }{
		{"type_uid", `"type_uid":400203`, `"type_uid":400201`, "class_uid*100+activity_id"},
		{"missing required", `"severity_id":2,`, ``, "severity_id: required"},
		{"missing metadata.product", `"product":{"name":"applistener","vendor_name":"applistener"},`, ``, "product: required"},
		{"string for integer", `"status_id":2`, `"status_id":"2"`, "want an integer"},
		{"float for integer", `"code":421`, `"code":421.5`, "want an integer"},
		{"unknown attribute", `"timezone_offset":0`, `"timezone_offset":0,"reason":"x"`, "not an attribute"},
		{"unknown object attribute", `"port":51234`, `"port":51234,"cookie":"x"`, "not an attribute of network_endpoint"},
		{"severity enum", `"severity_id":2,"severity":"Low"`, `"severity_id":7`, "not one of"},
		{"activity enum", `"activity_id":3,"activity_name":"Get"`, `"activity_id":12`, "not one of"},
		{"activity caption", `"activity_name":"Get"`, `"activity_name":"Post"`, "caption of activity_id"},
		{"class name", `"class_name":"HTTP Activity"`, `"class_name":"HTTP"`, "class_name"},
		{"category", `"category_uid":4`, `"category_uid":5`, "category_uid"},
		{"time in seconds", `"time":1777636800001`, `"time":1777636800`, "milliseconds"},
		{"schema version", `"version":"1.8.0"`, `"version":"1.0.0"`, "metadata.version"},
		{"ip pattern", `"ip":"198.51.100.7"`, `"ip":"not-an-ip"`, "not a valid ip_t"},
		{"port range", `"port":51234`, `"port":70000`, "out of range"},
		{"response code required", `"http_response":{"code":421}`, `"http_response":{}`, "code: required"},
		{"endpoint needs an identity", `"dst_endpoint":{"hostname":"a.example.com","port":8443}`, `"dst_endpoint":{"port":8443}`, "at least one"},
		{"class needs request or response", `"http_request":{"http_method":"GET","url":{"path":"/"}},"http_response":{"code":421},`, ``, "at least one of [http_request http_response]"},
		{"http_method enum", `"http_method":"GET"`, `"http_method":"BREW"`, "not one of"},
		{"deprecated", `"timezone_offset":0`, `"timezone_offset":0,"http_status":421`, "deprecated"},
		{"object for string", `"path":"/"`, `"path":{}`, "want a string"},
		{"profile attribute", `"timezone_offset":0`, `"timezone_offset":0,"cloud":{}`, "not an attribute"},
		{"unknown class", `"class_uid":4002`, `"class_uid":4003`, "not a class"},
	} {
		rec := strings.Replace(good, c.from, c.to, 1)
		if rec == good {
			t.Fatalf("%s: %q not in the reference record", c.name, c.from)
		}
		err := Validate([]byte(rec))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// TestSchemaClasses: the stored schema compiles to the three classes the
// listener uses, with their required attributes.
func TestSchemaClasses(t *testing.T) {
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != "1.8.0" {
		t.Errorf("schema version %s", s.Version)
	}
	for uid, caption := range map[int]string{4001: "Network Activity", 4002: "HTTP Activity", 3004: "Entity Management"} {
		c, ok := s.Class(uid)
		if !ok || c.caption != caption {
			t.Errorf("class %d: %v", uid, c)
			continue
		}
		for _, k := range []string{"activity_id", "category_uid", "class_uid", "metadata", "severity_id", "time", "type_uid"} {
			if c.attrs[k] == nil || c.attrs[k].Requirement != "required" {
				t.Errorf("class %d: %s is not required", uid, k)
			}
		}
	}
	if c, _ := s.Class(3004); c.attrs["entity"].Requirement != "required" {
		t.Error("Entity Management: entity is not required")
	}
}
