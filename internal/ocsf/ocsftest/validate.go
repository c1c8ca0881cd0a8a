package ocsftest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Validate checks one OCSF record (a JSON object) against the schema of
// its class: every attribute is one the class (or object) defines and is
// not deprecated; required attributes are present; values have the type
// the dictionary gives (integer, long, string, timestamp, port range,
// IP address pattern, object, array); enum values (activity_id,
// severity_id, status_id, type_id ...) are allowed and their captions
// (activity_name, severity, status ...) match; at_least_one and just_one
// constraints hold, in objects too; category_uid, type_uid
// (class_uid*100+activity_id), class_name, category_name and type_name
// agree with the class; metadata.version is the schema's version; time is
// in milliseconds.
func Validate(line []byte) error {
	s, err := Load()
	if err != nil {
		return err
	}
	return s.Validate(line)
}

// Validate is the package's Validate on schema s.
func (s *Schema) Validate(line []byte) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var rec map[string]any
	if err := dec.Decode(&rec); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	uid, ok := intOf(rec["class_uid"])
	if !ok {
		return errors.New("class_uid: missing or not an integer")
	}
	class, ok := s.classes[int(uid)]
	if !ok {
		return fmt.Errorf("class_uid %d: not a class of the stored schema", uid)
	}
	v := &validator{s: s}
	v.record(class.caption, class, rec)
	v.classChecks(class, rec)
	return errors.Join(v.errs...)
}

type validator struct {
	s    *Schema
	errs []error
}

func (v *validator) fail(path, format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
}

// record checks obj against the class or object r.
func (v *validator) record(path string, r *record, obj map[string]any) {
	for k, val := range obj {
		a, ok := r.attrs[k]
		p := path + "." + k
		switch {
		case !ok:
			v.fail(p, "not an attribute of %s", r.name)
			continue
		case len(a.Deprecated) > 0 && string(a.Deprecated) != "null":
			v.fail(p, "deprecated: %s", a.Deprecated)
		}
		if val == nil {
			v.fail(p, "null")
			continue
		}
		v.value(p, a, val)
		if a.Sibling != "" && len(a.Enum) > 0 {
			id := fmt.Sprint(val)
			if sib, ok := obj[a.Sibling]; ok && id != "99" {
				if want := a.caption(id); sib != want {
					v.fail(path+"."+a.Sibling, "%q, want %q, the caption of %s %s", sib, want, k, id)
				}
			}
		}
	}
	for _, k := range sortedKeys(r.attrs) {
		if r.attrs[k].Requirement == "required" {
			if _, ok := obj[k]; !ok {
				v.fail(path+"."+k, "required by %s, missing", r.name)
			}
		}
	}
	for _, set := range r.atLeastOne {
		if !slices.ContainsFunc(set, func(k string) bool { _, ok := obj[k]; return ok }) {
			v.fail(path, "%s needs at least one of %v", r.name, set)
		}
	}
	for _, set := range r.justOne {
		n := 0
		for _, k := range set {
			if _, ok := obj[k]; ok {
				n++
			}
		}
		if n != 1 {
			v.fail(path, "%s needs exactly one of %v, has %d", r.name, set, n)
		}
	}
}

// value checks one attribute's value against its definition.
func (v *validator) value(path string, a *attr, val any) {
	if a.IsArray {
		list, ok := val.([]any)
		if !ok {
			v.fail(path, "want an array, got %T", val)
			return
		}
		one := *a
		one.IsArray = false
		for i, x := range list {
			v.value(path+"["+strconv.Itoa(i)+"]", &one, x)
		}
		return
	}
	if t, ok := v.s.types[a.Type]; ok {
		v.scalar(path, a, t, val)
		return
	}
	obj, ok := val.(map[string]any)
	if !ok {
		v.fail(path, "want a %s object, got %T", a.Type, val)
		return
	}
	if a.Type == "object" {
		return // any object (unmapped)
	}
	r, err := v.s.object(a.Type)
	if err != nil {
		v.fail(path, "%v", err)
		return
	}
	v.record(path, r, obj)
}

