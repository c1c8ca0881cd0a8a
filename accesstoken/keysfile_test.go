package accesstoken

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func TestParseKeysFile(t *testing.T) {
	doc := `{"keys":[{"id":"k1","secret":"` + b64(secret(1)) + `"},{"secret":"` + b64(secret(2)) + `","id":"k2"}]}`
	ks, err := ParseKeysFile([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ks.IDs(), ","); got != "k1,k2" {
		t.Fatalf("ids %q", got)
	}
	// The secrets are the decoded bytes: a token minted with a set built
	// from them directly verifies.
	direct := mustKeySet(t, Key{ID: "k2", Secret: secret(2)})
	tok := mint(t, direct, "k2", Claims{Workspace: "team", Sandbox: "demo", Service: "web", IssuedAt: t0, Expires: t0.Add(time.Hour)})
	if _, err := ks.Verify(tok, webRequest(t0)); err != nil {
		t.Fatal(err)
	}
	empty, err := ParseKeysFile([]byte(`{"keys":[]}`))
	if err != nil || len(empty.IDs()) != 0 {
		t.Fatalf("empty keys: %v, %v", empty, err)
	}
}

func TestParseKeysFileRefuses(t *testing.T) {
	s1, s2 := b64(secret(1)), b64(secret(2))
	short := b64(make([]byte, 31))
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"not JSON", `{"keys":`, "invalid JSON"},
		{"array", `[]`, "top level must be an object"},
		{"missing keys", `{}`, `"keys" is missing`},
		{"unknown top-level field", `{"keys":[],"kyes":[]}`, `unknown field "kyes"`},
		{"capitalised field", `{"Keys":[]}`, `unknown field "Keys"`},
		{"duplicate keys", `{"keys":[],"keys":[]}`, `duplicate field "keys"`},
		{"keys not an array", `{"keys":{}}`, "keys: must be an array"},
		{"key not an object", `{"keys":["k1"]}`, "keys[0]: must be an object"},
		{"unknown key field", `{"keys":[{"id":"k1","secret":"` + s1 + `","alg":"HS256"}]}`, `keys[0]: unknown field "alg"`},
		{"capitalised key field", `{"keys":[{"ID":"k1","secret":"` + s1 + `"}]}`, `keys[0]: unknown field "ID"`},
		{"duplicate id field", `{"keys":[{"id":"k1","id":"k2","secret":"` + s1 + `"}]}`, "keys[0].id: duplicate field"},
		{"missing secret", `{"keys":[{"id":"k1"}]}`, "keys[0].secret is missing"},
		{"missing id", `{"keys":[{"secret":"` + s1 + `"}]}`, "keys[0].id is missing"},
		{"id a number", `{"keys":[{"id":1,"secret":"` + s1 + `"}]}`, "keys[0].id: must be a string"},
		{"bad id", `{"keys":[{"id":"k 1","secret":"` + s1 + `"}]}`, "keys[0].id: key id"},
		{"short secret", `{"keys":[{"id":"k1","secret":"` + short + `"}]}`, "keys[0].secret: 31 bytes, want 32 to 512"},
		{"secret not base64", `{"keys":[{"id":"k1","secret":"not*base64*secret-value"}]}`, "keys[0].secret: not standard base64"},
		{"secret URL base64", `{"keys":[{"id":"k1","secret":"` + base64.RawURLEncoding.EncodeToString(secret(0xfb)) + `"}]}`, "keys[0].secret: not standard base64"},
		{"duplicate id", `{"keys":[{"id":"k1","secret":"` + s1 + `"},{"id":"k1","secret":"` + s2 + `"}]}`, `keys[1].id: duplicate key id "k1" (also keys[0])`},
		{"trailing data", `{"keys":[]} {}`, "data after the top-level object"},
		{"too large", `{"keys":[]}` + strings.Repeat(" ", MaxKeysFileBytes), "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseKeysFile([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			msg := err.Error()
			if strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("error %q is not one line", msg)
			}
			for _, s := range []string{s1, s2, short} {
				if strings.Contains(msg, s) {
					t.Fatalf("error %q contains a secret", msg)
				}
			}
		})
	}
	var many strings.Builder
	many.WriteString(`{"keys":[`)
	for i := 0; i <= MaxKeys; i++ {
		if i > 0 {
			many.WriteString(",")
		}
		many.WriteString(`{"id":"k` + strings.Repeat("x", i) + `","secret":"` + s1 + `"}`)
	}
	many.WriteString("]}")
	if _, err := ParseKeysFile([]byte(many.String())); err == nil || !strings.Contains(err.Error(), "more than 64 keys") {
		t.Fatalf("too many keys: %v", err)
	}
}

func TestLoadKeysFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")
	if _, err := LoadKeysFile(path); err == nil {
		t.Fatal("missing file loaded")
	}
	if err := os.WriteFile(path, []byte(`{"keys":[{"id":"k1","secret":"`+b64(secret(1))+`"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ks, err := LoadKeysFile(path)
	if err != nil || !ks.Has("k1") {
		t.Fatalf("%v %v", ks, err)
	}
	if err := os.WriteFile(path, []byte(`{"keys":[{"id":"k1"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeysFile(path); err == nil || !strings.Contains(err.Error(), path+": keys file: keys[0].secret is missing") {
		t.Fatalf("err %v", err)
	}
}
