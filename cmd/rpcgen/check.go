// The rules a service's interface, methods and name follow, and how problems are reported.

package main

import (
	"errors"
	"fmt"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

// checkInterface applies the rules of a service's type to obj: an
// exported, non-generic, defined interface type. It returns the type, or
// what is wrong with it.
func checkInterface(obj types.Object) (*types.TypeName, *types.Interface, string) {
	tn, ok := obj.(*types.TypeName)
	if !ok {
		return nil, nil, "is a " + objKind(obj) + ", not an interface type"
	}
	if tn.IsAlias() {
		return nil, nil, "is an alias; run rpcgen where the interface is declared"
	}
	if !tn.Exported() {
		return nil, nil, "interface must be exported"
	}
	named, _ := tn.Type().(*types.Named)
	if named == nil {
		return nil, nil, "is not a defined type"
	}
	if named.TypeParams().Len() > 0 {
		return nil, nil, "generic interfaces are not supported"
	}
	iface, ok := named.Underlying().(*types.Interface)
	if !ok {
		return nil, nil, "is " + kindOf(named.Underlying()) + ", not an interface type"
	}
	return tn, iface, ""
}

// checkSignature applies the RPC form to the signature of a method of
// package p. The form is M(ctx context.Context, req *T) (*U, error). root is
// the path of the package the generated code goes into. It returns the
// message types, or what is wrong with the signature.
func checkSignature(root string, p *packages.Package, sig *types.Signature) (req, resp typeRef, problem string) {
	if hasInvalid(sig) {
		return req, resp, "signature does not type-check" + typeErrors(p)
	}
	params, results := sig.Params(), sig.Results()
	if sig.Variadic() {
		return req, resp, "must not be variadic; want (ctx context.Context, req *T)"
	}
	if params.Len() != 2 {
		return req, resp, fmt.Sprintf("must take exactly two parameters (ctx context.Context, req *T), has %d", params.Len())
	}
	if !isContext(params.At(0).Type()) {
		return req, resp, "first parameter must be context.Context, got " + typeString(p, params.At(0).Type())
	}
	if results.Len() != 2 || !isError(results.At(1).Type()) {
		return req, resp, "must return (*T, error), returns " + tupleString(p, results)
	}
	req, why := messageType(root, params.At(1).Type())
	if why != "" {
		return req, resp, "request must be " + why + ", got " + typeString(p, params.At(1).Type())
	}
	resp, why = messageType(root, results.At(0).Type())
	if why != "" {
		return req, resp, "response must be " + why + ", got " + typeString(p, results.At(0).Type())
	}
	return req, resp, ""
}

// checkServiceName applies registry.ValidateService's rule to a
// //dabb:service name, with the same message.
func checkServiceName(name string) error {
	// A copy of the registry's rule, so the generator imports no dabb
	// package; TestServiceNameRule holds the two to the same answers.
	var why string
	switch {
	case name == "":
		why = "empty"
	case name == "." || name == "..":
		why = "reserved"
	case strings.ContainsRune(name, '/'):
		why = "contains '/'"
	case strings.IndexFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		why = "contains a control character"
	default:
		return nil
	}
	return fmt.Errorf("registry: invalid service name %q: %s", name, why)
}

// messageType checks that t is *T for a named struct type T that the package
// at path can name; otherwise it says what t must be.
func messageType(path string, t types.Type) (typeRef, string) {
	const want = "a pointer to a named struct type"
	ptr, ok := types.Unalias(t).(*types.Pointer)
	if !ok {
		return typeRef{}, want
	}
	named, ok := types.Unalias(ptr.Elem()).(*types.Named)
	if !ok || named.Obj().Pkg() == nil {
		return typeRef{}, want
	}
	if named.TypeArgs().Len() > 0 {
		return typeRef{}, want + " (generic types are not supported)"
	}
	if _, ok := named.Underlying().(*types.Struct); !ok {
		return typeRef{}, want
	}
	obj := named.Obj()
	if obj.Parent() != obj.Pkg().Scope() {
		return typeRef{}, want + " declared at package level"
	}
	if nameable(path, obj) {
		ref := refTo(obj)
		ref.proto = isProtoMessage(ptr)
		return ref, ""
	}
	// The source may name it through an alias the generated code can use
	// too: the exported name of a type in an internal package, say.
	for a, ok := ptr.Elem().(*types.Alias); ok && a.TypeArgs().Len() == 0; a, ok = a.Rhs().(*types.Alias) {
		if a.Obj().Parent() == a.Obj().Pkg().Scope() && nameable(path, a.Obj()) {
			ref := refTo(a.Obj())
			ref.proto = isProtoMessage(ptr)
			return ref, ""
		}
	}
	if !obj.Exported() {
		return typeRef{}, want + " that is exported"
	}
	return typeRef{}, want + " that " + path + " may import (a type of an internal package can be named through an exported alias declared outside it)"
}

// isProtoMessage reports whether ptr, a *T, is a protobuf message: it has
// the method ProtoReflect() protoreflect.Message that protoc-gen-go
// generates and google.golang.org/protobuf/proto.Message requires. The
// generator imports no protobuf package: it compares the names.
func isProtoMessage(ptr *types.Pointer) bool {
	obj, _, _ := types.LookupFieldOrMethod(ptr, true, nil, "ProtoReflect")
	fn, ok := obj.(*types.Func)
	if !ok {
		return false
	}
	sig := fn.Signature()
	if sig.Params().Len() != 0 || sig.Results().Len() != 1 {
		return false
	}
	named, ok := types.Unalias(sig.Results().At(0).Type()).(*types.Named)
	return ok && named.Obj().Pkg() != nil && named.Obj().Name() == "Message" &&
		named.Obj().Pkg().Path() == "google.golang.org/protobuf/reflect/protoreflect"
}

// nameable reports whether the package at path can refer to the
// package-level obj: obj is declared there, or exported by a package that
// it may import.
func nameable(path string, obj types.Object) bool {
	p := importPath(obj.Pkg().Path())
	return p == path || obj.Exported() && importable(p, path)
}

// importable reports whether the package at from may import the package at
// path. Go's rule for internal packages applies: below a path element
// "internal", only the tree rooted at its parent may import.
func importable(path, from string) bool {
	i := strings.LastIndex("/"+path+"/", "/internal/")
	if i < 0 {
		return true
	}
	parent := path[:max(i-1, 0)]
	return from == parent || strings.HasPrefix(from, parent+"/")
}

// refTo names the package-level obj.
func refTo(obj types.Object) typeRef {
	return typeRef{path: importPath(obj.Pkg().Path()), pkg: obj.Pkg().Name(), name: obj.Name()}
}

// importPath turns a vendored package path into the path that imports it.
func importPath(p string) string {
	if i := strings.LastIndex(p, "/vendor/"); i >= 0 {
		return p[i+len("/vendor/"):]
	}
	return strings.TrimPrefix(p, "vendor/")
}

// isContext reports whether t is context.Context.
func isContext(t types.Type) bool {
	n, ok := types.Unalias(t).(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "context" && n.Obj().Name() == "Context"
}

// isError reports whether t is the predeclared error.
func isError(t types.Type) bool {
	return types.Identical(t, types.Universe.Lookup("error").Type())
}

// hasInvalid reports whether a parameter or result of sig failed to
// type-check.
func hasInvalid(sig *types.Signature) bool {
	for _, tup := range []*types.Tuple{sig.Params(), sig.Results()} {
		for v := range tup.Variables() {
			t := types.Unalias(v.Type())
			for {
				if p, ok := t.(*types.Pointer); ok {
					t = types.Unalias(p.Elem())
					continue
				}
				if s, ok := t.(*types.Slice); ok {
					t = types.Unalias(s.Elem())
					continue
				}
				break
			}
			if b, ok := t.(*types.Basic); ok && b.Kind() == types.Invalid {
				return true
			}
		}
	}
	return false
}

// typeErrors lists the package's errors, for a message about a signature
// that did not type-check.
func typeErrors(p *packages.Package) string {
	var b strings.Builder
	for i, e := range p.Errors {
		if i == 5 {
			fmt.Fprintf(&b, "\n\t(and %d more)", len(p.Errors)-i)
			break
		}
		b.WriteString("\n\t")
		b.WriteString(e.Error())
	}
	return b.String()
}

// typeString spells t as the source of p would.
func typeString(p *packages.Package, t types.Type) string {
	return types.TypeString(t, types.RelativeTo(p.Types))
}

// tupleString spells a result list as the source of p would.
func tupleString(p *packages.Package, t *types.Tuple) string {
	parts := make([]string, 0, t.Len())
	for v := range t.Variables() {
		parts = append(parts, typeString(p, v.Type()))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// objKind names the kind of a package-level object that is not a type.
func objKind(o types.Object) string {
	switch o.(type) {
	case *types.Const:
		return "constant"
	case *types.Var:
		return "variable"
	case *types.Func:
		return "function"
	default:
		return "non-type"
	}
}

// kindOf names the kind of a type that is not an interface.
func kindOf(t types.Type) string {
	switch t.(type) {
	case *types.Struct:
		return "a struct type"
	case *types.Basic:
		return "a basic type"
	case *types.Pointer:
		return "a pointer type"
	case *types.Signature:
		return "a function type"
	case *types.Slice, *types.Array:
		return "a slice or array type"
	case *types.Map:
		return "a map type"
	case *types.Chan:
		return "a channel type"
	default:
		return "not an interface"
	}
}

// maxErrors bounds how many problems one run reports.
const maxErrors = 20

// orSite returns *site if set, else pos.
func orSite(pos token.Position, site *token.Position) token.Position {
	if site != nil {
		return *site
	}
	return pos
}

// posErr formats an error as file:line: rpcgen: message. The file name is
// relative to the working directory when it is below it.
func posErr(pos token.Position, format string, args ...any) error {
	file := pos.Filename
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, file); err == nil && !strings.HasPrefix(rel, "..") {
			file = rel
		}
	}
	return fmt.Errorf("%s:%d: rpcgen: %s", file, pos.Line, fmt.Sprintf(format, args...))
}

// errList collects the problems of one run; past maxErrors it only counts.
type errList []error

// add records err, unless the same problem is already recorded.
func (e *errList) add(err error) {
	// The walks of a literal and of its enclosing interface both see a
	// directive inside the literal. A directive above a group of types is
	// seen once per type of the run in the group.
	if !slices.ContainsFunc(*e, func(x error) bool { return x.Error() == err.Error() }) {
		*e = append(*e, err)
	}
}

// err joins the problems into one error, nil if there are none.
func (e errList) err() error {
	if len(e) > maxErrors {
		e = append(e[:maxErrors:maxErrors], fmt.Errorf("rpcgen: and %d more problems", len(e)-maxErrors))
	}
	return errors.Join(e...)
}
