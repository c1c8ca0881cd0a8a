package routes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// problemList collects the problems of one instance entry, at most
// maxProblems of them.
type problemList []Problem

// add records a problem at path (a JSON path inside the entry).
func (ps *problemList) add(path, format string, args ...any) {
	if len(*ps) >= maxProblems {
		return
	}
	*ps = append(*ps, Problem{Path: path, Msg: oneLine(fmt.Sprintf(format, args...))})
}

// covers reports whether a problem was recorded at path or at a path that
// contains it (the value there could not be decoded, so what validation
// says of it is a consequence, not a problem of its own).
func (ps problemList) covers(path string) bool {
	for _, p := range ps {
		if p.Path == path || strings.HasPrefix(path, p.Path+".") || strings.HasPrefix(path, p.Path+"[") {
			return true
		}
	}
	return false
}

// summary is the one-line reason of a rejected entry: its first problem
// and how many more there are.
func summary(ps []Problem) string {
	s := ps[0].String()
	if n := len(ps) - 1; n == 1 {
		s += " (and 1 more problem)"
	} else if n > 1 {
		s += fmt.Sprintf(" (and %d more problems)", n)
	}
	return oneLine(s)
}

// joinPath joins two JSON path parts with a dot ("" parts are left out).
func joinPath(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "." + b
}

// instanceSpecType is the schema of an instance entry.
var instanceSpecType = reflect.TypeFor[InstanceSpec]()

// schemaProblems walks raw (one valid JSON value, with lower-case unique
// keys: checkKeys passed) against the Go type t the way encoding/json
// would decode it, and reports every unknown field and every value of the
// wrong JSON type, each at its JSON path. null is accepted anywhere, as
// encoding/json accepts it.
func schemaProblems(raw []byte, t reflect.Type) problemList {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return problemList{{Msg: "invalid entry: " + oneLine(err.Error())}}
	}
	var ps problemList
	walkSchema(&ps, v, t, "")
	return ps
}

func walkSchema(ps *problemList, v any, t reflect.Type, path string) {
	if v == nil {
		return
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			ps.add(path, "must be an object, not %s", jsonKindOf(v))
			return
		}
		fields := jsonFields(t)
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			f, ok := fields[key]
			if !ok {
				ps.add(joinPath(path, pathKey(key)), "unknown field")
				continue
			}
			walkSchema(ps, obj[key], f.Type, joinPath(path, key))
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			ps.add(path, "must be an array, not %s", jsonKindOf(v))
			return
		}
		for i, e := range arr {
			walkSchema(ps, e, t.Elem(), path+"["+strconv.Itoa(i)+"]")
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			ps.add(path, "must be a string, not %s", jsonKindOf(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			ps.add(path, "must be true or false, not %s", jsonKindOf(v))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(json.Number)
		if !ok {
			ps.add(path, "must be a whole number, not %s", jsonKindOf(v))
			return
		}
		if _, err := strconv.ParseInt(string(n), 10, t.Bits()); err != nil {
			ps.add(path, "%s is not a whole number in range", cutString(string(n), 32))
		}
	}
}

// pathKey is an object key as a JSON path part, cut to 64 bytes (the
// schema's own keys are shorter) so that a hostile key cannot fill a line.
func pathKey(key string) string {
	if len(key) <= 64 {
		return key
	}
	return cutString(key, 61) + "..."
}

// jsonFields maps the JSON names of t's exported fields to the fields.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	m := make(map[string]reflect.StructField, t.NumField())
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		m[name] = f
	}
	return m
}

// jsonKindOf names the JSON kind of a decoded value.
func jsonKindOf(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	default:
		return "null"
	}
}
