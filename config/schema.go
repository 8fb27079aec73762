package config

import (
	_ "embed"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
)

//go:generate go test -run TestSchemaUpToDate -update .

// schemaJSON is the format's JSON Schema, schema.json, written by
// TestSchemaUpToDate -update from the Go types and their doc comments.
//
//go:embed schema.json
var schemaJSON []byte

// Schema returns the JSON Schema (draft 2020-12) of the format, for editors
// (a yaml-language-server modeline, or VS Code's json.schemas) and for tools
// that check a file before it is pushed. It is generated from the Go types
// by the same walk that Parse and Marshal follow, and each property carries
// its field's Go doc comment.
func Schema() []byte { return slices.Clone(schemaJSON) }

// durationPattern is what time.ParseDuration accepts.
const durationPattern = `^[-+]?(0|([0-9]*(\.[0-9]*)?(ns|us|µs|μs|ms|s|m|h))+)$`

// schemaOf builds the schema of Config. docs holds the Go doc comment of
// each type ("Retry") and field ("Retry.MaxAttempts"), where known.
//
// It is a small reflection walk rather than a library such as
// github.com/invopop/jsonschema: the format is defined by fieldsOf and
// kindOf (names, durations as strings, functions as Registry names), and a
// library reflecting the types on its own, through json tags bulwark's
// types do not have, would be a second definition of it that needs a
// mapper for each of these rules, and could drift from the decoder.
func schemaOf(docs map[string]string) map[string]any {
	defs := map[string]any{}
	var of func(t reflect.Type) map[string]any
	of = func(t reflect.Type) map[string]any {
		switch kindOf(t) {
		case kindStruct:
			name := t.Name()
			if _, ok := defs[name]; !ok && t != configType {
				defs[name] = nil // taken: a type that refers to itself stops here
				defs[name] = structSchema(t, docs, of)
			}
			return map[string]any{"$ref": "#/$defs/" + name}
		case kindPointer:
			return of(t.Elem())
		case kindMap:
			return map[string]any{"type": "object", "additionalProperties": of(t.Elem())}
		case kindSlice:
			return map[string]any{"type": "array", "items": of(t.Elem())}
		case kindBytes, kindString:
			return map[string]any{"type": "string"}
		case kindDuration:
			return map[string]any{"type": "string", "pattern": durationPattern}
		case kindJitter:
			names := make([]string, 0, len(jitterNames))
			for _, n := range jitterNames {
				names = append(names, n)
			}
			slices.Sort(names)
			return map[string]any{"type": "string", "enum": names}
		case kindCode:
			return map[string]any{"type": "string", "description": "A name in Registry." + registryField(t) + "."}
		case kindBool:
			return map[string]any{"type": "boolean"}
		case kindInt:
			return map[string]any{"type": "integer"}
		case kindUint:
			return map[string]any{"type": "integer", "minimum": 0}
		case kindFloat:
			return map[string]any{"type": "number"}
		}
		return map[string]any{}
	}
	root := structSchema(configType, docs, of)
	root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	root["$id"] = "https://github.com/bulwark-http/bulwark/config/schema.json"
	root["title"] = "bulwark.Config"
	root["$defs"] = defs
	return root
}

func structSchema(t reflect.Type, docs map[string]string, of func(reflect.Type) map[string]any) map[string]any {
	props := map[string]any{}
	for _, f := range fieldsOf(t) {
		p := of(f.sf.Type)
		doc := docs[t.Name()+"."+f.sf.Name]
		if d, ok := p["description"].(string); ok {
			doc = strings.TrimSpace(d + "\n\n" + doc)
		}
		if doc != "" {
			if _, ref := p["$ref"]; ref {
				p = map[string]any{"allOf": []any{p}} // a $ref's siblings are ignored by older drafts' tools
			}
			p["description"] = doc
		}
		props[f.key] = p
	}
	s := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	if doc := docs[t.Name()]; doc != "" {
		s["description"] = doc
	}
	return s
}

// marshalSchema is schemaOf's result as indented JSON, keys sorted.
func marshalSchema(s map[string]any) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