func (v *validator) scalar(path string, a *attr, t *scalarType, val any) {
	switch t.primitive {
	case "integer_t", "long_t":
		n, ok := intOf(val)
		if !ok {
			v.fail(path, "want an integer (%s), got %v", a.Type, val)
			return
		}
		if t.primitive == "integer_t" && (n > math.MaxInt32 || n < math.MinInt32) {
			v.fail(path, "%d does not fit an integer_t", n)
		}
		if t.rng != nil && (float64(n) < t.rng[0] || float64(n) > t.rng[1]) {
			v.fail(path, "%d out of range %v", n, t.rng)
		}
	case "float_t":
		if _, ok := val.(json.Number); !ok {
			v.fail(path, "want a number, got %v", val)
			return
		}
	case "boolean_t":
		if _, ok := val.(bool); !ok {
			v.fail(path, "want a boolean, got %v", val)
			return
		}
	case "string_t":
		s, ok := val.(string)
		if !ok {
			v.fail(path, "want a string (%s), got %T", a.Type, val)
			return
		}
		if t.maxLen > 0 && len(s) > t.maxLen {
			v.fail(path, "longer than %d", t.maxLen)
		}
		if t.regex != nil && !t.regex.MatchString(s) {
			v.fail(path, "%q is not a valid %s", s, a.Type)
		}
	case "json_t":
	default:
		v.fail(path, "unknown primitive type %s", t.primitive)
		return
	}
	if len(a.Enum) > 0 {
		if _, ok := a.Enum[fmt.Sprint(val)]; !ok {
			v.fail(path, "%v is not one of %v", val, sortedKeys(a.Enum))
		}
	}
}

// classChecks checks what the compiled schema derives from the class: the
// category and type ids and names, the schema version, the time unit.
func (v *validator) classChecks(c *record, rec map[string]any) {
	p := c.caption
	if cat, _ := intOf(rec["category_uid"]); int(cat) != c.categoryUID {
		v.fail(p+".category_uid", "%v, want %d", rec["category_uid"], c.categoryUID)
	}
	act, _ := intOf(rec["activity_id"])
	if typ, _ := intOf(rec["type_uid"]); typ != int64(c.uid)*100+act {
		v.fail(p+".type_uid", "%v, want class_uid*100+activity_id = %d", rec["type_uid"], int64(c.uid)*100+act)
	}
	if n, ok := rec["class_name"]; ok && n != c.caption {
		v.fail(p+".class_name", "%q, want %q", n, c.caption)
	}
	if n, ok := rec["category_name"]; ok && n != c.categoryCaption {
		v.fail(p+".category_name", "%q, want %q", n, c.categoryCaption)
	}
	if n, ok := rec["type_name"]; ok {
		want := c.caption + ": " + c.attrs["activity_id"].caption(strconv.FormatInt(act, 10))
		if n != want {
			v.fail(p+".type_name", "%q, want %q", n, want)
		}
	}
	if md, ok := rec["metadata"].(map[string]any); ok && md["version"] != v.s.Version {
		v.fail(p+".metadata.version", "%v, want the schema's %s", md["version"], v.s.Version)
	}
	for _, k := range []string{"time", "start_time", "end_time"} {
		// Milliseconds since the epoch: after 2001-09-09, before 2286.
		if t, ok := intOf(rec[k]); ok && (t < 1e12 || t >= 1e13) {
			v.fail(p+"."+k, "%d is not a time in milliseconds", t)
		}
	}
}

func intOf(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok || strings.ContainsAny(string(n), ".eE") {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Records returns the OCSF records among the lines of a log (those with a
// class_uid and a metadata object); other lines are skipped.
func Records(log string) [][]byte {
	var out [][]byte
	for line := range strings.Lines(log) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "{") || !strings.Contains(line, `"class_uid"`) || !strings.Contains(line, `"metadata"`) {
			continue
		}
		out = append(out, []byte(line))
	}
	return out
}

// Attr returns the value at a dotted path of a record ("http_response.code"),
// nil when absent. Numbers are json.Number.
func Attr(line []byte, path string) any {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var cur any
	if dec.Decode(&cur) != nil {
		return nil
	}
	for k := range strings.SplitSeq(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}
