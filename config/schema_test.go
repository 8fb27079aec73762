package config

import (
	"encoding/json"
	"flag"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite schema.json from the Go types")

// rootDocs reads the doc comments of the root package's types and their
// fields, from its source one directory up.
func rootDocs(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("../*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	dp, err := doc.NewFromFiles(fset, files, "github.com/bulwark-http/bulwark", doc.AllDecls)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	clean := func(s string) string { return strings.TrimSpace(s) }
	for _, typ := range dp.Types {
		docs[typ.Name] = clean(typ.Doc)
		for _, spec := range typ.Decl.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok {
				continue
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			for _, f := range st.Fields.List {
				text := f.Doc.Text()
				if text == "" {
					text = f.Comment.Text()
				}
				for _, n := range f.Names {
					docs[ts.Name.Name+"."+n.Name] = clean(text)
				}
			}
		}
	}
	return docs
}

// TestSchemaUpToDate: schema.json is what the Go types give; run
// go generate in config/ (this test with -update) after changing them. The
// comparison leaves out the descriptions, so that editing a doc comment in
// the root does not fail this module's tests; go generate refreshes them.
func TestSchemaUpToDate(t *testing.T) {
	s := schemaOf(rootDocs(t))
	if *update {
		got, err := marshalSchema(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("schema.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	var committed map[string]any
	if err := json.Unmarshal(Schema(), &committed); err != nil {
		t.Fatal(err)
	}
	// Through JSON, so both sides have JSON's types.
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var generated map[string]any
	if err := json.Unmarshal(b, &generated); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(noDescriptions(generated), noDescriptions(committed)) {
		t.Fatal("schema.json is out of date with the Go types: run go generate in config/")
	}
}

// noDescriptions is v with every "description" key removed.
func noDescriptions(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			if k != "description" {
				out[k] = noDescriptions(e)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = noDescriptions(e)
		}
		return out
	}
	return v
}

// TestSchemaNamesEveryField: the schema has a property for each field of
// the format, and refuses others.
func TestSchemaNamesEveryField(t *testing.T) {
	var s struct {
		Properties map[string]json.RawMessage
		Defs       map[string]struct {
			AdditionalProperties bool
			Properties           map[string]json.RawMessage
		} `json:"$defs"`
	}
	if err := json.Unmarshal(Schema(), &s); err != nil {
		t.Fatal(err)
	}
	for _, f := range fieldsOf(configType) {
		if _, ok := s.Properties[f.key]; !ok {
			t.Errorf("schema: Config has no property %q", f.key)
		}
	}
	policy, ok := s.Defs["Policy"]
	if !ok || policy.AdditionalProperties {
		t.Fatalf("schema: $defs.Policy missing or open: %+v", policy)
	}
	for _, k := range []string{"timeout", "breaker", "retry", "classify", "fault"} {
		if _, ok := policy.Properties[k]; !ok {
			t.Errorf("schema: Policy has no property %q", k)
		}
	}
}
