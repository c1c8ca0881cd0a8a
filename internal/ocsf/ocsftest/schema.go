// Package ocsftest checks OCSF records against the schema of their class,
// for tests: the excerpt of the public OCSF 1.8.0 schema in
// testdata/schema (its README names the source and commit) is compiled the
// way the OCSF server does (a class extends its category's base event and
// base_event; an object extends its parent; the dictionary gives every
// attribute its type), and Validate checks a record against it.
package ocsftest

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

//go:embed all:testdata/schema
var schemaFiles embed.FS

// attr is an attribute's definition once compiled: the dictionary's entry
// merged with the definitions of the class or object and its parents.
type attr struct {
	Type        string                     `json:"type"`
	IsArray     bool                       `json:"is_array"`
	Requirement string                     `json:"requirement"`
	Enum        map[string]json.RawMessage `json:"enum"`
	Sibling     string                     `json:"sibling"`
	Deprecated  json.RawMessage            `json:"@deprecated"`
}

// caption returns the caption of enum value v.
func (a *attr) caption(v string) string {
	var c struct{ Caption string }
	_ = json.Unmarshal(a.Enum[v], &c)
	return c.Caption
}

// scalarType is a dictionary type: its primitive and the constraints
// gathered along its chain (port_t: integer_t, 0..65535).
type scalarType struct {
	primitive string
	rng       []float64
	regex     *regexp.Regexp
	maxLen    int
}

// record is a compiled class or object.
type record struct {
	name, caption string
	uid           int // class_uid (classes only)
	category      string
	// categoryUID and categoryCaption: classes only.
	categoryUID     int
	categoryCaption string
	attrs           map[string]*attr
	atLeastOne      [][]string
	justOne         [][]string
}

// Schema is the compiled schema excerpt.
type Schema struct {
	Version    string
	dict       map[string]map[string]any
	types      map[string]*scalarType
	categories map[string]struct {
		UID     int
		Caption string
	}
	raw     map[string]map[string]any // class and object files by name
	classes map[int]*record
	objects map[string]*record
	mu      sync.Mutex
}

var (
	loadOnce sync.Once
	loaded   *Schema
	loadErr  error
)

// Load compiles the stored schema (once).
func Load() (*Schema, error) {
	loadOnce.Do(func() { loaded, loadErr = compile(schemaFiles) })
	return loaded, loadErr
}

func readJSON(fsys fs.FS, name string, v any) error {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("schema %s: %w", name, err)
	}
	return nil
}

