package accesstoken

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Limits of a keys file.
const (
	// MaxKeysFileBytes is the largest keys file ParseKeysFile accepts.
	MaxKeysFileBytes = 64 << 10
	// MaxKeys is the most keys one file may hold.
	MaxKeys = 64
)

// ParseKeysFile decodes and checks a keys file,
//
//	{"keys":[{"id":"k1","secret":"<standard base64, 32 to 512 bytes>"}]}
//
// and returns its key set. It is strict: the only fields are "keys" and,
// in each key, "id" and "secret", each exactly once and spelled exactly so;
// secrets are standard base64 with padding; ids are distinct. An empty
// "keys" array is valid (it verifies nothing: every key revoked). The error
// is one line naming the place at fault ("keys[1].secret: ...") and never
// contains a secret.
func ParseKeysFile(data []byte) (*KeySet, error) {
	keys, err := parseKeysFile(data)
	if err != nil {
		return nil, fmt.Errorf("keys file: %w", err)
	}
	return NewKeySet(keys...)
}

// LoadKeysFile reads and parses the keys file at path (see ParseKeysFile).
func LoadKeysFile(path string) (*KeySet, error) {
	data, err := readLimited(path, MaxKeysFileBytes)
	if err != nil {
		return nil, err
	}
	ks, err := ParseKeysFile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ks, nil
}

// readLimited reads the file at path, refusing one larger than limit.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return data, nil
}

// parseKeysFile walks the document token by token, so that duplicated or
// differently-cased field names (which encoding/json would accept) are
// refused.
func parseKeysFile(data []byte) ([]Key, error) {
	if len(data) > MaxKeysFileBytes {
		return nil, fmt.Errorf("%d bytes, larger than %d", len(data), MaxKeysFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := expectDelim(dec, '{', ""); err != nil {
		return nil, err
	}
	var keys []Key
	seenKeys := false
	for dec.More() {
		name, err := fieldName(dec, "")
		if err != nil {
			return nil, err
		}
		if name != "keys" {
			return nil, fmt.Errorf("unknown field %s (want \"keys\")", strconv.Quote(cut(name)))
		}
		if seenKeys {
			return nil, errors.New(`duplicate field "keys"`)
		}
		seenKeys = true
		if err := expectDelim(dec, '[', "keys"); err != nil {
			return nil, err
		}
		for i := 0; dec.More(); i++ {
			at := "keys[" + strconv.Itoa(i) + "]"
			if i == MaxKeys {
				return nil, fmt.Errorf("keys: more than %d keys", MaxKeys)
			}
			k, err := parseKey(dec, at)
			if err != nil {
				return nil, err
			}
			if err := CheckKeyID(k.ID); err != nil {
				return nil, fmt.Errorf("%s.id: %w", at, err)
			}
			if n := len(k.Secret); n < MinSecretLen || n > MaxSecretLen {
				return nil, fmt.Errorf("%s.secret: %d bytes, want %d to %d (e.g. openssl rand -base64 32)", at, n, MinSecretLen, MaxSecretLen)
			}
			for j := range keys {
				if keys[j].ID == k.ID {
					return nil, fmt.Errorf("%s.id: duplicate key id %q (also keys[%d])", at, k.ID, j)
				}
			}
			keys = append(keys, k)
		}
		if _, err := dec.Token(); err != nil { // ']'
			return nil, syntaxErr(err)
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, syntaxErr(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the top-level object")
	}
	if !seenKeys {
		return nil, errors.New(`"keys" is missing`)
	}
	return keys, nil
}

// parseKey reads one {"id":..., "secret":...} object.
func parseKey(dec *json.Decoder, at string) (Key, error) {
	var k Key
	if err := expectDelim(dec, '{', at); err != nil {
		return k, err
	}
	var seenID, seenSecret bool
	for dec.More() {
		name, err := fieldName(dec, at)
		if err != nil {
			return k, err
		}
		seen := map[string]*bool{"id": &seenID, "secret": &seenSecret}[name]
		if seen == nil {
			return k, fmt.Errorf("%s: unknown field %s (want \"id\" and \"secret\")", at, strconv.Quote(cut(name)))
		}
		path := at + "." + name
		if *seen {
			return k, fmt.Errorf("%s: duplicate field", path)
		}
		*seen = true
		tok, err := dec.Token()
		if err != nil {
			return k, syntaxErr(err)
		}
		s, ok := tok.(string)
		if !ok {
			return k, fmt.Errorf("%s: must be a string", path)
		}
		if name == "id" {
			k.ID = s
			continue
		}
		secret, err := base64.StdEncoding.Strict().DecodeString(s)
		if err != nil {
			return k, fmt.Errorf("%s: not standard base64 with padding", path) // never the secret itself
		}
		k.Secret = secret
	}
	if _, err := dec.Token(); err != nil { // '}'
		return k, syntaxErr(err)
	}
	switch {
	case !seenID:
		return k, fmt.Errorf("%s.id is missing", at)
	case !seenSecret:
		return k, fmt.Errorf("%s.secret is missing", at)
	}
	return k, nil
}

// expectDelim reads the next token, which must be the delimiter d.
func expectDelim(dec *json.Decoder, d json.Delim, at string) error {
	tok, err := dec.Token()
	if err != nil {
		return syntaxErr(err)
	}
	if got, ok := tok.(json.Delim); !ok || got != d {
		what := map[json.Delim]string{'{': "an object", '[': "an array"}[d]
		if at == "" {
			return fmt.Errorf("top level must be %s", what)
		}
		return fmt.Errorf("%s: must be %s", at, what)
	}
	return nil
}

// fieldName reads an object's next field name.
func fieldName(dec *json.Decoder, at string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", syntaxErr(err)
	}
	name, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("%s: invalid JSON", at)
	}
	return name, nil
}

// syntaxErr is a decoding error in one line, without the input.
func syntaxErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errors.New("invalid JSON: unexpected end of input")
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("invalid JSON at byte %d", se.Offset)
	}
	return errors.New("invalid JSON")
}

// cut bounds a name quoted in an error.
func cut(s string) string {
	if len(s) > 64 {
		return s[:61] + "..."
	}
	return s
}
