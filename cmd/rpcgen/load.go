// Loading the package with go/packages, rpcgen's earlier output hidden.

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

// pkgInfo is the package the generated code belongs to.
type pkgInfo struct {
	name string // package name
	path string // import path
	dir  string // absolute directory
	// goroot is the go command's GOROOT, where the standard library is.
	goroot string
	// scope holds the package-level names, those of its _test.go files
	// included and those of files written by rpcgen excluded, with where
	// they are declared.
	scope map[string]token.Position
	// aliases are the names that the files declaring the interfaces give
	// their imports, by import path; the generated file reuses them when it
	// can.
	aliases map[string]string
	// constraints holds the build constraint of each file that has one, by
	// base name: the generated file carries its interfaces' files'.
	constraints map[string]constraint.Expr
	// generated holds the files rpcgen wrote earlier that are in the
	// package as loaded, by base name, with their content. They are hidden
	// from the loader, so their declarations are not in scope.
	generated map[string][]byte
	// kept holds the package-level names declared by the generated files
	// that this run does not replace, with where.
	kept map[string]token.Position
}

const loadMode = packages.NeedName | packages.NeedFiles | packages.NeedSyntax |
	packages.NeedTypes | packages.NeedTypesInfo | packages.NeedForTest

// loader loads the target package and, on demand, the packages that declare
// embedded interfaces.
type loader struct {
	cfg     config
	dir     string // absolute
	overlay map[string][]byte
	root    *packages.Package
	others  map[string]*packages.Package // by import path
	flags   []string                     // build flags taken out of GOFLAGS
	env     []string                     // environment of the go command; nil inherits
	goroot  string
}

// loadPackage reads the package in cfg.dir.
func loadPackage(cfg config) (*loader, *pkgInfo, error) {
	dir := cfg.dir
	if dir == "" {
		dir = "."
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("rpcgen: %w", err)
	}
	l := &loader{cfg: cfg, dir: abs, others: map[string]*packages.Package{}}
	gen, err := generatedFiles(abs)
	if err != nil {
		return nil, nil, err
	}
	l.overlay = hideGenerated(abs, gen)
	if err := l.readGoEnv(); err != nil {
		return nil, nil, err
	}
	// With its tests, so that the names the package's own test files
	// declare count: they share the package block with the generated code.
	pc := l.packagesConfig()
	pc.Tests = true
	pkgs, err := packages.Load(pc, ".")
	if err != nil {
		return nil, nil, fmt.Errorf("rpcgen: loading %s: %w", dir, err)
	}
	// If the package has tests, pkgs holds three more packages: the package
	// compiled with its _test.go files (ID "path [path.test]", PkgPath
	// path), the external test package and the test binary. All but the
	// binary have ForTest set to the package's path.
	forTest := ""
	for _, p := range pkgs {
		if p.ForTest != "" {
			forTest = p.ForTest
		}
	}
	var withTests *packages.Package
	for _, p := range pkgs {
		switch {
		case len(pkgs) == 1 || p.ID == forTest:
			l.root = p
		case p.PkgPath == forTest:
			withTests = p
		}
	}
	if l.root == nil {
		return nil, nil, fmt.Errorf("rpcgen: %s: found %d Go packages, want 1 (run rpcgen inside a module)", dir, len(pkgs))
	}
	if err := usable(l.root); err != nil {
		return nil, nil, err
	}
	info := &pkgInfo{
		name:        l.root.Types.Name(),
		path:        l.root.PkgPath,
		dir:         abs,
		goroot:      l.goroot,
		scope:       map[string]token.Position{},
		aliases:     map[string]string{},
		constraints: map[string]constraint.Expr{},
		generated:   map[string][]byte{},
	}
	for _, path := range l.root.GoFiles {
		if src, ok := gen[filepath.Base(path)]; ok {
			info.generated[filepath.Base(path)] = src
		}
	}
	for _, n := range l.root.Types.Scope().Names() {
		info.scope[n] = l.root.Fset.Position(l.root.Types.Scope().Lookup(n).Pos())
	}
	if withTests != nil && withTests.Types != nil {
		for _, n := range withTests.Types.Scope().Names() {
			pos := withTests.Fset.Position(withTests.Types.Scope().Lookup(n).Pos())
			if strings.HasSuffix(pos.Filename, "_test.go") {
				info.scope[n] = pos
			}
		}
	}
	var errs errList
	for _, f := range l.root.Syntax {
		x, err := fileConstraint(l.root.Fset, f)
		if err != nil {
			errs.add(err)
		} else if x != nil {
			info.constraints[filepath.Base(l.root.Fset.Position(f.Package).Filename)] = x
		}
	}
	if err := errs.err(); err != nil {
		return nil, nil, err
	}
	return l, info, nil
}