func compile(files embed.FS) (*Schema, error) {
	fsys, err := fs.Sub(files, "testdata/schema")
	if err != nil {
		return nil, err
	}
	s := &Schema{raw: map[string]map[string]any{}, classes: map[int]*record{}, objects: map[string]*record{}}
	var version struct{ Version string }
	if err := readJSON(fsys, "version.json", &version); err != nil {
		return nil, err
	}
	s.Version = version.Version
	var cats struct {
		Attributes map[string]struct {
			UID     int
			Caption string
		}
	}
	if err := readJSON(fsys, "categories.json", &cats); err != nil {
		return nil, err
	}
	s.categories = cats.Attributes
	var dict struct {
		Attributes map[string]map[string]any
		Types      struct {
			Attributes map[string]map[string]any
		}
	}
	if err := readJSON(fsys, "dictionary.json", &dict); err != nil {
		return nil, err
	}
	s.dict = dict.Attributes
	if s.types, err = compileTypes(dict.Types.Attributes); err != nil {
		return nil, err
	}
	var classNames []string
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".json" || !strings.Contains(p, "/") {
			return err
		}
		var m map[string]any
		if err := readJSON(fsys, p, &m); err != nil {
			return err
		}
		name, _ := m["name"].(string)
		s.raw[name] = m
		if _, ok := m["uid"]; ok && strings.HasPrefix(p, "events/") {
			classNames = append(classNames, name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, name := range classNames {
		r, err := s.compileRecord(name)
		if err != nil {
			return nil, err
		}
		cat, ok := s.categories[r.category]
		if !ok {
			return nil, fmt.Errorf("schema: class %s: unknown category %q", name, r.category)
		}
		r.uid = cat.UID*1000 + int(s.raw[name]["uid"].(float64))
		r.categoryUID, r.categoryCaption = cat.UID, cat.Caption
		// The server replaces base_event's placeholders (0: Uncategorized)
		// with the class's own ids.
		r.attrs["class_uid"].Enum = enumOf(r.uid, r.caption)
		r.attrs["category_uid"].Enum = enumOf(cat.UID, cat.Caption)
		s.classes[r.uid] = r
	}
	return s, nil
}

func compileTypes(raw map[string]map[string]any) (map[string]*scalarType, error) {
	out := map[string]*scalarType{}
	var resolve func(name string, depth int) (*scalarType, error)
	resolve = func(name string, depth int) (*scalarType, error) {
		if t, ok := out[name]; ok {
			return t, nil
		}
		def, ok := raw[name]
		if !ok || depth > 8 {
			return nil, fmt.Errorf("schema: unknown type %q", name)
		}
		t := &scalarType{primitive: name}
		if parent, _ := def["type"].(string); parent != "" {
			p, err := resolve(parent, depth+1)
			if err != nil {
				return nil, err
			}
			cp := *p
			t = &cp
		}
		if r, ok := def["range"].([]any); ok && len(r) == 2 {
			t.rng = []float64{r[0].(float64), r[1].(float64)}
		}
		if re, _ := def["regex"].(string); re != "" {
			c, err := regexp.Compile(re)
			if err != nil {
				return nil, fmt.Errorf("schema: type %s: regex: %w", name, err)
			}
			t.regex = c
		}
		if n, ok := def["max_len"].(float64); ok {
			t.maxLen = int(n)
		}
		out[name] = t
		return t, nil
	}
	for name := range raw {
		if _, err := resolve(name, 0); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// compileRecord compiles the class or object name: its parents'
// attributes first, its own merged over them, the dictionary's entry under
// each. Includes ($include: profiles) are left out: records declare no
// profile.
func (s *Schema) compileRecord(name string) (*record, error) {
	r := &record{name: name, attrs: map[string]*attr{}}
	r.caption, _ = s.raw[name]["caption"].(string)
	merged := map[string]map[string]any{}
	// The chain from the root (object, base_event) down to name.
	var chain []map[string]any
	var cons map[string]any
	for n := name; n != ""; {
		m, ok := s.raw[n]
		if !ok {
			return nil, fmt.Errorf("schema: %q is not in the stored schema", n)
		}
		if len(chain) > 8 {
			return nil, fmt.Errorf("schema: %s: extends loop", name)
		}
		chain = append([]map[string]any{m}, chain...)
		n, _ = m["extends"].(string)
	}
	for _, m := range chain {
		if c, _ := m["category"].(string); c != "" {
			r.category = c
		}
		if c, ok := m["constraints"].(map[string]any); ok {
			// A child's constraint replaces its parent's of the same kind
			// (the server deep-merges the definitions).
			cons = deepMerge(cons, c)
		}
		own, _ := m["attributes"].(map[string]any)
		for k, v := range own {
			if k == "$include" {
				continue
			}
			def, _ := v.(map[string]any)
			merged[k] = deepMerge(merged[k], def)
		}
	}
	r.atLeastOne = stringLists(cons["at_least_one"])
	r.justOne = stringLists(cons["just_one"])
	for k, def := range merged {
		base, ok := s.dict[k]
		if !ok {
			return nil, fmt.Errorf("schema: %s.%s is not in the dictionary", name, k)
		}
		b, _ := json.Marshal(deepMerge(deepMerge(nil, base), def))
		a := &attr{}
		if err := json.Unmarshal(b, a); err != nil {
			return nil, fmt.Errorf("schema: %s.%s: %w", name, k, err)
		}
		r.attrs[k] = a
	}
	return r, nil
}

func stringLists(v any) [][]string {
	list, _ := v.([]any)
	if len(list) == 0 {
		return nil
	}
	var names []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			names = append(names, s)
		}
	}
	return [][]string{names}
}

// deepMerge returns a copy of dst with src merged over it: maps merge key
// by key (an enum gains the values of both), anything else is replaced.
func deepMerge(dst, src map[string]any) map[string]any {
	out := make(map[string]any, len(dst)+len(src))
	maps.Copy(out, dst)
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := out[k].(map[string]any); ok {
				out[k] = deepMerge(dm, sm)
				continue
			}
			out[k] = deepMerge(nil, sm)
			continue
		}
		out[k] = v
	}
	return out
}

func enumOf(id int, caption string) map[string]json.RawMessage {
	b, _ := json.Marshal(map[string]string{"caption": caption})
	return map[string]json.RawMessage{strconv.Itoa(id): b}
}

// object returns the compiled object name.
func (s *Schema) object(name string) (*record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.objects[name]; ok {
		return r, nil
	}
	r, err := s.compileRecord(name)
	if err != nil {
		return nil, err
	}
	s.objects[name] = r
	return r, nil
}

// Class returns the compiled class with this class_uid.
func (s *Schema) Class(uid int) (*record, bool) {
	r, ok := s.classes[uid]
	return r, ok
}
