// Emitting: the Go source of the client stub and server glue of services.

package main

import (
	"bytes"
	"fmt"
	"go/build/constraint"
	"go/format"
	"go/types"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Import paths of the runtime the generated code targets.
const (
	dabbPath       = "github.com/dabbrpc/dabb"
	proxyPath      = "github.com/dabbrpc/dabb/proxy"
	protoCodecPath = "github.com/dabbrpc/dabb/codec/proto" // the default codec
	jsonCodecPath  = "github.com/dabbrpc/dabb/codec/json"  // the codec of plain Go types
)

// codecComments are the comments of the codecs' blank imports.
var codecComments = map[string]string{
	protoCodecPath: "the default codec",
	jsonCodecPath:  "the messages are plain Go types",
}

// localNames are the identifiers generated functions declare; an import with
// one of these names would be shadowed.
var localNames = []string{"c", "ctx", "dec", "err", "impl", "req", "resp", "s", "srv"}

// usedBuiltins are the predeclared identifiers the generated code uses; a
// package-level declaration of one would hide it.
var usedBuiltins = []string{"any", "error", "new", "nil", "true"}

// generator accumulates one output file.
type generator struct {
	buf      bytes.Buffer
	pkg      *pkgInfo
	imports  *importSet
	declared [][2]string // the package-level names generated, as declared returns them
}

// Printf appends formatted text to the output.
func (g *generator) Printf(format string, args ...any) {
	fmt.Fprintf(&g.buf, format, args...)
}

// names are the package-level identifiers generated for one service.
type names struct {
	serviceName string // InventoryServiceName
	newClient   string // NewInventoryClient
	client      string // inventoryClient
	register    string // RegisterInventoryServer
	desc        string // InventoryServiceDesc
}

func namesOf(iface string) names {
	return names{
		serviceName: iface + "ServiceName",
		newClient:   "New" + iface + "Client",
		client:      lowerFirst(iface) + "Client",
		register:    "Register" + iface + "Server",
		desc:        iface + "ServiceDesc",
	}
}

func handlerName(iface, m string) string { return "_" + iface + "_" + m + "_Handler" }

func optionsName(iface, m string) string { return lowerFirst(iface) + m + "Options" }

// declared lists every package-level name the services generate, with the
// interface each one is for.
func declared(svcs []*service) [][2]string {
	var out [][2]string
	for _, s := range svcs {
		if s.dubbo != nil {
			for _, name := range dubboNamesOf(s.iface).all() {
				out = append(out, [2]string{s.iface, name})
			}
			for _, m := range s.methods {
				if m.timeout > 0 {
					out = append(out, [2]string{s.iface, dubboCallOptionsName(s.iface, m.name)})
				}
			}
			continue
		}
		n := namesOf(s.iface)
		for _, name := range []string{n.serviceName, n.newClient, n.client, n.register, n.desc} {
			out = append(out, [2]string{s.iface, name})
		}
		for _, m := range s.methods {
			out = append(out, [2]string{s.iface, handlerName(s.iface, m.name)})
			if m.hasOptions() {
				out = append(out, [2]string{s.iface, optionsName(s.iface, m.name)})
			}
		}
	}
	return out
}

// checkNames fails when a generated name is declared twice, by the package
// or by this run's services. It also fails when a package-level name would
// change what the generated code means: one hiding a builtin it uses, or a
// message type named like one of its variables.
func checkNames(pkg *pkgInfo, svcs []*service) error {
	var errs errList
	for _, n := range usedBuiltins {
		if pos, ok := pkg.scope[n]; ok {
			errs.add(posErr(pos, "%s: hides Go's builtin %s, which the generated code uses; rename it", n, n))
		}
	}
	for _, s := range svcs {
		if s.dubbo != nil {
			for _, name := range dubboShadowed(pkg.path, s) {
				errs.add(posErr(pkg.scope[name], "type %s: used by %s, named like a variable of the generated Dubbo client (%s); rename it",
					name, s.iface, strings.Join(stubHiding, ", ")))
			}
			continue
		}
		for _, m := range s.methods {
			for _, t := range []typeRef{m.req, m.resp} {
				if pos, ok := pkg.scope[t.name]; ok && t.path == pkg.path && slices.Contains(localNames, t.name) {
					errs.add(posErr(pos, "type %s: message of %s.%s, named like a variable of the generated code (%s); rename it",
						t.name, s.iface, m.name, strings.Join(localNames, ", ")))
				}
			}
		}
	}
	seen := map[string]string{}
	for _, d := range declared(svcs) {
		iface, n := d[0], d[1]
		if pos, ok := pkg.scope[n]; ok {
			errs.add(posErr(pos, "type %s: the generated %s would clash with this declaration; rename one of them", iface, n))
		} else if pos, ok := pkg.kept[n]; ok {
			file := filepath.Base(pos.Filename)
			others := "another run"
			if list, ok := headerInterfaces(pkg.generated[file]); ok {
				others = strings.Join(list, ", ")
			}
			errs.add(posErr(pos, "type %s: the generated %s is also declared here, in the code generated for %s; rename an interface or a method, or delete %s if it is stale", iface, n, others, file))
		} else if other, ok := seen[n]; ok {
			errs.add(fmt.Errorf("rpcgen: type %s: the generated %s is also generated for %s; rename an interface or a method", iface, n, other))
		}
		seen[n] = iface
	}
	return errs.err()
}

// emit writes the Go source for svcs, all in one file of package pkg.
func emit(pkg *pkgInfo, svcs []*service) ([]byte, error) {
	g := &generator{pkg: pkg, imports: newImportSet(pkg, svcs), declared: declared(svcs)}

	var files []string
	for _, s := range svcs {
		if !slices.Contains(files, s.file) {
			files = append(files, s.file)
		}
	}
	g.Printf("%s// Source: %s\n%s%s\n\n", generatedHeader, strings.Join(files, ", "), interfacesPrefix, strings.Join(ifaceNames(svcs), ", "))
	// The declarations it refers to build only where their files do.
	var build constraint.Expr
	var seen []string
	for _, f := range files {
		if x := pkg.constraints[f]; x != nil && !slices.Contains(seen, x.String()) {
			seen = append(seen, x.String())
			build = and(build, x)
		}
	}
	if build != nil {
		g.Printf("//go:build %s\n\n", build)
	}
	g.Printf("package %s\n\n", pkg.name)
	g.imports.print(g)
	if slices.ContainsFunc(svcs, isDubbo) {
		g.Printf("// This file requires a dabb runtime and a dubbo module that support generated code version 1.\n")
		g.Printf("const (\n\t_ = %s.SupportPackageIsVersion1\n\t_ = %s.SupportPackageIsVersion1\n)\n", g.imports.name(dabbPath), g.imports.name(dubboPath))
	} else {
		g.Printf("// This file requires a dabb runtime that supports generated code version 1.\n")
		g.Printf("const _ = %s.SupportPackageIsVersion1\n", g.imports.name(dabbPath))
	}
	for _, s := range svcs {
		if s.dubbo != nil {
			g.dubboService(s)
			continue
		}
		g.service(s)
	}
	return formatSource(g.buf.Bytes())
}

// formatSource gofmts src. On failure the error shows src with line numbers,
// since the fault is then in rpcgen itself.
func formatSource(src []byte) ([]byte, error) {
	out, err := format.Source(src)
	if err == nil {
		return out, nil
	}
	var b strings.Builder
	for i, line := range strings.Split(string(src), "\n") {
		fmt.Fprintf(&b, "%5d\t%s\n", i+1, line)
	}
	return nil, fmt.Errorf("rpcgen: internal error: generated code does not parse: %w\n%s", err, b.String())
}

// service prints the client stub and the server glue of one service.
func (g *generator) service(s *service) {
	n := namesOf(s.iface)
	ctx := g.imports.name("context") + ".Context"
	proxyName := g.imports.name(proxyPath)
	dabbName := g.imports.name(dabbPath)

	g.Printf("\n// %s is the name %s is registered and looked up under.\n", n.serviceName, s.iface)
	g.Printf("const %s = %s\n", n.serviceName, strconv.Quote(s.name))

	g.Printf("\n// %s returns an implementation of %s that calls the remote service through c.\n", n.newClient, s.iface)
	if s.codecPath() == jsonCodecPath {
		g.Printf("// Its messages are plain Go types: c must use the JSON codec (proxy.WithCodec(\"json\")).\n")
	}
	g.Printf("func %s(c %s.Caller) %s { return &%s{c: c} }\n", n.newClient, proxyName, s.iface, n.client)
	g.Printf("\n// %s implements %s with one call through c per method.\n", n.client, s.iface)
	g.Printf("type %s struct{ c %s.Caller }\n", n.client, proxyName)
	g.Printf("\nvar _ %s = (*%s)(nil)\n", s.iface, n.client)

	for _, m := range s.methods {
		if !m.hasOptions() {
			continue
		}
		var opts []string
		if m.idempotent {
			opts = append(opts, proxyName+".Idempotent()")
		}
		if m.timeout > 0 {
			opts = append(opts, proxyName+".Timeout("+g.duration(m.timeout)+")")
		}
		g.Printf("\n// %s are the call options of %s, from its directives.\n", optionsName(s.iface, m.name), m.name)
		g.Printf("var %s = []%s.CallOption{%s}\n", optionsName(s.iface, m.name), proxyName, strings.Join(opts, ", "))
	}

	for _, m := range s.methods {
		req, resp := g.typeName(m.req), g.typeName(m.resp)
		g.Printf("\n")
		if m.synopsis != "" {
			g.Printf("// %s\n//\n", m.synopsis)
		}
		g.Printf("// %s calls %s.%s.\n", m.name, s.name, m.name)
		g.Printf("func (c *%s) %s(ctx %s, req *%s) (*%s, error) {\n", n.client, m.name, ctx, req, resp)
		g.Printf("\tresp := new(%s)\n", resp)
		opts := ""
		if m.hasOptions() {
			opts = ", " + optionsName(s.iface, m.name) + "..."
		}
		g.Printf("\tif err := c.c.Invoke(ctx, %s, %q, req, resp%s); err != nil {\n", n.serviceName, m.name, opts)
		g.Printf("\t\treturn nil, err\n\t}\n\treturn resp, nil\n}\n")
	}

	g.Printf("\n// %s registers impl with s to serve %s.\n", n.register, s.name)
	g.Printf("func %s(s *%s.Server, impl %s) error {\n", n.register, dabbName, s.iface)
	g.Printf("\treturn s.RegisterService(&%s, impl)\n}\n", n.desc)

	g.Printf("\n// %s describes %s for %s.Server.\n", n.desc, s.name, dabbName)
	g.Printf("var %s = %s.ServiceDesc{\n", n.desc, dabbName)
	g.Printf("\tName: %s,\n", n.serviceName)
	g.Printf("\tHandlerType: (*%s)(nil),\n", s.iface)
	g.Printf("\tMethods: []%s.MethodDesc{\n", dabbName)
	for _, m := range s.methods {
		g.Printf("\t\t{Name: %q, ", m.name)
		if m.idempotent {
			g.Printf("Idempotent: true, ")
		}
		if m.timeout > 0 {
			g.Printf("Timeout: %s, ", g.duration(m.timeout))
		}
		g.Printf("Request: (*%s)(nil), Response: (*%s)(nil), ", g.typeName(m.req), g.typeName(m.resp))
		g.Printf("Handler: %s},\n", handlerName(s.iface, m.name))
	}
	g.Printf("\t},\n}\n")

	for _, m := range s.methods {
		g.Printf("\nfunc %s(srv any, ctx %s, dec func(any) error) (any, error) {\n", handlerName(s.iface, m.name), ctx)
		g.Printf("\treq := new(%s)\n", g.typeName(m.req))
		g.Printf("\tif err := dec(req); err != nil {\n\t\treturn nil, err\n\t}\n")
		g.Printf("\treturn srv.(%s).%s(ctx, req)\n}\n", s.iface, m.name)
	}
}

// typeName is how the generated file spells t.
func (g *generator) typeName(t typeRef) string {
	if t.path == g.pkg.path {
		return t.name
	}
	return g.imports.name(t.path) + "." + t.name
}

// durationUnits are the units a duration is printed in, largest first.
var durationUnits = []struct {
	d    time.Duration
	name string
}{
	{time.Hour, "Hour"},
	{time.Minute, "Minute"},
	{time.Second, "Second"},
	{time.Millisecond, "Millisecond"},
	{time.Microsecond, "Microsecond"},
	{time.Nanosecond, "Nanosecond"},
}

// duration prints d as a constant expression in the largest unit that
// divides it: 200 * time.Millisecond, 2 * time.Second, time.Minute.
func (g *generator) duration(d time.Duration) string {
	timeName := g.imports.name("time")
	for _, u := range durationUnits {
		if d%u.d != 0 {
			continue
		}
		if d == u.d {
			return timeName + "." + u.name
		}
		return strconv.FormatInt(int64(d/u.d), 10) + " * " + timeName + "." + u.name
	}
	panic("unreachable: every duration is a whole number of nanoseconds")
}

// importSet gives every imported package a local name that clashes with
// nothing else in the file or the package.
type importSet struct {
	byPath map[string]string // import path -> local name
	paths  []string          // in the order names were given
	taken  map[string]bool
	blank  []string
	goroot string // for isStd
}

func newImportSet(pkg *pkgInfo, svcs []*service) *importSet {
	s := &importSet{byPath: map[string]string{}, taken: map[string]bool{}, goroot: pkg.goroot}
	for _, n := range types.Universe.Names() {
		s.taken[n] = true
	}
	for n := range pkg.scope {
		s.taken[n] = true
	}
	for n := range pkg.kept {
		s.taken[n] = true
	}
	for _, n := range localNames {
		s.taken[n] = true
	}
	for _, d := range declared(svcs) {
		s.taken[d[1]] = true
	}
	// The runtime first, so its names are the usual ones whenever possible;
	// then the message packages in path order, so the result is stable.
	dubbo := slices.ContainsFunc(svcs, isDubbo)
	if dubbo {
		for _, n := range dubboLocals {
			s.taken[n] = true
		}
	}
	s.add("context", "context")
	if dubbo {
		s.add("errors", "errors")
	}
	if slices.ContainsFunc(svcs, (*service).usesTime) {
		s.add("time", "time")
	}
	s.add(dabbPath, "dabb")
	s.add(proxyPath, "proxy")
	if dubbo {
		s.add(dubboPath, "dubbo")
	}
	// Only the codecs the services use: protobuf cannot encode a plain
	// Go type, and a program that sends protobuf messages as JSON
	// chooses that codec itself.
	for _, sv := range svcs {
		if p := sv.codecPath(); p != "" && !slices.Contains(s.blank, p) {
			s.blank = append(s.blank, p)
		}
	}
	slices.Sort(s.blank)
	type pkgRef struct{ path, name string }
	var user []pkgRef
	for _, sv := range svcs {
		if sv.dubbo != nil {
			dubboPackages(pkg.path, sv, func(path, name string) {
				if alias, ok := pkg.aliases[path]; ok {
					name = alias
				}
				user = append(user, pkgRef{path, name})
			})
			continue
		}
		for _, m := range sv.methods {
			for _, t := range []typeRef{m.req, m.resp} {
				if t.path == pkg.path {
					continue
				}
				name := t.pkg
				if alias, ok := pkg.aliases[t.path]; ok {
					name = alias
				}
				user = append(user, pkgRef{t.path, name})
			}
		}
	}
	// Packages the interface's file imports first, with the names it gives
	// them; then the others (from embedded interfaces). Path order within each.
	slices.SortFunc(user, func(a, b pkgRef) int {
		_, ia := pkg.aliases[a.path]
		_, ib := pkg.aliases[b.path]
		if ia != ib {
			if ia {
				return -1
			}
			return 1
		}
		return strings.Compare(a.path, b.path)
	})
	for _, u := range user {
		s.add(u.path, u.name)
	}
	return s
}

// add gives path a local name: its package name, or that name with the
// smallest number appended that makes it unique.
func (s *importSet) add(path, pkgName string) {
	if _, ok := s.byPath[path]; ok {
		return
	}
	name := pkgName
	for i := 1; s.taken[name]; i++ {
		name = pkgName + strconv.Itoa(i)
	}
	s.taken[name] = true
	s.byPath[path] = name
	s.paths = append(s.paths, path)
}

// name is the local name of an imported path.
func (s *importSet) name(path string) string {
	n, ok := s.byPath[path]
	if !ok {
		panic("rpcgen: internal error: package " + path + " not imported")
	}
	return n
}

// print writes the import declaration in three groups: the standard
// library, the dabb runtime, the message packages.
func (s *importSet) print(g *generator) {
	var std, runtime, user []string
	spec := func(p string) string {
		n := s.byPath[p]
		if n == path.Base(p) {
			return strconv.Quote(p)
		}
		return n + " " + strconv.Quote(p)
	}
	for _, p := range s.paths {
		switch {
		case p == dabbPath || p == proxyPath || p == dubboPath:
			runtime = append(runtime, spec(p))
		case isStd(s.goroot, p):
			std = append(std, spec(p))
		default:
			user = append(user, spec(p))
		}
	}
	for _, p := range s.blank {
		runtime = append(runtime, "_ "+strconv.Quote(p)+" // "+codecComments[p])
	}
	g.Printf("import (\n")
	sep := ""
	for _, group := range [][]string{std, runtime, user} {
		if len(group) == 0 {
			continue
		}
		g.Printf("%s", sep)
		sep = "\n"
		for _, line := range group {
			g.Printf("\t%s\n", line) // format.Source sorts each group by path
		}
	}
	g.Printf(")\n\n")
}

// isDubbo reports whether s is a //dabb:dubbo interface.
func isDubbo(s *service) bool { return s.dubbo != nil }

// lowerFirst lowers the first letter: Inventory -> inventory.
func lowerFirst(s string) string {
	r, size := utf8.DecodeRuneInString(s)
	return string(unicode.ToLower(r)) + s[size:]
}