// packagesConfig is the go/packages configuration of every load of a run.
func (l *loader) packagesConfig() *packages.Config {
	c := &packages.Config{Mode: loadMode, Dir: l.dir, Env: l.env, Overlay: l.overlay, BuildFlags: l.flags}
	if len(l.cfg.tags) > 0 {
		c.BuildFlags = append(slices.Clip(c.BuildFlags), "-tags="+strings.Join(l.cfg.tags, ","))
	}
	return c
}

// readGoEnv asks the go command for GOFLAGS and GOROOT, and moves -modfile
// from GOFLAGS to the build flags.
func (l *loader) readGoEnv() error {
	cmd := exec.Command("go", "env", "-json", "GOFLAGS", "GOROOT")
	cmd.Dir, cmd.Env = l.dir, l.cfg.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("rpcgen: go env: %w\n%s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var env struct{ GOFLAGS, GOROOT string }
	if err := json.Unmarshal(out, &env); err != nil {
		return fmt.Errorf("rpcgen: go env: %w", err)
	}
	l.goroot = env.GOROOT
	// go/packages first asks the go command its version with
	// GO111MODULE=off, which refuses -modfile (golang.org/issue/48482). It
	// leaves the build flags out of that call, so -modfile goes there.
	var rest []string
	for _, f := range strings.Fields(env.GOFLAGS) {
		name, value, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		if name != "modfile" || !strings.HasPrefix(f, "-") {
			rest = append(rest, f)
			continue
		}
		// Relative to where rpcgen runs, as for a go command run there;
		// the go command of go/packages runs in the package's directory.
		abs, err := filepath.Abs(value)
		if err != nil {
			return fmt.Errorf("rpcgen: GOFLAGS %s: %w", f, err)
		}
		l.flags = []string{"-modfile=" + abs}
	}
	l.env = l.cfg.env
	if l.flags != nil {
		if l.env == nil {
			l.env = os.Environ()
		}
		// The last value of a variable wins.
		l.env = append(slices.Clip(l.env), "GOFLAGS="+strings.Join(rest, " "))
	}
	return nil
}

// pkg loads, once, the package at path with its syntax, to read an embedded
// interface declared there.
func (l *loader) pkg(path string) (*packages.Package, error) {
	if p, ok := l.others[path]; ok {
		return p, nil
	}
	pkgs, err := packages.Load(l.packagesConfig(), path)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", path, err)
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("loading %s: found %d packages", path, len(pkgs))
	}
	if err := usable(pkgs[0]); err != nil {
		return nil, fmt.Errorf("loading %s: %w", path, err)
	}
	l.others[path] = pkgs[0]
	return pkgs[0], nil
}

// notFound explains why the package as loaded lacks the type name: build
// constraints may exclude the files that declare it.
func (l *loader) notFound(name string) error {
	var pos token.Position
	var files []string
	for _, path := range l.root.IgnoredFiles {
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			continue
		}
		src, err := os.ReadFile(path)
		if err != nil || isGenerated(src) {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		id := typeDecl(f, name)
		if id == nil {
			continue
		}
		if files == nil {
			pos = fset.Position(id.Pos())
		}
		file := filepath.Base(path)
		if x, err := fileConstraint(fset, f); err == nil && x != nil {
			file += " (" + x.String() + ")"
		}
		files = append(files, file)
	}
	if files == nil {
		return fmt.Errorf("rpcgen: type %s: not found in package %s (%s)", name, l.root.Name, l.dir)
	}
	what := "the file that declares it"
	if len(files) > 1 {
		what = "the files that declare it"
	}
	return posErr(pos, "type %s: not found in package %s: build constraints exclude %s, %s; pass -tags, or set GOOS or GOARCH, to build it",
		name, l.root.Name, what, strings.Join(files, ", "))
}

