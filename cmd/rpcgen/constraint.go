// Build constraints: a file's, carried to its output, and the output's name.

package main

import (
	"go/ast"
	"go/build/constraint"
	"go/token"
	"path/filepath"
	"strings"
)

// knownOS and knownArch are the GOOS and GOARCH values that make a file-name
// suffix a build constraint. They are go/build's lists (internal/syslist).
// These include ports that no longer exist or do not exist yet.
var (
	knownOS = setOf("aix android darwin dragonfly freebsd hurd illumos ios js linux nacl netbsd openbsd plan9 solaris wasip1 windows zos")

	knownArch = setOf("386 amd64 amd64p32 arm armbe arm64 arm64be loong64 mips mipsle mips64 mips64le mips64p32 mips64p32le ppc ppc64 ppc64le riscv riscv64 s390 s390x sparc sparc64 wasm")
)

func setOf(words string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(words) {
		m[w] = true
	}
	return m
}

// fileConstraint returns the build constraint of a file, or nil if it has
// none. It joins the constraint its name implies (a _GOOS, _GOARCH or
// _GOOS_GOARCH suffix) to that of its //go:build line. Lacking that line, it
// reads the file's // +build lines.
func fileConstraint(fset *token.FileSet, f *ast.File) (constraint.Expr, error) {
	x := fileNameConstraint(filepath.Base(fset.Position(f.Package).Filename))
	var goBuild, plusBuild constraint.Expr
	for _, g := range f.Comments {
		if g.End() >= f.Package {
			break
		}
		for _, c := range g.List {
			switch {
			case constraint.IsGoBuild(c.Text):
				e, err := constraint.Parse(c.Text)
				if err != nil {
					return nil, posErr(fset.Position(c.Pos()), "%s: %v", c.Text, err)
				}
				goBuild = e
			case constraint.IsPlusBuild(c.Text) && g != f.Doc:
				// The go command reads // +build lines only above a blank
				// line, so not in the package's doc comment.
				e, err := constraint.Parse(c.Text)
				if err != nil {
					return nil, posErr(fset.Position(c.Pos()), "%s: %v", c.Text, err)
				}
				plusBuild = and(plusBuild, e)
			}
		}
	}
	if goBuild != nil {
		return and(x, goBuild), nil
	}
	return and(x, plusBuild), nil
}

// fileNameConstraint returns the constraint a file name implies, by the go
// command's rule: name_GOOS.go, name_GOARCH.go, name_GOOS_GOARCH.go, each
// optionally followed by _test.
func fileNameConstraint(name string) constraint.Expr {
	name, _, _ = strings.Cut(name, ".")
	name = strings.TrimSuffix(name, "_test")
	var x constraint.Expr
	for tag := range strings.SplitSeq(osArchSuffix(name), "_") {
		if tag != "" {
			x = and(x, &constraint.TagExpr{Tag: tag})
		}
	}
	return x
}

// osArchSuffix returns the _GOOS, _GOARCH or _GOOS_GOARCH suffix of stem, a
// file name without its extension or _test, or "" if it has none. The part
// before the first _ does not count: linux.go has no suffix.
func osArchSuffix(stem string) string {
	i := strings.Index(stem, "_")
	if i < 0 {
		return ""
	}
	l := strings.Split(stem[i:], "_") // l[0] is ""
	n := len(l)
	switch {
	case n >= 3 && knownOS[l[n-2]] && knownArch[l[n-1]]:
		return "_" + l[n-2] + "_" + l[n-1]
	case knownOS[l[n-1]] || knownArch[l[n-1]]:
		return "_" + l[n-1]
	}
	return ""
}

// outputName returns the default name of the file generated for the
// interface iface declared in the file src. constrained tells whether src
// has a build constraint. Without one, the name is <lowercase iface>_dabb.go.
// With one, it is also derived from src's, and a _GOOS or _GOARCH suffix of
// src's name stays last. Store of store_linux.go goes to
// store_dabb_linux.go, of store_unix.go to store_unix_dabb.go, and of
// svc_linux.go to store_svc_dabb_linux.go.
func outputName(iface, src string, constrained bool) string {
	lower := strings.ToLower(iface)
	if !constrained {
		return lower + "_dabb.go"
	}
	// One interface may be declared in files for different builds, such as
	// store_linux.go and store_windows.go: each gets a file of its own.
	src = strings.TrimSuffix(src, ".go")
	stem, rest, dot := strings.Cut(src, ".") // go/build reads the suffix before the first dot
	if dot {
		rest = "." + rest
	}
	suffix := osArchSuffix(stem)
	base := strings.TrimSuffix(stem, suffix)
	if l := strings.ToLower(base); l != lower && !strings.HasPrefix(l, lower+"_") {
		base = lower + "_" + base
	}
	return base + "_dabb" + suffix + rest + ".go"
}

// and returns x && y, either of which may be nil.
func and(x, y constraint.Expr) constraint.Expr {
	switch {
	case x == nil:
		return y
	case y == nil:
		return x
	}
	return &constraint.AndExpr{X: x, Y: y}
}
