package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestImportGroups: the generated imports are grouped by where the package
// is, the standard library or not, whatever the dots of its path: harness/pb
// is a module's package, net/url is the standard library's.
func TestImportGroups(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "go.mod"), "module harness\n\ngo 1.26\n")
	writeFile(t, filepath.Join(dir, "pb", "pb.go"), "package pb\n\ntype Reply struct{}\n")
	writeFile(t, filepath.Join(dir, "svc", "svc.go"), `package svc

import (
	"context"
	"net/url"

	"harness/pb"
)

type Svc interface {
	Get(ctx context.Context, req *url.URL) (*pb.Reply, error)
}
`)
	files, err := generate(config{dir: filepath.Join(dir, "svc"), types: []string{"Svc"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	src := string(files[0].src)
	start, end := strings.Index(src, "import (\n"), strings.Index(src, "\n)\n")
	if start < 0 || end < start {
		t.Fatalf("no import block:\n%s", src)
	}
	var groups [][]string
	for g := range strings.SplitSeq(src[start+len("import (\n"):end], "\n\n") {
		groups = append(groups, strings.Fields(g))
	}
	want := [][]string{
		{`"context"`, `"net/url"`},
		{`"github.com/dabbrpc/dabb"`, `_`, `"github.com/dabbrpc/dabb/codec/proto"`, "//", "the", "default", "codec", `"github.com/dabbrpc/dabb/proxy"`},
		{`"harness/pb"`},
	}
	if !slices.EqualFunc(groups, want, slices.Equal) {
		t.Errorf("import groups %q, want %q; the file:\n%s", groups, want, src)
	}
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
