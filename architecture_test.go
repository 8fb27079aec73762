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
	files := archParse(t, fset)
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

// archParse parses the root package's non-test files into fset.
func archParse(t *testing.T, fset *token.FileSet) []*ast.File {
	t.Helper()
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
	return files
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
		{"timeout", []string{"deadline.go"}},
		{"span", []string{"span.go"}},
		{"fault", []string{"fault.go"}},
		{"bulkhead", []string{"bulkhead.go", "fleetquota.go"}},
		{"balancer", []string{"balancer.go", "outlier.go", "resolver.go"}},
		{"breaker", []string{"breaker.go", "breakerprobe.go"}},
		{"throttle", []string{"throttle.go"}},
		{"pushback", []string{"pushback.go"}},
		{"retry", []string{"retry.go", "hedge.go", "idempotency.go"}},
		{"fallback", []string{"fallback.go"}},
	}},
	// The files that combine the layers, each on a floor of its own, so
	// that they too reference each other only downward.
	{"compiled policies", []archGroup{
		{"policies", []string{"policy.go", "route.go", "upstreamkey.go", "configversion.go"}},
	}},
	{"the Config", []archGroup{{"config", []string{"config.go"}}}},
	{"the stacks", []archGroup{{"stack", []string{"stack.go"}}}},
	{"the Transport's hosts", []archGroup{{"hosts", []string{"hosts.go"}}}},
	{"the Snapshot", []archGroup{{"snapshot", []string{"snapshot.go"}}}},
	{"the metrics", []archGroup{{"metrics", []string{"metrics.go"}}}},
	{"Update", []archGroup{{"update", []string{"update.go"}}}},
	{"the public face", []archGroup{{"transport", []string{"transport.go", "via.go"}}}},
}

// archMaxBothWays is a ratchet on the pairs of files that reference each
// other both ways: lower it when a change removes one, never raise it
// without a reason.
const archMaxBothWays = 4

// archMaxExported is a ratchet on the root's exported top-level names.
const archMaxExported = 139

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
		case from.floor == to.floor && from.group == to.group:
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

// commentBlockMax is the longest comment block allowed in non-test code,
// the package doc aside: a doc comment says what a user of the API needs
// and why, briefly, and the reasoning behind a rule or a figure lives in
// docs/design.md.
const commentBlockMax = 25

// commentBlockDirs are the directories whose non-test files
// TestCommentBlocks reads: the root and its neighbours (the nested
// modules config and redisfleet are read as files, not built).
var commentBlockDirs = []string{".", "server", "debug", "bulwarktest", "config", "redisfleet", "internal/*", "redisfleet/cmd/*"}

// commentBlocksOver returns "file:line: n lines" for every comment block of
// src longer than max lines, the package doc aside.
func commentBlocksOver(fset *token.FileSet, name string, src any, max int) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var over []string
	for _, cg := range f.Comments {
		if cg == f.Doc {
			continue // the package doc
		}
		start, end := fset.Position(cg.Pos()), fset.Position(cg.End())
		if n := end.Line - start.Line + 1; n > max {
			over = append(over, fmt.Sprintf("%s:%d: %d lines", name, start.Line, n))
		}
	}
	return over, nil
}

func TestCommentBlocks(t *testing.T) {
	// The check must see a block one line too long: a planted block of
	// commentBlockMax+1 lines fails it, one of commentBlockMax passes.
	for _, n := range []int{commentBlockMax, commentBlockMax + 1} {
		src := "// Package p is planted.\npackage p\n\n" + strings.Repeat("// planted\n", n) + "var x int\n"
		over, err := commentBlocksOver(token.NewFileSet(), "planted.go", src, commentBlockMax)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(over) == 1, n > commentBlockMax; got != want {
			t.Fatalf("a planted block of %d lines: reported %v, want reported %v", n, over, want)
		}
	}

	fset := token.NewFileSet()
	read := 0
	for _, pattern := range commentBlockDirs {
		dirs, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, dir := range dirs {
			names, err := filepath.Glob(filepath.Join(dir, "*.go"))
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range names {
				if strings.HasSuffix(name, "_test.go") {
					continue
				}
				over, err := commentBlocksOver(fset, name, nil, commentBlockMax)
				if err != nil {
					t.Fatal(err)
				}
				read++
				for _, o := range over {
					t.Errorf("%s, more than %d: say what and why briefly, and move the reasoning to docs/design.md", o, commentBlockMax)
				}
			}
		}
	}
	if read == 0 {
		t.Fatal("no file read")
	}
	t.Logf("%d non-test files read in %v", read, commentBlockDirs)
}

