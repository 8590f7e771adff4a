package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTestFileNames: the package's own _test.go files share its package
// block with the generated code under go test, so the names they declare
// are taken; those of an external test package (package small_test) are not.
func TestTestFileNames(t *testing.T) {
	dir := smallModule(t, map[string]string{
		"svc.go": "package small\n" + svcDecls,
		"svc_test.go": `package small

// proxy fronts the server under test.
var proxy = struct{ Addr string }{"127.0.0.1:0"}
`,
		"ext_test.go": "package small_test\n\nvar dabb = 1\n",
	})
	files, err := generate(config{dir: dir, types: []string{"Svc"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"\tproxy1 \"github.com/dabbrpc/dabb/proxy\"\n",
		"\t\"github.com/dabbrpc/dabb\"\n",
		"func NewSvcClient(c proxy1.Caller) Svc",
	} {
		if !bytes.Contains(files[0].src, []byte(want)) {
			t.Errorf("generated file lacks %q:\n%s", want, files[0].src)
		}
	}

	writeFile(t, filepath.Join(dir, "svc_test.go"), "package small\n\ntype svcClient struct{}\n\nfunc new() {}\n")
	_, err = generate(config{dir: dir, types: []string{"Svc"}}, "")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"svc_test.go:3: rpcgen: type Svc: the generated svcClient would clash with this declaration; rename one of them",
		"svc_test.go:5: rpcgen: new: hides Go's builtin new, which the generated code uses; rename it",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestRegenerateCRLFCopy: a generated file checked out with CRLF line
// endings (git's core.autocrlf) is still recognised as rpcgen's: it is
// hidden from the loader and overwritten, not taken for hand-written code.
func TestRegenerateCRLFCopy(t *testing.T) {
	dir := smallModule(t, map[string]string{"svc.go": "package small\n" + svcDecls})
	files := generateAndWrite(t, config{dir: dir, types: []string{"Svc"}}, "")
	crlf := bytes.ReplaceAll(files[0].src, []byte("\n"), []byte("\r\n"))
	if err := os.WriteFile(files[0].path, crlf, 0o644); err != nil {
		t.Fatal(err)
	}
	generateAndWrite(t, config{dir: dir, types: []string{"Svc"}}, "")
	if src, _ := os.ReadFile(files[0].path); !bytes.Equal(src, files[0].src) {
		t.Errorf("the CRLF copy was not regenerated; the file starts:\n%q", src[:min(len(src), 120)])
	}
}

// TestNotFoundExcluded: an interface that only files excluded by build
// constraints declare is reported with those files and their constraints.
func TestNotFoundExcluded(t *testing.T) {
	decl := func(header, iface string) string {
		return header + "package small\n\nimport \"context\"\n\ntype " + iface + " interface {\n\tM(ctx context.Context, req *Req) (*Req, error)\n}\n"
	}
	dir := smallModule(t, map[string]string{
		"req.go":           "package small\n\ntype Req struct{}\n",
		"extra.go":         decl("//go:build extra\n\n", "Extra"),
		"store_windows.go": decl("", "Store"),
		"store_darwin.go":  decl("", "Store"),
		"other_test.go":    decl("//go:build extra\n\n", "InTest"),
		"gone_dabb.go":     generatedHeader + "\n//go:build extra\n\npackage small\n\ntype Gone interface{}\n",
	})
	env := append(os.Environ(), "GOOS=linux")
	tests := []struct {
		typ  string
		want string
	}{
		{"Extra", "extra.go:7: rpcgen: type Extra: not found in package small: build constraints exclude the file that declares it, extra.go (extra); pass -tags, or set GOOS or GOARCH, to build it"},
		{"Store", "store_darwin.go:5: rpcgen: type Store: not found in package small: build constraints exclude the files that declare it, store_darwin.go (darwin), store_windows.go (windows); pass -tags, or set GOOS or GOARCH, to build it"},
		{"InTest", "rpcgen: type InTest: not found in package small (" + dir + ")"},
		{"Gone", "rpcgen: type Gone: not found in package small (" + dir + ")"},
		{"Missing", "rpcgen: type Missing: not found in package small (" + dir + ")"},
	}
	for _, tc := range tests {
		t.Run(tc.typ, func(t *testing.T) {
			_, err := generate(config{dir: dir, types: []string{tc.typ}, env: env}, "")
			if err == nil {
				t.Fatal("no error")
			}
			// The file name is absolute: the module is not below the working directory.
			if got := strings.TrimPrefix(err.Error(), dir+string(filepath.Separator)); got != tc.want {
				t.Errorf("error:\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

// TestModfile: rpcgen reads a module through the go.mod that GOFLAGS names
// with -modfile, set in the environment or by go env -w, with a path
// relative to where rpcgen runs or absolute. Only other.mod requires the
// messages' module, so a run that ignored it could not load the package.
func TestModfile(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "msgs", "go.mod"), "module example.com/msgs\n\ngo 1.26\n")
	writeFile(t, filepath.Join(root, "msgs", "msgs.go"), "package msgs\n\ntype Req struct{}\n")
	dir := filepath.Join(root, "svc")
	writeFile(t, filepath.Join(dir, "go.mod"), "module example.com/svc\n\ngo 1.26\n")
	writeFile(t, filepath.Join(dir, "other.mod"), "module example.com/svc\n\ngo 1.26\n\nrequire example.com/msgs v0.0.0\n\nreplace example.com/msgs => ../msgs\n")
	writeFile(t, filepath.Join(dir, "svc.go"), `package svc

import (
	"context"

	"example.com/msgs"
)

type Svc interface {
	M(ctx context.Context, req *msgs.Req) (*msgs.Req, error)
}
`)
	goenv := filepath.Join(t.TempDir(), "go.env")
	writeFile(t, goenv, "GOFLAGS=-mod=mod -modfile="+filepath.Join(dir, "other.mod")+"\n")
	// GOFLAGS unset, so that the go env file counts.
	base := append(withoutVar(os.Environ(), "GOFLAGS"), "GOWORK=off", "GOPROXY=off")
	tests := []struct {
		name string
		wd   string // working directory of the run
		env  string // added to base
	}{
		{"relative", dir, "GOFLAGS=-modfile=other.mod"},
		{"relative to another directory", root, "GOFLAGS=-modfile=svc/other.mod -mod=mod"},
		{"absolute", root, "GOFLAGS=--modfile=" + filepath.Join(dir, "other.mod")},
		{"go env -w", root, "GOENV=" + goenv},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(tc.wd)
			env := append(base[:len(base):len(base)], tc.env)
			files, err := generate(config{dir: dir, types: []string{"Svc"}, env: env}, "")
			if err != nil {
				t.Fatalf("generate: %v", err)
			}
			if !bytes.Contains(files[0].src, []byte(`"example.com/msgs"`)) {
				t.Errorf("generated file lacks the messages' import:\n%s", files[0].src)
			}
		})
	}
	// Without the -modfile, the package does not load: the test above
	// proves that it was read.
	if _, err := generate(config{dir: dir, types: []string{"Svc"}, env: base}, ""); err == nil {
		t.Error("no error without -modfile, though go.mod does not require example.com/msgs")
	}
}

// withoutVar returns env without the variable name.
func withoutVar(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// TestIsStd: the standard library is what GOROOT holds.
func TestIsStd(t *testing.T) {
	l := &loader{dir: t.TempDir()}
	if err := l.readGoEnv(); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"context": true, "net/url": true, "go/build/constraint": true,
		"harness/pb": false, "harness": false, "github.com/dabbrpc/dabb": false, "golang.org/x/tools": false,
		"net": true,
	} {
		if got := isStd(l.goroot, path); got != want {
			t.Errorf("isStd(%q) = %v, want %v", path, got, want)
		}
	}
}
