// Dubbo interfaces: the //dabb:dubbo and //dabb:java directives, their methods' form, and the typed Dubbo client and server glue.

package main

import (
	"fmt"
	"go/types"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/tools/go/packages"
)

// dubboPath is the package of the Dubbo runtime that generated Dubbo code
// calls through. Only files with a //dabb:dubbo interface import it.
const dubboPath = "github.com/dabbrpc/dabb/dubbo"

// dubboDecl is a //dabb:dubbo directive: the Java interface a Go
// interface declares, and the service key's version and group.
type dubboDecl struct {
	iface, version, group string
}

// javaDecl is a //dabb:java directive: a method's Java name and, when
// given, its Java parameter types.
type javaDecl struct {
	name  string
	types []string
	typed bool // the types were given; "name()" gives none
}

// String is the directive's argument as written canonically.
func (j *javaDecl) String() string {
	if j == nil {
		return ""
	}
	if !j.typed {
		return j.name
	}
	return j.name + "(" + strings.Join(j.types, ",") + ")"
}

// dubboSig is the signature of a method of a Dubbo interface.
type dubboSig struct {
	params []types.Type // after the context
	names  []string     // the source's parameter names, "" where none
	result types.Type   // nil for a void method
}

// parseDubbo reads the arguments of //dabb:dubbo: a package-qualified
// Java interface name, then version=V and group=G in any order.
func parseDubbo(args []string) (*dubboDecl, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("wants a Java interface name such as com.example.Greeter, then optional version=V and group=G")
	}
	if !isJavaClass(args[0]) || !strings.Contains(args[0], ".") {
		return nil, fmt.Errorf("%q is not a package-qualified Java interface name such as com.example.Greeter", args[0])
	}
	d := &dubboDecl{iface: args[0]}
	for _, a := range args[1:] {
		k, v, ok := strings.Cut(a, "=")
		var dst *string
		switch k {
		case "version":
			dst = &d.version
		case "group":
			dst = &d.group
		}
		switch {
		case !ok || dst == nil:
			return nil, fmt.Errorf("%q: want version=V or group=G", a)
		case *dst != "":
			return nil, fmt.Errorf("%s given twice", k)
		case v == "" || strings.ContainsAny(v, "/:,"):
			return nil, fmt.Errorf("%s %q: want a non-empty value without '/', ':' or ','", k, v)
		}
		*dst = v
	}
	return d, nil
}

// parseJava reads the argument of //dabb:java: a Java method name, with
// or without its parameter types in parentheses, such as deduct or
// deduct(long, int).
func parseJava(arg string) (*javaDecl, error) {
	arg = strings.Join(strings.Fields(arg), "")
	name, rest, typed := strings.Cut(arg, "(")
	if !isJavaIdent(name) || strings.HasPrefix(name, "$") {
		return nil, fmt.Errorf("%q is not a Java method name such as deduct or deduct(long,int)", arg)
	}
	j := &javaDecl{name: name, typed: typed}
	if !typed {
		return j, nil
	}
	list, ok := strings.CutSuffix(rest, ")")
	if !ok || strings.ContainsAny(list, "()") {
		return nil, fmt.Errorf("%q: want the parameter types in one pair of parentheses, such as deduct(long,int)", arg)
	}
	if list == "" {
		j.types = []string{}
		return j, nil
	}
	for t := range strings.SplitSeq(list, ",") {
		base := t
		for strings.HasSuffix(base, "[]") {
			base = strings.TrimSuffix(base, "[]")
		}
		if !javaPrimitives[base] && (!isJavaClass(base) || !strings.Contains(base, ".")) {
			return nil, fmt.Errorf("%q: %q is not a Java primitive or a package-qualified class name such as java.lang.String", arg, t)
		}
		j.types = append(j.types, t)
	}
	return j, nil
}

// javaPrimitives are Java's primitive types.
var javaPrimitives = map[string]bool{
	"boolean": true, "byte": true, "char": true, "short": true,
	"int": true, "long": true, "float": true, "double": true,
}

// isJavaClass reports whether s is a Java class name: identifiers
// joined by dots.
func isJavaClass(s string) bool {
	for part := range strings.SplitSeq(s, ".") {
		if !isJavaIdent(part) {
			return false
		}
	}
	return !javaPrimitives[s]
}

