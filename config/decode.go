package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/bulwark-http/bulwark"
	"go.yaml.in/yaml/v3"
)

// MaxBytes is the largest file Parse accepts: a configuration is a few
// kilobytes, and a file much larger is a mistake or an attack.
const MaxBytes = 1 << 20

// MaxDepth is the deepest nesting of nodes Parse accepts, counting the
// file's top mapping as 1. The format itself needs 8, at a route's
// constant answer's header values (top → routes → pattern → fallback →
// constant → header → name → value).
const MaxDepth = 16

// Error is a file, or a part of one, that Parse refused. It names where:
// the file, the line and column of the offending key or value, the upstream
// or route it belongs to, and the field by its name in the file.
type Error struct {
	File         string
	Line, Column int    // 1-based; 0 when the error is the whole file's
	Upstream     string // the upstreams key; "" outside one
	Route        string // the routes key; "" outside one
	Default      bool   // the value is under default
	Field        string // e.g. "retry.maxAttempts", or "maxHosts"; "" for the file as a whole
	Msg          string // why
	// Err is the underlying error, if any: a *bulwark.ConfigError when
	// bulwark's validation refused the value, a YAML syntax error, or an
	// I/O error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	switch {
	case e.Route != "":
		fmt.Fprintf(&b, ": route %q", e.Route)
	case e.Upstream != "":
		fmt.Fprintf(&b, ": upstream %q", e.Upstream)
	case e.Default:
		b.WriteString(": default")
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// Unwrap is the underlying error; errors.Is(err, bulwark.ErrInvalidConfig)
// holds for a value bulwark's validation refused.
func (e *Error) Unwrap() error { return e.Err }

// Parse turns the bytes of a YAML or JSON file into a validated Config: the
// function a loader calls, for a file or for a configuration received from
// elsewhere. source names where the bytes came from (a path) for errors and
// for Config.Source. The Config's Version is the file's version field, or,
// when it has none, "sha256:" and the first 16 hex digits of the bytes'
// SHA-256, so that the same bytes always give the same version.
//
// Parse refuses, with an *Error: more than MaxBytes, an empty file, more
// than one document, nesting deeper than MaxDepth, YAML aliases, duplicate
// keys, unknown fields, a value of the wrong type, a name reg does not hold,
// and any value bulwark.New would refuse: it validates the Config as New
// does (bulwark.Config.Validate, which builds nothing). A
// Bulkhead.FleetRate needs a Fleet that leases quota: it is checked
// against the Fleet the file names, and, in a file that names none, left
// to New, against the Fleet the program sets, or to Update, against the
// Transport's.
func Parse(data []byte, source string, reg Registry) (bulwark.Config, error) {
	cfg, d, err := decode(data, source, reg)
	if err != nil {
		return bulwark.Config{}, err
	}
	if err := validate(cfg); err != nil {
		return bulwark.Config{}, d.place(err)
	}
	return cfg, nil
}

// Version is the version Parse gives bytes with no version field.
func Version(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// VersionOf is the version Parse gives data, whether or not it accepts
// the rest: the file's version field, read as Parse reads it, when the
// bytes are YAML whose top mapping has one that is a string, even if
// another field is unknown, of the wrong type or refused by validation;
// else Version(data). A refusal is named by it, so a file that declares
// v7 is refused as v7 wherever the refusal shows.
func VersionOf(data []byte) string {
	if v := declaredVersion(data); v != "" {
		return v
	}
	return Version(data)
}

// declaredVersion is the version field of data's top mapping, decoded as
// decode decodes it; "" when there is none or it does not decode.
func declaredVersion(data []byte) string {
	if len(data) > MaxBytes {
		return ""
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return ""
	}
	root, key := doc.Content[0], keyName("Version")
	var version string
	found := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value != key {
			continue
		}
		if found {
			return "" // a duplicate key: which one the file meant is not known
		}
		found = true
		d := &decoder{pos: map[string]*yaml.Node{}}
		if d.value(root.Content[i+1], reflect.ValueOf(&version).Elem(), at{}) != nil {
			return ""
		}
	}
	return version
}

// decoder maps a YAML node tree onto a Config, keeping where each value
// was, so that a refusal by bulwark's validation can be placed.
type decoder struct {
	file string
	reg  Registry
	// pos is the node of each value decoded, by its Go path from Config
	// ("Upstreams[pay].Retry.MaxAttempts").
	pos map[string]*yaml.Node
}

// at is where a value is: its upstream or route, its field path in the
// file's names and in Go's.
type at struct {
	upstream, route string
	dflt            bool
	field           string
	goPath          string
}

func (a at) child(key, goName string) at {
	a.field = join(a.field, key)
	a.goPath = join(a.goPath, goName)
	return a
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	if b == "" {
		return a
	}
	return a + "." + b
}

func (d *decoder) errorf(n *yaml.Node, a at, err error, format string, args ...any) *Error {
	e := &Error{File: d.file, Upstream: a.upstream, Route: a.route, Default: a.dflt, Field: a.field,
		Msg: fmt.Sprintf(format, args...), Err: err}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

func decode(data []byte, source string, reg Registry) (bulwark.Config, *decoder, error) {
	d := &decoder{file: source, reg: reg, pos: map[string]*yaml.Node{}}
	var cfg bulwark.Config
	if len(data) > MaxBytes {
		return cfg, d, d.errorf(nil, at{}, nil, "%d bytes, more than the %d allowed", len(data), MaxBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, d, d.errorf(nil, at{}, nil, "empty file: write {} for a Config with every default")
		}
		return cfg, d, d.syntax(err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		if err != nil {
			return cfg, d, d.syntax(err)
		}
		return cfg, d, d.errorf(&more, at{}, nil, "a second document: a file holds one Config")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) != 1 {
			return cfg, d, d.errorf(root, at{}, nil, "empty file: write {} for a Config with every default")
		}
		root = root.Content[0]
	}
	if err := d.check(root, 1); err != nil {
		return cfg, d, err
	}
	if root.Kind != yaml.MappingNode {
		return cfg, d, d.errorf(root, at{}, nil, "want a mapping of Config's fields, got %s", describe(root))
	}
	if err := d.value(root, reflect.ValueOf(&cfg).Elem(), at{}); err != nil {
		return cfg, d, err
	}
	if cfg.Version == "" {
		cfg.Version = Version(data)
	}
	cfg.Source = source
	return cfg, d, nil
}

// syntax is a YAML parser's error as an *Error; yaml.v3 puts the line in
// its text ("yaml: line 3: ..."), and no column.
func (d *decoder) syntax(err error) *Error {
	e := &Error{File: d.file, Msg: err.Error(), Err: err}
	var line int
	if _, serr := fmt.Sscanf(err.Error(), "yaml: line %d:", &line); serr == nil && line > 0 {
		e.Line, e.Column = line, 1
		if _, rest, ok := strings.Cut(err.Error(), ": "); ok {
			if _, msg, ok := strings.Cut(rest, ": "); ok {
				e.Msg = msg
			}
		}
	}
	return e
}

// check refuses aliases and nesting past MaxDepth before any value is
// decoded.
func (d *decoder) check(n *yaml.Node, depth int) error {
	if n.Kind == yaml.AliasNode {
		return d.errorf(n, at{}, nil, "YAML aliases are not allowed: write the value out")
	}
	if depth > MaxDepth {
		return d.errorf(n, at{}, nil, "nested more than %d levels deep", MaxDepth)
	}
	for _, c := range n.Content {
		if err := d.check(c, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// describe names a node's type for an error.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!int":
		return "the integer " + n.Value
	case "!!float":
		return "the number " + n.Value
	case "!!bool":
		return n.Value
	}
	return fmt.Sprintf("%s %q", n.ShortTag(), n.Value)
}

// value decodes n into v, a settable value of one of the format's types.
func (d *decoder) value(n *yaml.Node, v reflect.Value, a at) error {
	d.pos[a.goPath] = n
	if n.ShortTag() == "!!null" {
		return nil // absent: the zero value, as if the key were not there
	}
	t := v.Type()
	k := kindOf(t)
	scalar := func(want string, tags ...string) error {
		if n.Kind != yaml.ScalarNode || !slices.Contains(tags, n.ShortTag()) {
			return d.errorf(n, a, nil, "want %s, got %s", want, describe(n))
		}
		return nil
	}
	switch k {
	case kindStruct:
		return d.structure(n, v, a)
	case kindPointer:
		p := reflect.New(t.Elem())
		if err := d.structure(n, p.Elem(), a); err != nil {
			return err
		}
		v.Set(p)
	case kindMap:
		return d.mapping(n, v, a)
	case kindSlice:
		if n.Kind != yaml.SequenceNode {
			return d.errorf(n, a, nil, "want a sequence, got %s", describe(n))
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, c := range n.Content {
			ca := a
			ca.field = fmt.Sprintf("%s[%d]", a.field, i)
			ca.goPath = fmt.Sprintf("%s[%d]", a.goPath, i)
			if err := d.value(c, s.Index(i), ca); err != nil {
				return err
			}
		}
		v.Set(s)
	case kindBytes:
		if err := scalar("a string", "!!str", "!!binary"); err != nil {
			return err
		}
		if n.ShortTag() == "!!binary" {
			b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(n.Value), ""))
			if err != nil {
				return d.errorf(n, a, err, "bad base64: %v", err)
			}
			v.SetBytes(b)
		} else {
			v.SetBytes([]byte(n.Value))
		}
	case kindDuration:
		if err := scalar(`a duration such as "150ms"`, "!!str"); err != nil {
			return err
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			return d.errorf(n, a, err, `want a duration such as "150ms", got %q`, n.Value)
		}
		v.SetInt(int64(dur))
	case kindJitter:
		names := slices.Sorted(func(yield func(string) bool) {
			for _, s := range jitterNames {
				if !yield(s) {
					return
				}
			}
		})
		if err := scalar("one of "+strings.Join(names, ", "), "!!str"); err != nil {
			return err
		}
		for j, s := range jitterNames {
			if s == n.Value {
				v.SetUint(uint64(j))
				return nil
			}
		}
		return d.errorf(n, a, nil, "want one of %s, got %q", strings.Join(names, ", "), n.Value)
	case kindCode:
		if err := scalar("a name in Registry."+registryField(t), "!!str"); err != nil {
			return err
		}
		if registryField(t) == "" {
			return d.errorf(n, a, nil, "no Registry map holds a %v", t)
		}
		fv, ok := d.reg.lookup(t, n.Value)
		if !ok {
			return d.errorf(n, a, nil, "unknown name %q: Registry.%s holds %s", n.Value, registryField(t), d.reg.list(t))
		}
		v.Set(fv)
	case kindString:
		if err := scalar("a string", "!!str"); err != nil {
			return err
		}
		v.SetString(n.Value)
	case kindBool:
		if err := scalar("true or false", "!!bool"); err != nil {
			return err
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			return d.errorf(n, a, err, "want true or false, got %s", describe(n))
		}
		v.SetBool(b)
	case kindInt:
		if err := scalar("an integer", "!!int"); err != nil {
			return err
		}
		var i int64
		if err := n.Decode(&i); err != nil || v.OverflowInt(i) {
			return d.errorf(n, a, err, "the integer %s is out of range", n.Value)
		}
		v.SetInt(i)
	case kindUint:
		if err := scalar("an integer ≥ 0", "!!int"); err != nil {
			return err
		}
		var u uint64
		if err := n.Decode(&u); err != nil || v.OverflowUint(u) {
			return d.errorf(n, a, err, "the integer %s is out of range", n.Value)
		}
		v.SetUint(u)
	case kindFloat:
		if err := scalar("a number", "!!float", "!!int"); err != nil {
			return err
		}
		var f float64
		if err := n.Decode(&f); err != nil {
			return d.errorf(n, a, err, "want a number, got %s", describe(n))
		}
		if t.Kind() == reflect.Float32 && !math.IsInf(f, 0) && math.Abs(f) > math.MaxFloat32 {
			return d.errorf(n, a, nil, "the number %s is out of range", n.Value)
		}
		v.SetFloat(f)
	default:
		return d.errorf(n, a, nil, "the format has no spelling for %v", t)
	}
	return nil
}

// keys walks a mapping's pairs, refusing non-scalar and duplicate keys.
func (d *decoder) keys(n *yaml.Node, a at, each func(key, val *yaml.Node) error) error {
	seen := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
			return d.errorf(k, a, nil, "want a name as the key, got %s", describe(k))
		}
		if first, dup := seen[k.Value]; dup {
			return d.errorf(k, a.child(k.Value, k.Value), nil, "duplicate key %q (first at line %d, column %d)", k.Value, first.Line, first.Column)
		}
		seen[k.Value] = k
		if err := each(k, val); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) structure(n *yaml.Node, v reflect.Value, a at) error {
	if n.Kind != yaml.MappingNode {
		return d.errorf(n, a, nil, "want a mapping of %s's fields, got %s", v.Type().Name(), describe(n))
	}
	fields := fieldsOf(v.Type())
	return d.keys(n, a, func(k, val *yaml.Node) error {
		i := slices.IndexFunc(fields, func(f field) bool { return f.key == k.Value })
		if i < 0 {
			names := make([]string, len(fields))
			for j, f := range fields {
				names[j] = f.key
			}
			return d.errorf(k, a.child(k.Value, k.Value), nil, "unknown field %q; %s has %s", k.Value, v.Type().Name(), strings.Join(names, ", "))
		}
		f := fields[i]
		ca := a.child(f.key, f.sf.Name)
		if v.Type() == configType && f.sf.Name == "Default" {
			ca.dflt = true
			ca.field = ""
		}
		return d.value(val, v.Field(f.index), ca)
	})
}

func (d *decoder) mapping(n *yaml.Node, v reflect.Value, a at) error {
	if n.Kind != yaml.MappingNode {
		return d.errorf(n, a, nil, "want a mapping, got %s", describe(n))
	}
	t := v.Type()
	m := reflect.MakeMapWithSize(t, len(n.Content)/2)
	// The maps of Config name the upstream or route that each entry is.
	section := ""
	if a.upstream == "" && a.route == "" && !a.dflt {
		section = a.goPath
	}
	err := d.keys(n, a, func(k, val *yaml.Node) error {
		ca := a
		ca.goPath = fmt.Sprintf("%s[%s]", a.goPath, k.Value)
		switch section {
		case "Upstreams":
			ca = at{upstream: k.Value, goPath: ca.goPath}
		case "Routes":
			ca = at{route: k.Value, goPath: ca.goPath}
		default:
			ca.field = join(a.field, k.Value)
		}
		e := reflect.New(t.Elem()).Elem()
		if err := d.value(val, e, ca); err != nil {
			return err
		}
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(t.Key()), e)
		return nil
	})
	if err != nil {
		return err
	}
	v.Set(m)
	return nil
}