// typeDecl returns the name of the package-level type name that f
// declares, or nil.
func typeDecl(f *ast.File, name string) *ast.Ident {
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
			for _, spec := range gd.Specs {
				if ts := spec.(*ast.TypeSpec); ts.Name.Name == name {
					return ts.Name
				}
			}
		}
	}
	return nil
}

// isStd reports whether path names a package of the standard library in
// goroot.
func isStd(goroot, path string) bool {
	// The go command's rule: a path whose first element has no dot, with
	// Go files in its directory below goroot/src. harness/pb has no dot and
	// is a module's.
	if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") || goroot == "" {
		return false
	}
	entries, err := os.ReadDir(filepath.Join(goroot, "src", filepath.FromSlash(path)))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(entries, func(e os.DirEntry) bool {
		return !e.IsDir() && strings.HasSuffix(e.Name(), ".go")
	})
}

// generatedFiles returns the content of each file in dir that rpcgen wrote,
// by base name.
func generatedFiles(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("rpcgen: %w", err)
	}
	gen := map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("rpcgen: %w", err)
		}
		if isGenerated(src) {
			gen[e.Name()] = src
		}
	}
	return gen, nil
}

// hideGenerated returns an overlay that empties the generated files gen of
// dir down to their header and package clause. Stale generated code then
// neither breaks loading nor counts as a declaration. Each file keeps its
// build constraint.
func hideGenerated(dir string, gen map[string][]byte) map[string][]byte {
	overlay := map[string][]byte{}
	for name, src := range gen {
		path := filepath.Join(dir, name)
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			continue // let the loader report it
		}
		end := fset.Position(f.Name.End()).Offset
		overlay[path] = append(src[:end:end], '\n')
	}
	return overlay
}

// headerInterfaces returns the interfaces a generated file says it was
// generated for; false if it does not say (rpcgen did not always).
func headerInterfaces(src []byte) ([]string, bool) {
	for line := range bytes.Lines(src) {
		line = bytes.TrimRight(line, "\r\n")
		if !bytes.HasPrefix(line, []byte("//")) {
			break
		}
		if list, ok := bytes.CutPrefix(line, []byte(interfacesPrefix)); ok {
			return strings.Split(string(list), ", "), true
		}
	}
	return nil, false
}

// isGenerated reports whether src starts with generatedHeader, whatever its
// line ending: a checkout may have turned "\n" into "\r\n".
func isGenerated(src []byte) bool {
	line, _, _ := bytes.Cut(src, []byte("\n"))
	return string(bytes.TrimSuffix(line, []byte("\r")))+"\n" == generatedHeader
}

// usable fails when the package cannot be read at all. Type errors are
// tolerated here (the package may use the code about to be generated); they
// are reported only if they touch an interface rpcgen reads.
func usable(p *packages.Package) error {
	var errs errList
	for _, e := range p.Errors {
		if e.Kind == packages.ParseError {
			errs.add(pkgErr(e))
		}
	}
	if p.Types == nil || p.TypesInfo == nil || len(p.Syntax) == 0 {
		for _, e := range p.Errors {
			if e.Kind != packages.ParseError {
				errs.add(pkgErr(e))
			}
		}
		if len(errs) == 0 {
			errs.add(fmt.Errorf("rpcgen: no Go files in %s", p.PkgPath))
		}
	}
	return errs.err()
}

// pkgErr turns an error of the go command or the type checker into one of
// rpcgen's.
func pkgErr(e packages.Error) error {
	if e.Pos == "" || e.Pos == "-" {
		return errors.New("rpcgen: " + e.Msg)
	}
	return fmt.Errorf("%s: rpcgen: %s", e.Pos, e.Msg)
}