// isJavaIdent reports whether s is an ASCII Java identifier.
func isJavaIdent(s string) bool {
	for i, r := range s {
		letter := r == '_' || r == '$' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
		if !letter && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return s != ""
}

// checkDubboSignature applies the form of a Dubbo method to the signature
// of a method of package p:
//
//	M(ctx context.Context, args...) (R, error)
//	M(ctx context.Context, args...) error
//
// root is the path of the package the generated code goes into. Without
// given Java types (typed false) the parameters must have one in the
// dubbo module's table; the result always must.
func checkDubboSignature(root string, p *packages.Package, sig *types.Signature, typed bool) (*dubboSig, string) {
	if hasInvalid(sig) {
		return nil, "signature does not type-check" + typeErrors(p)
	}
	params, results := sig.Params(), sig.Results()
	if sig.Variadic() {
		return nil, "must not be variadic; a Java method's parameters are fixed"
	}
	if params.Len() == 0 || !isContext(params.At(0).Type()) {
		return nil, "first parameter must be context.Context"
	}
	s := &dubboSig{}
	switch {
	case results.Len() == 1 && isError(results.At(0).Type()):
	case results.Len() == 2 && isError(results.At(1).Type()):
		s.result = results.At(0).Type()
	default:
		return nil, "must return (R, error) or error, returns " + tupleString(p, results)
	}
	for i := 1; i < params.Len(); i++ {
		v := params.At(i)
		t := v.Type()
		if why := unnameable(root, t); why != "" {
			return nil, fmt.Sprintf("parameter %d: %s", i, why)
		}
		if !typed {
			if why := noJavaType(t); why != "" {
				return nil, fmt.Sprintf("parameter %d: %s has no Java type (%s); give the types with //dabb:java", i, typeString(p, t), why)
			}
		}
		s.params = append(s.params, t)
		s.names = append(s.names, v.Name())
	}
	if s.result != nil {
		if why := unnameable(root, s.result); why != "" {
			return nil, "result: " + why
		}
		if why := noJavaType(s.result); why != "" {
			return nil, fmt.Sprintf("result: %s has no Java type (%s)", typeString(p, s.result), why)
		}
	}
	return s, ""
}

// noJavaType says why t has no Java type in the dubbo module's table
// (dubbo.JavaType), or "" when it may have one. It checks the kinds only:
// whether a struct is a registered POJO is known when the program runs.
func noJavaType(t types.Type) string {
	switch u := t.Underlying().(type) {
	case *types.Basic:
		switch u.Kind() {
		case types.Bool, types.Int, types.Int8, types.Int16, types.Int32, types.Int64,
			types.Float32, types.Float64, types.String:
			return ""
		}
		return "Java has no " + u.Name()
	case *types.Slice:
		_, unnamed := types.Unalias(t).(*types.Slice)
		if b, ok := types.Unalias(u.Elem()).(*types.Basic); unnamed && ok && b.Kind() == types.Uint8 {
			return "" // []byte is byte[]
		}
		if _, ok := u.Elem().Underlying().(*types.Interface); ok {
			return "" // java.util.List
		}
		return noJavaType(u.Elem())
	case *types.Pointer:
		return noJavaType(u.Elem())
	case *types.Map, *types.Interface, *types.Struct:
		return ""
	case *types.Array:
		return "use a slice for a Java array"
	case *types.Chan:
		return "a channel"
	case *types.Signature:
		return "a function"
	}
	return "not a Java type"
}

// unnameable says why the package at root cannot name t, or "" when it can.
func unnameable(root string, t types.Type) string {
	switch u := t.(type) {
	case *types.Alias:
		obj := u.Obj()
		if obj.Pkg() != nil && obj.Parent() == obj.Pkg().Scope() && nameable(root, obj) && u.TypeArgs().Len() == 0 {
			return ""
		}
		return unnameable(root, types.Unalias(u))
	case *types.Named:
		obj := u.Obj()
		if obj.Pkg() == nil {
			return "" // error
		}
		if obj.Parent() != obj.Pkg().Scope() {
			return obj.Name() + " is declared inside a function"
		}
		if !nameable(root, obj) {
			return fmt.Sprintf("%s.%s is not a type that %s may import", importPath(obj.Pkg().Path()), obj.Name(), root)
		}
		for a := range u.TypeArgs().Types() {
			if why := unnameable(root, a); why != "" {
				return why
			}
		}
	case *types.Pointer:
		return unnameable(root, u.Elem())
	case *types.Slice:
		return unnameable(root, u.Elem())
	case *types.Array:
		return unnameable(root, u.Elem())
	case *types.Map:
		if why := unnameable(root, u.Key()); why != "" {
			return why
		}
		return unnameable(root, u.Elem())
	case *types.Struct:
		for f := range u.Fields() {
			if why := unnameable(root, f.Type()); why != "" {
				return why
			}
		}
	}
	return ""
}

// dubboNames are the package-level identifiers generated for one Dubbo
// interface.
type dubboNames struct {
	javaInterface string // InventoryServiceJavaInterface
	options       string // InventoryServiceDubboOptions
	newClient     string // NewInventoryServiceDubboClient
	client        string // inventoryServiceDubboClient
	register      string // RegisterInventoryServiceDubboServer
	server        string // inventoryServiceDubboServer
}

func dubboNamesOf(iface string) dubboNames {
	return dubboNames{
		javaInterface: iface + "JavaInterface",
		options:       iface + "DubboOptions",
		newClient:     "New" + iface + "DubboClient",
		client:        lowerFirst(iface) + "DubboClient",
		register:      "Register" + iface + "DubboServer",
		server:        lowerFirst(iface) + "DubboServer",
	}
}

func (n dubboNames) all() []string {
	return []string{n.javaInterface, n.options, n.newClient, n.client, n.register, n.server}
}

// dubboCallOptionsName names the call options of a method with a timeout.
func dubboCallOptionsName(iface, m string) string { return lowerFirst(iface) + m + "DubboCallOptions" }

// dubboLocals are the identifiers the generated Dubbo functions declare
// besides localNames.
var dubboLocals = []string{"cl", "desc", "out"}

// dubboPackages calls add with every package a Dubbo method's types name,
// but the package of the generated code.
func dubboPackages(pkgPath string, s *service, add func(path, name string)) {
	for _, m := range s.methods {
		ts := slices.Clone(m.dubbo.params)
		if m.dubbo.result != nil {
			ts = append(ts, m.dubbo.result)
		}
		for _, t := range ts {
			types.TypeString(t, func(p *types.Package) string {
				if path := importPath(p.Path()); path != pkgPath {
					add(path, p.Name())
				}
				return p.Name()
			})
		}
	}
}

// goType is how the generated file spells the Go type t.
func (g *generator) goType(t types.Type) string {
	return types.TypeString(t, func(p *types.Package) string {
		path := importPath(p.Path())
		if path == g.pkg.path {
			return ""
		}
		return g.imports.name(path)
	})
}

// dubboService prints the Dubbo client stub and server glue of one
// //dabb:dubbo interface.
func (g *generator) dubboService(s *service) {
	n := dubboNamesOf(s.iface)
	ctx := g.imports.name("context") + ".Context"
	proxyName := g.imports.name(proxyPath)
	dubboName := g.imports.name(dubboPath)
	dabbName := g.imports.name(dabbPath)

	g.Printf("\n// %s is the Java interface %s declares.\n", n.javaInterface, s.iface)
	g.Printf("const %s = %s\n", n.javaInterface, strconv.Quote(s.dubbo.iface))

	g.Printf("\n// %s returns the declaration of %s from its directives, for\n", n.options, s.iface)
	g.Printf("// %s.Service and %s.NewClient: serving and calling take the same one.\n", dubboName, dubboName)
	g.Printf("func %s() []%s.ServiceOption {\n", n.options, dubboName)
	g.Printf("\treturn []%s.ServiceOption{\n", dubboName)
	if s.dubbo.version != "" {
		g.Printf("\t\t%s.WithVersion(%q),\n", dubboName, s.dubbo.version)
	}
	if s.dubbo.group != "" {
		g.Printf("\t\t%s.WithGroup(%q),\n", dubboName, s.dubbo.group)
	}
	var idempotent []string
	for _, m := range s.methods {
		if m.java != nil {
			args := []string{strconv.Quote(m.name), strconv.Quote(m.java.name)}
			for _, t := range m.java.types {
				args = append(args, strconv.Quote(t))
			}
			g.Printf("\t\t%s.WithMethod(%s),\n", dubboName, strings.Join(args, ", "))
		}
		if m.idempotent {
			idempotent = append(idempotent, strconv.Quote(m.name))
		}
	}
	if len(idempotent) > 0 {
		g.Printf("\t\t%s.WithIdempotent(%s),\n", dubboName, strings.Join(idempotent, ", "))
	}
	g.Printf("\t}\n}\n")

	g.Printf("\n// %s returns an implementation of %s that calls the Dubbo\n", n.newClient, s.iface)
	g.Printf("// providers c finds, in hessian2: %s as %s() declares it,\n", n.javaInterface, n.options)
	g.Printf("// then opts (%s.WithVersion or %s.WithGroup to call another service key).\n", dubboName, dubboName)
	g.Printf("func %s(c *%s.Client, opts ...%s.ServiceOption) (%s, error) {\n", n.newClient, proxyName, dubboName, s.iface)
	g.Printf("\tcl, err := %s.NewClient(c, %s, (*%s)(nil), append(%s(), opts...)...)\n", dubboName, n.javaInterface, s.iface, n.options)
	g.Printf("\tif err != nil {\n\t\treturn nil, err\n\t}\n")
	g.Printf("\treturn &%s{c: cl}, nil\n}\n", n.client)
	g.Printf("\n// %s implements %s with one Dubbo call through c per method.\n", n.client, s.iface)
	g.Printf("type %s struct{ c *%s.Client }\n", n.client, dubboName)
	g.Printf("\nvar _ %s = (*%s)(nil)\n", s.iface, n.client)

	for _, m := range s.methods {
		if m.timeout <= 0 {
			continue
		}
		g.Printf("\n// %s are the call options of %s, from its directives.\n", dubboCallOptionsName(s.iface, m.name), m.name)
		g.Printf("var %s = []%s.CallOption{%s.Timeout(%s)}\n", dubboCallOptionsName(s.iface, m.name), proxyName, proxyName, g.duration(m.timeout))
	}

	for _, m := range s.methods {
		g.dubboMethod(s, m, n.client, ctx)
	}

	g.Printf("\n// %s registers impl with s to serve %s to Dubbo consumers\n", n.register, s.iface)
	g.Printf("// as %s: its methods and no others, declared by %s(),\n", n.javaInterface, n.options)
	g.Printf("// then opts (%s.WithApplication, say).\n", dubboName)
	g.Printf("func %s(s *%s.Server, impl %s, opts ...%s.ServiceOption) error {\n", n.register, dabbName, s.iface, dubboName)
	g.Printf("\tif impl == nil {\n\t\treturn %s.New(%q)\n\t}\n", g.imports.name("errors"), n.register+": nil implementation")
	g.Printf("\tsrv := %s{impl}\n", n.server)
	g.Printf("\tdesc, err := %s.Service(%s, srv, append(%s(), opts...)...)\n", dubboName, n.javaInterface, n.options)
	g.Printf("\tif err != nil {\n\t\treturn err\n\t}\n")
	g.Printf("\treturn s.RegisterService(desc, srv)\n}\n")
	g.Printf("\n// %s has exactly the methods of %s, which %s.Service serves.\n", n.server, s.iface, dubboName)
	g.Printf("type %s struct{ %s }\n", n.server, s.iface)
}

// dubboMethod prints the client stub's method m.
func (g *generator) dubboMethod(s *service, m *method, client, ctx string) {
	sig := m.dubbo
	names := paramNames(sig.names, g.stubReserved)
	params := []string{"ctx " + ctx}
	for i, t := range sig.params {
		params = append(params, names[i]+" "+g.goType(t))
	}
	args := "nil"
	if len(names) > 0 {
		args = "[]any{" + strings.Join(names, ", ") + "}"
	}
	opts := ""
	if m.timeout > 0 {
		opts = ", " + dubboCallOptionsName(s.iface, m.name) + "..."
	}
	g.Printf("\n")
	if m.synopsis != "" {
		g.Printf("// %s\n//\n", m.synopsis)
	}
	g.Printf("// %s calls %s.%s.\n", m.name, s.dubbo.iface, m.javaName())
	if sig.result == nil {
		g.Printf("func (c *%s) %s(%s) error {\n", client, m.name, strings.Join(params, ", "))
		g.Printf("\treturn c.c.Call(ctx, %q, %s, nil%s)\n}\n", m.name, args, opts)
		return
	}
	rt := g.goType(sig.result)
	g.Printf("func (c *%s) %s(%s) (%s, error) {\n", client, m.name, strings.Join(params, ", "), rt)
	g.Printf("\tvar out %s\n", rt)
	g.Printf("\terr := c.c.Call(ctx, %q, %s, &out%s)\n", m.name, args, opts)
	g.Printf("\treturn out, err\n}\n")
}

// paramNames returns the names of a stub method's parameters after the
// context: the source's where each is usable, else argN. A name is not
// usable when the method's body would mean something else by it: a local
// of the body, a predeclared, imported or package-level name.
func paramNames(src []string, reserved func(string) bool) []string {
	out := make([]string, len(src))
	used := map[string]bool{}
	for i, n := range src {
		if n == "" || n == "_" || reserved(n) || used[n] {
			n = "arg" + strconv.Itoa(i+1)
			for reserved(n) || used[n] || slices.Contains(src, n) {
				n += "_"
			}
		}
		used[n] = true
		out[i] = n
	}
	return out
}

// stubLocals are the names a stub method's body declares or reads
// besides its parameters.
var stubLocals = []string{"c", "ctx", "err", "out"}

// stubHiding are the stubLocals in scope where a stub method's body names
// a type (var out T): the receiver and the context.
var stubHiding = []string{"c", "ctx"}

// dubboShadowed returns the types of the package at pkgPath that a Dubbo
// method of s names and that a stub method's locals would hide.
func dubboShadowed(pkgPath string, s *service) []string {
	var found []string
	var visit func(t types.Type)
	visit = func(t types.Type) {
		switch u := t.(type) {
		case *types.Alias:
			if o := u.Obj(); o.Pkg() != nil && importPath(o.Pkg().Path()) == pkgPath && slices.Contains(stubHiding, o.Name()) && !slices.Contains(found, o.Name()) {
				found = append(found, o.Name())
			}
		case *types.Named:
			if o := u.Obj(); o.Pkg() != nil && importPath(o.Pkg().Path()) == pkgPath && slices.Contains(stubHiding, o.Name()) && !slices.Contains(found, o.Name()) {
				found = append(found, o.Name())
			}
			for a := range u.TypeArgs().Types() {
				visit(a)
			}
		case *types.Pointer:
			visit(u.Elem())
		case *types.Slice:
			visit(u.Elem())
		case *types.Map:
			visit(u.Key())
			visit(u.Elem())
		}
	}
	for _, m := range s.methods {
		for _, t := range m.dubbo.params {
			visit(t)
		}
		if m.dubbo.result != nil {
			visit(m.dubbo.result)
		}
	}
	return found
}

// stubReserved reports whether a stub method's parameter may not be
// called n: see paramNames.
func (g *generator) stubReserved(n string) bool {
	if slices.Contains(stubLocals, n) || types.Universe.Lookup(n) != nil {
		return true
	}
	if _, ok := g.pkg.scope[n]; ok {
		return true
	}
	if _, ok := g.pkg.kept[n]; ok {
		return true
	}
	for _, name := range g.imports.byPath {
		if name == n {
			return true
		}
	}
	return slices.ContainsFunc(g.declared, func(d [2]string) bool { return d[1] == n })
}

// javaName is the Java name of a Dubbo method: its //dabb:java name, or
// the Go name with a lower-case first letter, as the dubbo module gives.
func (m *method) javaName() string {
	if m.java != nil {
		return m.java.name
	}
	return lowerFirst(m.name)
}
