package httpgrammar

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// The ABNF, written out as its RFCs spell it, independently of the class
// table: the reference the table is checked against, byte by byte.
//
//	tchar       = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "."
//	              / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA  (RFC 9110 §5.6.2)
//	field-vchar = VCHAR / obs-text                               (RFC 9110 §5.5)
//	obs-text    = %x80-FF
//	VCHAR       = %x21-7E                                        (RFC 5234 B.1)
//	OWS         = *( SP / HTAB )                                 (RFC 9110 §5.6.3)
func refALPHA(c byte) bool   { return c >= 0x41 && c <= 0x5A || c >= 0x61 && c <= 0x7A }
func refDIGIT(c byte) bool   { return c >= 0x30 && c <= 0x39 }
func refVCHAR(c byte) bool   { return c >= 0x21 && c <= 0x7E }
func refObsText(c byte) bool { return c >= 0x80 }
func refTchar(c byte) bool {
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 || refDIGIT(c) || refALPHA(c)
}
func refFieldByte(c byte) bool { return refVCHAR(c) || refObsText(c) || c == 0x20 || c == 0x09 }
func refLower(c byte) byte {
	if c >= 0x41 && c <= 0x5A {
		return c + 0x20
	}
	return c
}

func TestByteClassesMatchABNF(t *testing.T) {
	for i := 0; i < 256; i++ {
		c := byte(i)
		one := []byte{c}
		if got, want := IsTokenByte(c), refTchar(c); got != want {
			t.Errorf("IsTokenByte(%#02x) = %v, want %v", c, got, want)
		}
		if got, want := IsToken(one), refTchar(c); got != want {
			t.Errorf("IsToken(%q) = %v, want %v", one, got, want)
		}
		if got, want := IsLowerToken(string(one)), refTchar(c) && (c < 'A' || c > 'Z'); got != want {
			t.Errorf("IsLowerToken(%q) = %v, want %v", one, got, want)
		}
		if got, want := IsFieldValueByte(c), refFieldByte(c); got != want {
			t.Errorf("IsFieldValueByte(%#02x) = %v, want %v", c, got, want)
		}
		if got, want := ValidFieldValue(one), refFieldByte(c); got != want {
			t.Errorf("ValidFieldValue(%q) = %v, want %v", one, got, want)
		}
		if got, want := IsVisible(string(one)), refVCHAR(c); got != want {
			t.Errorf("IsVisible(%q) = %v, want %v", one, got, want)
		}
		if got, want := IsOWS(c), c == 0x20 || c == 0x09; got != want {
			t.Errorf("IsOWS(%#02x) = %v, want %v", c, got, want)
		}
		if got, want := Lower(c), refLower(c); got != want {
			t.Errorf("Lower(%#02x) = %#02x, want %#02x", c, got, want)
		}
	}
}

// TestByteClassCounts pins the size of each class, so that a table and its
// reference cannot drift together.
func TestByteClassCounts(t *testing.T) {
	var token, lowerToken, field, visible int
	for i := 0; i < 256; i++ {
		c := byte(i)
		if IsTokenByte(c) {
			token++
		}
		if IsLowerToken([]byte{c}) {
			lowerToken++
		}
		if IsFieldValueByte(c) {
			field++
		}
		if IsVisible([]byte{c}) {
			visible++
		}
	}
	// 52 letters, 10 digits, 15 symbols; 128 obs-text + 94 VCHAR + SP + HTAB.
	if token != 77 || lowerToken != 51 || field != 224 || visible != 94 {
		t.Fatalf("class sizes: token %d, lower token %d, field value %d, visible %d; want 77, 51, 224, 94",
			token, lowerToken, field, visible)
	}
}

func TestSequences(t *testing.T) {
	for _, tc := range []struct {
		in                         string
		token, lowerToken, visible bool
		fieldValue                 bool
	}{
		{"", false, false, false, true},
		{"GET", true, false, true, true},
		{"content-length", true, true, true, true},
		{"X-Forwarded-For", true, false, true, true},
		{"a b", false, false, false, true},
		{" \tleading and trailing\t ", false, false, false, true},
		{"name:", false, false, true, true},
		{"caf\xc3\xa9", false, false, false, true},
		{"/p?q=1&r=%20", false, false, true, true},
		{"bad\x00nul", false, false, false, false},
		{"cr\rlf\n", false, false, false, false},
		{"del\x7f", false, false, false, false},
		{"tab\tinside", false, false, false, true},
		{"\x1f", false, false, false, false},
	} {
		if got := IsToken(tc.in); got != tc.token {
			t.Errorf("IsToken(%q) = %v", tc.in, got)
		}
		if got := IsLowerToken([]byte(tc.in)); got != tc.lowerToken {
			t.Errorf("IsLowerToken(%q) = %v", tc.in, got)
		}
		if got := IsVisible(tc.in); got != tc.visible {
			t.Errorf("IsVisible(%q) = %v", tc.in, got)
		}
		if got := ValidFieldValue([]byte(tc.in)); got != tc.fieldValue {
			t.Errorf("ValidFieldValue(%q) = %v", tc.in, got)
		}
	}
}