// place turns an error of bulwark's validation into an *Error at the value
// it names: the upstream's or route's own field, else Default's (where an
// inherited value came from), else the nearest enclosing value.
func (d *decoder) place(err error) error {
	var ce *bulwark.ConfigError
	if !errors.As(err, &ce) {
		return &Error{File: d.file, Msg: err.Error(), Err: err}
	}
	var prefixes []string
	switch {
	case ce.Route != "":
		prefixes = append(prefixes, "Routes["+ce.Route+"]")
	case ce.Upstream != "":
		prefixes = append(prefixes, "Upstreams["+ce.Upstream+"]")
	}
	prefixes = append(prefixes, "Default", "")
	e := &Error{File: d.file, Upstream: ce.Upstream, Route: ce.Route, Default: ce.Upstream == "" && ce.Route == "" && !topLevel(ce.Field),
		Field: fileField(ce.Field), Msg: fmt.Sprintf("value %v: %s", ce.Value, ce.Reason), Err: err}
	if ce.Field == "" {
		e.Msg = ce.Reason
	}
	for path := ce.Field; ; {
		for _, p := range prefixes {
			if n, ok := d.pos[join(p, path)]; ok && (p != "" || path != "") {
				e.Line, e.Column = n.Line, n.Column
				return e
			}
		}
		i := strings.LastIndexByte(path, '.')
		if i < 0 {
			if path == "" {
				return e
			}
			path = ""
			continue
		}
		path = path[:i]
	}
}

// topLevel reports whether a ConfigError's field is Config's own, not a
// Policy's.
func topLevel(goField string) bool {
	name, _, _ := strings.Cut(goField, ".")
	_, ok := configType.FieldByName(name)
	return ok && name != ""
}

// fileField spells a Go field path ("Retry.MaxAttempts") in the file's
// names ("retry.maxAttempts").
func fileField(goField string) string {
	if goField == "" {
		return ""
	}
	parts := strings.Split(goField, ".")
	for i, p := range parts {
		parts[i] = keyName(p)
	}
	return strings.Join(parts, ".")
}

// list names the values reg holds for type t, for an error.
func (reg Registry) list(t reflect.Type) string {
	m, ok := reg.names(t)
	if !ok || m.Len() == 0 {
		return "none"
	}
	var names []string
	for _, k := range m.MapKeys() {
		names = append(names, fmt.Sprintf("%q", k.String()))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
