// Walking an interface: its methods, embedded interfaces and //dabb: directives.

package main

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/token"
	"go/types"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/tools/go/packages"
)

// services finds and checks the named interfaces of the loaded package.
func (l *loader) services(info *pkgInfo, names []string) ([]*service, error) {
	var errs errList
	var svcs []*service
	for _, name := range names {
		if s := l.service(name, info, &errs); s != nil {
			svcs = append(svcs, s)
		}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return svcs, nil
}

// service finds, validates and flattens the interface called name.
func (l *loader) service(name string, info *pkgInfo, errs *errList) *service {
	root := l.root
	obj := root.Types.Scope().Lookup(name)
	if obj == nil {
		errs.add(l.notFound(name))
		return nil
	}
	pos := root.Fset.Position(obj.Pos())
	tn, iface, problem := checkInterface(obj)
	if problem != "" {
		errs.add(posErr(pos, "type %s: %s", name, problem))
		return nil
	}
	spec, decl, file := findSpec(root, tn)
	var it *ast.InterfaceType
	if spec != nil {
		it, _ = spec.Type.(*ast.InterfaceType)
	}
	if it == nil {
		errs.add(posErr(pos, "type %s: declaration not found in the syntax", name))
		return nil
	}

	for _, imp := range file.Imports {
		pn := root.TypesInfo.PkgNameOf(imp)
		if pn == nil || pn.Name() == "_" || pn.Name() == "." || pn.Imported() == nil {
			continue
		}
		path := importPath(pn.Imported().Path())
		if _, ok := info.aliases[path]; !ok {
			info.aliases[path] = pn.Name()
		}
	}
	s := &service{
		iface: name,
		name:  root.Name + "." + name,
		file:  filepath.Base(pos.Filename),
	}
	docGroup := spec.Doc
	if docGroup == nil && len(decl.Specs) == 1 {
		docGroup = decl.Doc
	}
	w := &walker{
		l:        l,
		errs:     errs,
		svc:      s,
		seen:     map[string]*method{},
		visiting: map[*ast.InterfaceType]bool{},
		used:     map[*ast.Comment]bool{},
	}
	w.serviceDirectives(root, docGroup)
	if decl.Doc != docGroup {
		// The doc comment of a group of types documents none of them.
		for _, c := range commentList(decl.Doc) {
			w.spaced(root, c, nil)
		}
		for _, d := range directives(root, decl.Doc) {
			w.fail(posErr(d.pos, "%s is above a group of types, where it applies to none of them; move it to the doc comment of the interface, inside the parentheses", d.c.Text))
		}
	}
	w.walk(root, file, it, "", nil)
	if w.bad {
		return nil
	}
	if !iface.IsMethodSet() { // not caught above, but be sure
		errs.add(posErr(pos, "type %s: is a type constraint, not an interface with methods only", name))
		return nil
	}
	if len(s.methods) == 0 {
		errs.add(posErr(pos, "type %s: interface has no methods", name))
		return nil
	}
	return s
}

// walker collects the methods of one interface, in declaration order, with
// embedded interfaces flattened in place.
type walker struct {
	l        *loader
	errs     *errList
	svc      *service
	seen     map[string]*method // by name: methods already visited (nil if invalid)
	visiting map[*ast.InterfaceType]bool
	used     map[*ast.Comment]bool // directive comments already read
	named    bool                  // //dabb:service was seen
	bad      bool                  // a problem was reported
}

// fail records a problem of the interface.
func (w *walker) fail(err error) {
	w.bad = true
	w.errs.add(err)
}

// serviceDirectives reads the interface's doc comment.
func (w *walker) serviceDirectives(p *packages.Package, cg *ast.CommentGroup) {
	for _, c := range commentList(cg) {
		w.spaced(p, c, nil)
	}
	for _, d := range directives(p, cg) {
		switch d.name {
		case "service":
			if len(d.args) != 1 {
				w.fail(posErr(d.pos, "type %s: //dabb:service wants one service name, got %q", w.svc.iface, d.argText))
				continue
			}
			if err := checkServiceName(d.args[0]); err != nil {
				w.fail(posErr(d.pos, "type %s: //dabb:service: %v", w.svc.iface, err))
				continue
			}
			if w.named {
				w.fail(posErr(d.pos, "type %s: //dabb:service given twice", w.svc.iface))
				continue
			}
			w.named = true
			w.svc.name = d.args[0]
		case "dubbo":
			dd, err := parseDubbo(d.args)
			switch {
			case err != nil:
				w.fail(posErr(d.pos, "type %s: //dabb:dubbo: %v", w.svc.iface, err))
				// Its methods are still checked in the Dubbo form.
				w.svc.dubbo = &dubboDecl{}
			case w.svc.dubbo != nil:
				w.fail(posErr(d.pos, "type %s: //dabb:dubbo given twice", w.svc.iface))
			default:
				w.svc.dubbo = dd
				w.svc.name = dd.iface
			}
		case "idempotent", "timeout", "java":
			w.fail(posErr(d.pos, "type %s: //dabb:%s belongs in a method's doc comment", w.svc.iface, d.name))
		default:
			w.fail(posErr(d.pos, "type %s: unknown directive //dabb:%s (want //dabb:service or //dabb:dubbo)", w.svc.iface, d.name))
		}
	}
	if w.named && w.svc.dubbo != nil {
		w.fail(posErr(directives(p, cg)[0].pos, "type %s: //dabb:service and //dabb:dubbo exclude each other: a Dubbo interface is named by its Java interface", w.svc.iface))
	}
}

// walk visits the elements of the interface literal it, declared in file of
// package p. The argument via names the embedded interface it came from (""
// at the top). A non-nil site is where problems are reported: the line of
// the target package that embeds an interface from another package.
func (w *walker) walk(p *packages.Package, file *ast.File, it *ast.InterfaceType, via string, site *token.Position) {
	if w.visiting[it] {
		return // an embedding cycle; the type checker reports it
	}
	w.visiting[it] = true
	defer delete(w.visiting, it)

	for _, f := range it.Methods.List {
		if len(f.Names) == 0 {
			for _, d := range directives(p, f.Doc) {
				w.used[d.c] = true
				w.fail(posErr(orSite(d.pos, site), "type %s: //dabb:%s must be in a method's doc comment, not above an embedded interface", w.svc.iface, d.name))
			}
			w.embedded(p, f.Type, via, site)
			continue
		}
		for _, c := range commentList(f.Doc) {
			w.used[c] = true
		}
		w.method(p, f, via, site)
	}
	// Directives that are not in a method's doc comment (after a blank line,
	// or trailing a method) would otherwise be ignored without a word.
	if file == nil {
		return
	}
	for _, cg := range file.Comments {
		if cg.Pos() < it.Methods.Opening || cg.End() > it.Methods.Closing {
			continue
		}
		for _, c := range cg.List {
			w.spaced(p, c, site)
			if w.used[c] || !strings.HasPrefix(c.Text, directivePrefix) {
				continue
			}
			w.fail(posErr(orSite(p.Fset.Position(c.Pos()), site), "type %s: %s is not in a method's doc comment (it must be on the lines directly above the method)", w.svc.iface, c.Text))
		}
	}
}

// spaced reports a comment that would be a directive but for the space
// after the slashes: "// dabb:idempotent" is prose to the go tools.
func (w *walker) spaced(p *packages.Package, c *ast.Comment, site *token.Position) {
	rest, _ := strings.CutPrefix(c.Text, "//")
	word := strings.TrimLeft(rest, " \t")
	if len(word) == len(rest) || !strings.HasPrefix(word, "dabb:") {
		return
	}
	w.fail(posErr(orSite(p.Fset.Position(c.Pos()), site), "type %s: %s is not a directive, for the space after //; write //%s", w.svc.iface, c.Text, word))
}

// embedded flattens an embedded element of an interface.
func (w *walker) embedded(p *packages.Package, expr ast.Expr, via string, site *token.Position) {
	pos := orSite(p.Fset.Position(expr.Pos()), site)
	if lit, ok := expr.(*ast.InterfaceType); ok {
		w.walk(p, fileOf(p, lit.Pos()), lit, via, site)
		return
	}
	switch e := expr.(type) {
	case *ast.BinaryExpr, *ast.UnaryExpr: // A | B, ~T
		w.fail(posErr(pos, "type %s: %s makes it a type constraint; only methods and interfaces may be embedded", w.svc.iface, types.ExprString(e)))
		return
	}
	t := p.TypesInfo.TypeOf(expr)
	if t == nil || t == types.Typ[types.Invalid] {
		w.fail(posErr(pos, "type %s: embedded %s does not type-check%s", w.svc.iface, types.ExprString(expr), typeErrors(p)))
		return
	}
	var obj *types.TypeName
	switch u := types.Unalias(t).(type) {
	case *types.Named:
		if _, ok := u.Underlying().(*types.Interface); ok {
			if u.TypeArgs().Len() > 0 {
				w.fail(posErr(pos, "type %s: embedded generic interface %s is not supported", w.svc.iface, types.ExprString(expr)))
				return
			}
			obj = u.Obj()
		}
	case *types.Interface:
		// An alias of an interface literal: type RW = interface{ ... }.
		if a, ok := t.(*types.Alias); ok {
			obj = a.Obj()
		}
	}
	if obj == nil {
		w.fail(posErr(pos, "type %s: embedded element %s is not an interface type", w.svc.iface, types.ExprString(expr)))
		return
	}
	qual := obj.Name()
	if obj.Pkg() != nil {
		qual = obj.Pkg().Name() + "." + obj.Name()
	}
	target := p
	if obj.Pkg() == nil && obj.Name() == "any" {
		return // the empty interface adds nothing
	} else if obj.Pkg() == nil && obj.Name() == "comparable" {
		w.fail(posErr(pos, "type %s: embedded comparable makes it a type constraint", w.svc.iface))
		return
	} else if obj.Pkg() == nil {
		// Predeclared: error, whose Error method is not an RPC method.
		w.fail(posErr(pos, "type %s: embedded %s: its methods do not have the form M(ctx context.Context, req *T) (*U, error)", w.svc.iface, qual))
		return
	} else if obj.Pkg() != p.Types {
		var err error
		if target, err = w.l.pkg(obj.Pkg().Path()); err != nil {
			w.fail(posErr(pos, "type %s: embedded %s: %v", w.svc.iface, qual, err))
			return
		}
		o := target.Types.Scope().Lookup(obj.Name())
		tn, ok := o.(*types.TypeName)
		if !ok {
			w.fail(posErr(pos, "type %s: embedded %s: declaration not found", w.svc.iface, qual))
			return
		}
		obj = tn
	}
	spec, _, file := findSpec(target, obj)
	var it *ast.InterfaceType
	if spec != nil {
		it, _ = spec.Type.(*ast.InterfaceType)
	}
	if it == nil {
		w.fail(posErr(pos, "type %s: embedded %s: interface declaration not found", w.svc.iface, qual))
		return
	}
	if target != p && site == nil {
		site = &pos
	}
	w.walk(target, file, it, qual, site)
}

// method validates one method and its directives and records it.
func (w *walker) method(p *packages.Package, f *ast.Field, via string, site *token.Position) {
	id := f.Names[0]
	name := id.Name
	pos := orSite(p.Fset.Position(id.Pos()), site)
	label := name
	if via != "" {
		label = name + " (embedded from " + via + ")"
	}
	bad := func(format string, args ...any) {
		w.fail(posErr(pos, "method %s: %s", label, fmt.Sprintf(format, args...)))
	}
	m := &method{name: name}
	if f.Doc != nil {
		m.synopsis = new(doc.Package).Synopsis(f.Doc.Text())
	}
	for _, d := range directives(p, f.Doc) {
		dpos := orSite(d.pos, site)
		switch d.name {
		case "idempotent":
			switch {
			case len(d.args) != 0:
				w.fail(posErr(dpos, "method %s: //dabb:idempotent takes no arguments, got %q", label, d.argText))
			case m.idempotent:
				w.fail(posErr(dpos, "method %s: //dabb:idempotent given twice", label))
			}
			m.idempotent = true
		case "timeout":
			if len(d.args) != 1 {
				w.fail(posErr(dpos, "method %s: //dabb:timeout wants one duration such as 200ms, got %q", label, d.argText))
				continue
			}
			if m.timeout != 0 {
				w.fail(posErr(dpos, "method %s: //dabb:timeout given twice", label))
				continue
			}
			dur, err := time.ParseDuration(d.args[0])
			if err != nil {
				w.fail(posErr(dpos, "method %s: //dabb:timeout %s: not a duration such as 200ms or 2s", label, d.args[0]))
				continue
			}
			if dur <= 0 {
				w.fail(posErr(dpos, "method %s: //dabb:timeout %s: must be positive", label, d.args[0]))
				continue
			}
			m.timeout = dur
		case "java":
			if w.svc.dubbo == nil {
				w.fail(posErr(dpos, "method %s: //dabb:java is for the methods of a Dubbo interface: add //dabb:dubbo to the interface's doc comment", label))
				continue
			}
			if m.java != nil {
				w.fail(posErr(dpos, "method %s: //dabb:java given twice", label))
				continue
			}
			j, err := parseJava(d.argText)
			if err != nil {
				w.fail(posErr(dpos, "method %s: //dabb:java: %v", label, err))
				continue
			}
			m.java = j
		case "service", "dubbo":
			w.fail(posErr(dpos, "method %s: //dabb:%s belongs in the interface's doc comment", label, d.name))
		default:
			w.fail(posErr(dpos, "method %s: unknown directive //dabb:%s (want //dabb:idempotent, //dabb:timeout or //dabb:java)", label, d.name))
		}
	}

	if prev, ok := w.seen[name]; ok {
		// The same method reached twice through embedding: the first one
		// counts, and the directives must agree.
		if prev != nil && (prev.idempotent != m.idempotent || prev.timeout != m.timeout || prev.java.String() != m.java.String()) {
			bad("declared twice with different //dabb: directives")
		}
		return
	}
	w.seen[name] = nil
	if !ast.IsExported(name) {
		bad("must be exported")
		return
	}
	fn, _ := p.TypesInfo.Defs[id].(*types.Func)
	if fn == nil {
		bad("does not type-check%s", typeErrors(p))
		return
	}
	if w.svc.dubbo != nil {
		sig, problem := checkDubboSignature(w.l.root.PkgPath, p, fn.Type().(*types.Signature), m.java != nil && m.java.typed)
		if problem == "" && m.java != nil && m.java.typed && len(m.java.types) != len(sig.params) {
			problem = fmt.Sprintf("//dabb:java %s: %d Java types for %d parameters after the context", m.java, len(m.java.types), len(sig.params))
		}
		if problem != "" {
			bad("%s", problem)
			return
		}
		m.dubbo = sig
	} else {
		req, resp, problem := checkSignature(w.l.root.PkgPath, p, fn.Type().(*types.Signature))
		if problem != "" {
			bad("%s", problem)
			return
		}
		m.req, m.resp = req, resp
	}
	w.seen[name] = m
	if !w.bad {
		w.svc.methods = append(w.svc.methods, m)
	}
}

// findSpec returns the declaration of the type obj in p's syntax.
func findSpec(p *packages.Package, obj types.Object) (*ast.TypeSpec, *ast.GenDecl, *ast.File) {
	for _, f := range p.Syntax {
		if obj.Pos() < f.FileStart || obj.Pos() > f.FileEnd {
			continue
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				if ts := s.(*ast.TypeSpec); ts.Name.Pos() == obj.Pos() {
					return ts, gd, f
				}
			}
		}
	}
	return nil, nil, nil
}

// fileOf returns the file of p that holds pos.
func fileOf(p *packages.Package, pos token.Pos) *ast.File {
	for _, f := range p.Syntax {
		if f.FileStart <= pos && pos <= f.FileEnd {
			return f
		}
	}
	return nil
}

const directivePrefix = "//dabb:"

// directive is one //dabb: comment line.
type directive struct {
	c       *ast.Comment
	pos     token.Position
	name    string
	args    []string
	argText string
}

// directives returns the //dabb: lines of a comment group.
func directives(p *packages.Package, cg *ast.CommentGroup) []directive {
	var ds []directive
	for _, c := range commentList(cg) {
		rest, ok := strings.CutPrefix(c.Text, directivePrefix)
		if !ok {
			continue
		}
		name, args, _ := strings.Cut(rest, " ")
		args = strings.TrimSpace(args)
		ds = append(ds, directive{
			c:       c,
			pos:     p.Fset.Position(c.Pos()),
			name:    strings.TrimSpace(name),
			args:    strings.Fields(args),
			argText: args,
		})
	}
	return ds
}

// commentList returns the comments of cg, which may be nil.
func commentList(cg *ast.CommentGroup) []*ast.Comment {
	if cg == nil {
		return nil
	}
	return cg.List
}
