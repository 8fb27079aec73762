package bulwark

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The root package's files stand on floors, and a file may reference only
// files on its own floor's allowed list: the direction of the code written
// down as data, as Go's own go/build/deps_test.go does for its packages. A
// new reference that runs the wrong way fails TestArchitecture; a rule is
// loosened only with a reason a reviewer accepts.
//
// The counts it prints (files, references, pairs of files that reference
// each other both ways, exported names, lines) are the figures to follow
// from run to run: `go test -run TestArchitecture -v .`

// archGroup is one floor's worth of files: a name and the files on it.
type archGroup struct {
	name  string
	files []string
}

// archFloor is one floor: its name and its groups of files.
type archFloor struct {
	floor  string
	groups []archGroup
}

// archLoad type-checks the root package's non-test files and returns them
// with what go/types resolved. It finds the compiled export data of the
// imports with `go list -export`, as go/packages does, so that it needs
// nothing outside the standard library.
func archLoad(t *testing.T) (*token.FileSet, []*ast.File, *types.Info) {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", ".").Output()
	if err != nil {
		t.Skipf("go list -export: %v (the architecture test needs the go command)", err)
	}
	exports := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, file, ok := strings.Cut(sc.Text(), "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: imp}
	if _, err := conf.Check("github.com/bulwark-http/bulwark", fset, files, info); err != nil {
		t.Fatalf("type-checking the root package: %v", err)
	}
	return fset, files, info
}

// archRef is one file's use of a name another file of the root declares.
type archRef struct {
	from, to string
	name     string
	private  bool // an unexported struct field
}

// archRefs lists every reference between two different files of the root.
func archRefs(fset *token.FileSet, info *types.Info) []archRef {
	var refs []archRef
	for id, obj := range info.Uses {
		if obj.Pkg() == nil || obj.Pkg().Path() != "github.com/bulwark-http/bulwark" || !obj.Pos().IsValid() {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		v, isVar := obj.(*types.Var)
		refs = append(refs, archRef{from: from, to: to, name: obj.Name(), private: isVar && v.IsField() && !obj.Exported()})
	}
	sort.Slice(refs, func(i, j int) bool {
		a, b := refs[i], refs[j]
		if a.from != b.from {
			return a.from < b.from
		}
		if a.to != b.to {
			return a.to < b.to
		}
		return a.name < b.name
	})
	return refs
}

// archExported counts the root's exported top-level names, and those with
// the exported methods of exported types added.
func archExported(files []*ast.File) (top, withMethods int) {
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					top++
					withMethods++
					continue
				}
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if ix, ok := typ.(*ast.IndexExpr); ok {
					typ = ix.X
				}
				if id, ok := typ.(*ast.Ident); ok && id.IsExported() {
					withMethods++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							top++
							withMethods++
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								top++
								withMethods++
							}
						}
					}
				}
			}
		}
	}
	return top, withMethods
}

// archLines counts the lines of the root's non-test Go files.
func archLines(t *testing.T, fset *token.FileSet, files []*ast.File) int {
	n := 0
	for _, f := range files {
		n += fset.File(f.Pos()).LineCount()
	}
	return n
}

// archFloors is the root package's files, floor by floor, lowest first. A
// file may reference the files of lower floors and of its own group; a
// layer's group is the layer (one file, or a layer and the files that are
// its parts), and no layer references another: where one asks another
// something (the hedger asks the breaker whether it is open), it declares
// a small interface that the other satisfies without knowing it. The top
// floor combines the layers and may reference anything.
var archFloors = []archFloor{
	{"shared words", []archGroup{
		{"words", []string{"doc.go", "errors.go", "headers.go", "priority.go", "inherit.go", "body.go", "classify.go", "fields.go", "sdk.go"}},
	}},
	{"the reporter and the fleet's contract", []archGroup{
		{"report", []string{"observe.go", "fleet.go"}},
	}},
	{"the layers' environment", []archGroup{
		{"env", []string{"layer.go"}},
	}},
	{"layers", []archGroup{
		{"timeout", []string{"deadline_rt.go"}},
		{"span", []string{"span.go"}},
		{"fault", []string{"fault.go"}},
		{"bulkhead", []string{"bulkhead_rt.go", "fleetquota.go"}},
		{"balancer", []string{"balancer_rt.go", "outlier.go", "resolver.go"}},
		{"breaker", []string{"breaker_rt.go", "breakerprobe.go"}},
		{"throttle", []string{"throttle.go"}},
		{"pushback", []string{"retryafter.go"}},
		{"retry", []string{"retry_rt.go", "hedge.go", "idempotency.go"}},
		{"fallback", []string{"fallback.go"}},
	}},
	{"the files that combine them", []archGroup{
		{"combine", []string{"policy.go", "stack.go", "snapshot.go", "route.go", "update.go", "configversion.go", "metrics.go", "upstreamkey.go", "transport.go", "via.go"}},
	}},
}

// archMaxBothWays is a ratchet on the pairs of files that reference each
// other both ways: lower it when a change removes one, never raise it
// without a reason.
const archMaxBothWays = 9

