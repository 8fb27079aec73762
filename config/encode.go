package config

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/bulwark-http/bulwark"
	"go.yaml.in/yaml/v3"
)

// Marshal writes cfg in the format Parse reads, as YAML: fields in Go's
// order, only those set (a zero field is not written), map keys sorted,
// code-only values by the name reg holds them under. It fails on a
// function or interface reg does not name, or names twice for funcs made
// by one literal, which cannot be told apart. Config.Source is not
// written. Parse(Marshal(cfg)) is cfg, Source aside, and Marshal of that
// is the same bytes: a Config without a Version comes back with the one
// Parse gives a file that has none, Version(Marshal(cfg)), and a Version
// that is the hash of the file written without it is not written, as
// Parse gives it back from those bytes.
func Marshal(cfg bulwark.Config, reg Registry) ([]byte, error) {
	if !strings.HasPrefix(cfg.Version, "sha256:") {
		return marshal(cfg, reg) // not a hash: written, if set
	}
	version := cfg.Version
	cfg.Version = ""
	out, err := marshal(cfg, reg)
	if err != nil || version == Version(out) {
		return out, err
	}
	cfg.Version = version
	return marshal(cfg, reg)
}

func marshal(cfg bulwark.Config, reg Registry) ([]byte, error) {
	e := encoder{reg: reg}
	n, err := e.node(reflect.ValueOf(cfg), "Config")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

type encoder struct{ reg Registry }

func scalarNode(tag, value string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value}
}

// stringNode is a string scalar, double-quoted when it holds a control
// character or a line break: yaml.v3 would write some of those (a line
// that starts with a tab) as a block its own parser refuses, and a quoted
// string with escapes reads back exactly.
func stringNode(value string) *yaml.Node {
	n := scalarNode("!!str", value)
	if strings.ContainsFunc(value, func(r rune) bool { return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || r == '\u0085' }) {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

func (e encoder) node(v reflect.Value, path string) (*yaml.Node, error) {
	t := v.Type()
	switch kindOf(t) {
	case kindStruct:
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for _, f := range fieldsOf(t) {
			fv := v.Field(f.index)
			if fv.IsZero() {
				continue
			}
			c, err := e.node(fv, path+"."+f.sf.Name)
			if err != nil {
				return nil, err
			}
			m.Content = append(m.Content, scalarNode("!!str", f.key), c)
		}
		if len(m.Content) == 0 {
			m.Style = yaml.FlowStyle
		}
		return m, nil
	case kindPointer:
		if v.IsNil() {
			return scalarNode("!!null", "null"), nil
		}
		return e.node(v.Elem(), path)
	case kindMap:
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int {
			switch {
			case a.String() < b.String():
				return -1
			case a.String() > b.String():
				return 1
			}
			return 0
		})
		for _, k := range keys {
			c, err := e.node(v.MapIndex(k), fmt.Sprintf("%s[%q]", path, k.String()))
			if err != nil {
				return nil, err
			}
			m.Content = append(m.Content, stringNode(k.String()), c)
		}
		if len(m.Content) == 0 {
			m.Style = yaml.FlowStyle
		}
		return m, nil
	case kindSlice:
		s := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for i := range v.Len() {
			c, err := e.node(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			s.Content = append(s.Content, c)
		}
		if len(s.Content) == 0 {
			s.Style = yaml.FlowStyle
		}
		return s, nil
	case kindBytes:
		if b := v.Bytes(); utf8.Valid(b) {
			return stringNode(string(b)), nil
		}
		return scalarNode("!!binary", base64.StdEncoding.EncodeToString(v.Bytes())), nil
	case kindDuration:
		return scalarNode("!!str", v.Interface().(interface{ String() string }).String()), nil
	case kindJitter:
		name, ok := jitterNames[bulwark.Jitter(v.Uint())]
		if !ok {
			return nil, fmt.Errorf("config: %s: Jitter(%d) has no name", path, v.Uint())
		}
		return scalarNode("!!str", name), nil
	case kindCode:
		if v.IsNil() {
			return scalarNode("!!null", "null"), nil
		}
		name, ok := e.reg.nameOf(v)
		if !ok {
			return nil, fmt.Errorf("config: %s: Registry.%s holds no name for this value (or two for funcs made by one literal)", path, registryField(t))
		}
		return scalarNode("!!str", name), nil
	case kindString:
		return stringNode(v.String()), nil
	case kindBool:
		return scalarNode("!!bool", strconv.FormatBool(v.Bool())), nil
	case kindInt:
		return scalarNode("!!int", strconv.FormatInt(v.Int(), 10)), nil
	case kindUint:
		return scalarNode("!!int", strconv.FormatUint(v.Uint(), 10)), nil
	case kindFloat:
		f := v.Float()
		switch {
		case math.IsNaN(f):
			return scalarNode("!!float", ".nan"), nil
		case math.IsInf(f, 1):
			return scalarNode("!!float", ".inf"), nil
		case math.IsInf(f, -1):
			return scalarNode("!!float", "-.inf"), nil
		}
		s := strconv.FormatFloat(f, 'g', -1, t.Bits())
		if !strings.ContainsAny(s, ".e") {
			s += ".0" // "2" would read back as an integer, and be written with a tag
		}
		return scalarNode("!!float", s), nil
	}
	return nil, fmt.Errorf("config: %s: the format has no spelling for %v", path, t)
}