func TestTrimOWS(t *testing.T) {
	for in, want := range map[string]string{
		"":              "",
		" \t ":          "",
		"\t a b \t":     "a b",
		"x":             "x",
		"\r\nx\r\n":     "\r\nx\r\n", // CR and LF are not OWS
		"\u00a0x\u00a0": "\u00a0x\u00a0",
	} {
		if got := TrimOWS(in); got != want {
			t.Errorf("TrimOWS(%q) = %q, want %q", in, got, want)
		}
		if got := string(TrimOWS([]byte(in))); got != want {
			t.Errorf("TrimOWS([]byte(%q)) = %q, want %q", in, got, want)
		}
	}
}

// asciiCases are ASCII strings compared with each other both ways.
var asciiCases = []string{
	"", "a", "A", "@", "[", "`", "{", "content-length", "Content-Length",
	"CONTENT-LENGTH", "content_length", "Content-Lengti", "keep-alive",
	"KEEP-ALIVE", "Keep-Alive ", "100-continue", "100-CONTINUE", "x\x00y", "X\x00Y",
	"\x7f", "~^|", "Host", "hosT", "Kelvin", "kelvin", "SS", "ss",
}

func TestEqualFoldMatchesStringsEqualFoldOnASCII(t *testing.T) {
	for _, a := range asciiCases {
		for _, b := range asciiCases {
			want := strings.EqualFold(a, b)
			if got := EqualFold(a, b); got != want {
				t.Errorf("EqualFold(%q, %q) = %v, want %v", a, b, got, want)
			}
			if got := EqualFold([]byte(a), b); got != want {
				t.Errorf("EqualFold([]byte(%q), %q) = %v, want %v", a, b, got, want)
			}
			if got := EqualFold(a, []byte(b)); got != want {
				t.Errorf("EqualFold(%q, []byte(%q)) = %v, want %v", a, b, got, want)
			}
			wantPrefix := len(a) >= len(b) && strings.EqualFold(a[:len(b)], b)
			if got := HasPrefixFold(a, b); got != wantPrefix {
				t.Errorf("HasPrefixFold(%q, %q) = %v, want %v", a, b, got, wantPrefix)
			}
		}
		if got, want := ToLower(a), strings.ToLower(a); got != want {
			t.Errorf("ToLower(%q) = %q, want %q", a, got, want)
		}
	}
}

// TestEqualFoldRefusesNonASCII: the runes that strings.EqualFold folds onto
// ASCII letters stay apart, and so do the bytes of any non-ASCII rune.
func TestEqualFoldRefusesNonASCII(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"\u212a", "k"}, // KELVIN SIGN
		{"\u212a", "K"}, //
		{"\u017f", "s"}, // LATIN SMALL LETTER LONG S
		{"keep-alive", "\u212aeep-alive"},
		{"websocket", "web\u017focket"},
		{"trailers", "trailer\u017f"},
		{"\u00c9", "\u00e9"}, // É and é: Unicode case, not ASCII case
		{"\xc3\x89", "\xc3\xa9"},
	} {
		if !strings.EqualFold(tc.a, tc.b) && utf8.RuneCountInString(tc.a) == utf8.RuneCountInString(tc.b) {
			t.Fatalf("case %q/%q: strings.EqualFold does not fold it; the case tests nothing", tc.a, tc.b)
		}
		if EqualFold(tc.a, tc.b) || EqualFold(tc.b, tc.a) || EqualFold([]byte(tc.a), tc.b) {
			t.Errorf("EqualFold(%q, %q) = true; the fold is ASCII's only", tc.a, tc.b)
		}
	}
	for i := 0x80; i < 0x100; i++ {
		if Lower(byte(i)) != byte(i) {
			t.Errorf("Lower(%#02x) changed a non-ASCII byte", i)
		}
	}
	if got := ToLower("\u00c9T\u212a"); got != "\u00c9t\u212a" {
		t.Errorf("ToLower folded non-ASCII: %q", got)
	}
}

func TestToLowerDoesNotCopyLowerCase(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = ToLower("content-length") }); n != 0 {
		t.Fatalf("ToLower of a lower-case name allocated %v times", n)
	}
}

func TestNoAllocations(t *testing.T) {
	name, value := []byte("Content-Length"), []byte(" 42 ")
	n := testing.AllocsPerRun(100, func() {
		_ = IsToken(name) && ValidFieldValue(value) && IsVisible(name) &&
			EqualFold(name, "content-length") && len(TrimOWS(value)) == 2 && IsLowerToken("te")
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