// archMaxExported is a ratchet on the root's exported top-level names (136
// when the root became the client alone; issues after it added the
// names of their features): a new one needs a reason a user would accept,
// and this line says so in review. BreakerChange (issue 29): a breaker's
// recent state changes and its last trip, for the on-call page;
// LatencySnapshot (issue 29): a host's recent p50/p99/p99.9; CallCounts
// (issue 29): a host's calls by final outcome. CallRecord and
// NoRetryFromBelow (issue 30): the record of what happened below that the
// server half attaches, and the don't-retry value that passes a failure up.
// FleetBreakerClosed: the pod that tripped tells the fleet its breaker
// closed, so the pods holding by its trip resume.
const archMaxExported = 153

// archNeverImported are the module's packages that import the root; the
// root importing one would turn the direction around.
var archNeverImported = []string{
	"github.com/bulwark-http/bulwark/server",
	"github.com/bulwark-http/bulwark/debug",
	"github.com/bulwark-http/bulwark/bulwarktest",
}

// archLayers is the index of the layers' floor in archFloors.
var archLayers = slices.IndexFunc(archFloors, func(f archFloor) bool { return f.floor == "layers" })

func TestArchitecture(t *testing.T) {
	fset, files, info := archLoad(t)
	refs := archRefs(fset, info)

	// Where each file stands.
	type place struct {
		floor int
		group string
	}
	where := map[string]place{}
	for i, fl := range archFloors {
		for _, g := range fl.groups {
			for _, f := range g.files {
				where[f] = place{i, g.name}
			}
		}
	}
	for _, f := range files {
		name := filepath.Base(fset.Position(f.Pos()).Filename)
		if _, ok := where[name]; !ok {
			// A file archFloors does not name is a layer of its own: a new
			// layer is a file of its own and needs no line here, and a
			// new shared word that a layer uses fails until it is named.
			where[name] = place{archLayers, strings.TrimSuffix(name, ".go")}
		}
		for _, imp := range f.Imports {
			if path := strings.Trim(imp.Path.Value, `"`); slices.Contains(archNeverImported, path) {
				t.Errorf("%s imports %s, which imports the root: the root never imports its neighbours", name, path)
			}
		}
	}

	edges := map[[2]string][]string{} // from, to → names
	for _, r := range refs {
		k := [2]string{r.from, r.to}
		if !slices.Contains(edges[k], r.name) {
			edges[k] = append(edges[k], r.name)
		}
	}
	checked := 0
	for k, names := range edges {
		from, to := where[k[0]], where[k[1]]
		checked++
		switch {
		case from.floor > to.floor:
		case from.floor == to.floor && (from.group == to.group || archFloors[from.floor].floor == "the files that combine them"):
		case from.floor == to.floor:
			t.Errorf("%s references %s (%s): two %s reference each other only through an interface one of them declares",
				k[0], k[1], strings.Join(names, ", "), archFloors[from.floor].floor)
		default:
			t.Errorf("%s (%s) references %s (%s), a floor above it: %s",
				k[0], archFloors[from.floor].floor, k[1], archFloors[to.floor].floor, strings.Join(names, ", "))
		}
	}
	// The fleet's link reaches the layers only through the interface they
	// implement: it reads none of their fields.
	private := map[string]bool{}
	for _, r := range refs {
		if r.from == "fleet.go" && r.private && where[r.to].floor == archLayers && !private[r.to+"."+r.name] {
			private[r.to+"."+r.name] = true
			t.Errorf("fleet.go reads %s's private field %s", r.to, r.name)
		}
	}

	var both []string
	for k := range edges {
		if k[0] < k[1] {
			if _, ok := edges[[2]string{k[1], k[0]}]; ok {
				both = append(both, k[0]+" ⇄ "+k[1])
			}
		}
	}
	sort.Strings(both)
	top, withMethods := archExported(files)
	t.Logf("root package: %d files, %d non-test lines, %d exported top-level names (%d with the methods of exported types)",
		len(files), archLines(t, fset, files), top, withMethods)
	t.Logf("references between files: %d file-to-file edges checked against %d floors, %d pairs of files that reference each other both ways (at most %d), %d private fields of layers read by the fleet's link",
		checked, len(archFloors), len(both), archMaxBothWays, len(private))
	if os.Getenv("ARCH_EDGES") != "" {
		var ks [][2]string
		for k := range edges {
			ks = append(ks, k)
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i][0]+ks[i][1] < ks[j][0]+ks[j][1] })
		for _, k := range ks {
			t.Logf("  %s → %s: %s", k[0], k[1], strings.Join(edges[k], " "))
		}
	}
	for _, p := range both {
		t.Logf("  both ways: %s", p)
	}
	if top > archMaxExported {
		t.Errorf("%d exported top-level names in the root, more than the %d allowed", top, archMaxExported)
	}
	if len(both) > archMaxBothWays {
		t.Errorf("%d pairs of files reference each other both ways, more than the %d allowed", len(both), archMaxBothWays)
	}
}
