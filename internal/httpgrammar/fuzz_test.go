package httpgrammar

import (
	"bytes"
	"strings"
	"testing"
)

// Reference implementations, written for clarity from the ABNF (see
// httpgrammar_test.go), that the fuzz target compares the table-driven
// ones with.

func refIsToken(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for _, c := range p {
		if !refTchar(c) {
			return false
		}
	}
	return true
}

func refIsLowerToken(p []byte) bool {
	return refIsToken(p) && !bytes.ContainsFunc(p, func(r rune) bool { return r >= 'A' && r <= 'Z' })
}

func refValidFieldValue(p []byte) bool {
	for _, c := range p {
		if !refFieldByte(c) {
			return false
		}
	}
	return true
}

func refIsVisible(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for _, c := range p {
		if !refVCHAR(c) {
			return false
		}
	}
	return true
}

func refEqualFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if refLower(a[i]) != refLower(b[i]) {
			return false
		}
	}
	return true
}

func isASCII(p []byte) bool {
	for _, c := range p {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

func FuzzGrammar(f *testing.F) {
	for _, s := range []string{"", "GET", "Content-Length", "content-length", "a b", "caf\xc3\xa9",
		"\u212aeep-alive", "x\x00", "\t v \t", "/index.html?q", "web\u017focket"} {
		f.Add([]byte(s), []byte(strings.ToUpper(s)))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		sa := string(a)
		if got, want := IsToken(a), refIsToken(a); got != want || IsToken(sa) != want {
			t.Fatalf("IsToken(%q) = %v, want %v", a, got, want)
		}
		if got, want := IsLowerToken(a), refIsLowerToken(a); got != want || IsLowerToken(sa) != want {
			t.Fatalf("IsLowerToken(%q) = %v, want %v", a, got, want)
		}
		if got, want := ValidFieldValue(a), refValidFieldValue(a); got != want || ValidFieldValue(sa) != want {
			t.Fatalf("ValidFieldValue(%q) = %v, want %v", a, got, want)
		}
		if got, want := IsVisible(a), refIsVisible(a); got != want || IsVisible(sa) != want {
			t.Fatalf("IsVisible(%q) = %v, want %v", a, got, want)
		}
		if got, want := string(TrimOWS(a)), strings.Trim(sa, " \t"); got != want || TrimOWS(sa) != want {
			t.Fatalf("TrimOWS(%q) = %q, want %q", a, got, want)
		}
		want := refEqualFold(a, b)
		if got := EqualFold(a, b); got != want || EqualFold(sa, string(b)) != want || EqualFold(sa, b) != want {
			t.Fatalf("EqualFold(%q, %q) = %v, want %v", a, b, got, want)
		}
		if isASCII(a) && isASCII(b) && want != strings.EqualFold(sa, string(b)) {
			t.Fatalf("EqualFold(%q, %q) = %v, strings.EqualFold disagrees on ASCII", a, b, want)
		}
		if wantPrefix := len(a) >= len(b) && refEqualFold(a[:len(b)], b); HasPrefixFold(a, b) != wantPrefix {
			t.Fatalf("HasPrefixFold(%q, %q) != %v", a, b, wantPrefix)
		}
		lower := make([]byte, len(a))
		for i, c := range a {
			lower[i] = refLower(c)
		}
		if got := ToLower(sa); got != string(lower) {
			t.Fatalf("ToLower(%q) = %q, want %q", a, got, lower)
		}
	})
}