// archMaxFuncLines and archMaxCyclo bound each non-test function of the
// root: its lines, signature to closing brace, and its cyclomatic
// complexity, counted as gocyclo counts it (archCyclo). A function past
// either is split into steps a reader can name.
const (
	archMaxFuncLines = 60
	archMaxCyclo     = 15
)

// archBigFuncs are the functions past archMaxCyclo that TestFunctionSize
// still lets pass, each at most at its size here, so that none grows. Each
// is one ordered list of checks that reads top to bottom as its rule's
// contract, which a split would scatter; none is past archMaxFuncLines.
var archBigFuncs = map[string]struct{ lines, cyclo int }{
	"shareable":          {54, 29}, // RFC 9111's rules, in the order the RFC gives them
	"classify":           {55, 23}, // the one classification, in its documented order
	"retriedAbove":       {38, 19}, // the SDKs' attempt headers, one per case
	"retryLayer.prepare": {30, 16}, // the replay rules, in order
}

// archCyclo is fn's cyclomatic complexity as gocyclo counts it: one, plus
// one per if, for, range, non-default case and select case, && and ||.
// Hand-written, not gocyclo itself, since the root's tests take no
// dependency for a forty-line count.
func archCyclo(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// archFuncName is fn's name, with its receiver's type: "T.m" or "f".
func archFuncName(fn *ast.FuncDecl) string {
	if fn.Recv == nil {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if ix, ok := typ.(*ast.IndexExpr); ok {
		typ = ix.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

// archFuncSizes measures every function declared in src: name → lines and
// cyclomatic complexity.
func archFuncSizes(fset *token.FileSet, files []*ast.File) map[string][2]int {
	out := map[string][2]int{}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			out[archFuncName(fn)] = [2]int{lines, archCyclo(fn)}
		}
	}
	return out
}

func TestFunctionSize(t *testing.T) {
	// The count itself, on a planted function: 1, +1 if, +1 &&, +1 for,
	// +2 cases (not the default), +1 ||, +1 range.
	planted := `package p
func f(a, b bool, xs []int) {
	if a && b {
		for {
			switch {
			case a:
			case b || a:
			default:
			}
		}
	}
	for range xs {
	}
}`
	pf := token.NewFileSet()
	af, err := parser.ParseFile(pf, "p.go", planted, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := archFuncSizes(pf, []*ast.File{af})["f"]; got != [2]int{13, 8} {
		t.Fatalf("planted f: lines, cyclomatic complexity = %v, want [13 8]", got)
	}

	fset := token.NewFileSet()
	files := archParse(t, fset)
	sizes := archFuncSizes(fset, files)
	var largest string
	for name, s := range sizes {
		if largest == "" || s[0] > sizes[largest][0] {
			largest = name
		}
		limit, allowed := archBigFuncs[name]
		if !allowed {
			limit.lines, limit.cyclo = archMaxFuncLines, archMaxCyclo
		}
		if s[0] > limit.lines || s[1] > limit.cyclo {
			t.Errorf("%s: %d lines, cyclomatic complexity %d: more than %d and %d", name, s[0], s[1], limit.lines, limit.cyclo)
		}
	}
	for name, limit := range archBigFuncs {
		s, ok := sizes[name]
		switch {
		case !ok:
			t.Errorf("archBigFuncs names %s, which the root no longer declares: drop it", name)
		case s[0] <= archMaxFuncLines && s[1] <= archMaxCyclo:
			t.Errorf("%s is within bounds now (%d lines, cyclomatic complexity %d): drop it from archBigFuncs", name, s[0], s[1])
		case s[0] < limit.lines || s[1] < limit.cyclo:
			t.Errorf("%s shrank to %d lines, cyclomatic complexity %d: lower its archBigFuncs entry", name, s[0], s[1])
		}
	}
	t.Logf("%d functions; %d tolerated past %d lines or cyclomatic complexity %d; the largest: %s, %d lines",
		len(sizes), len(archBigFuncs), archMaxFuncLines, archMaxCyclo, largest, sizes[largest][0])
}
