package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// smallModule writes a module of its own with the given files.
func smallModule(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "go.mod"), "module example.com/small\n\ngo 1.26\n")
	for name, src := range files {
		writeFile(t, filepath.Join(dir, name), src)
	}
	return dir
}

// svcDecls is the body of a small service file, after its package clause.
const svcDecls = `
import "context"

type Req struct{}

type Svc interface {
	M(ctx context.Context, req *Req) (*Req, error)
}
`

// generateAndWrite runs rpcgen without its command line, failing the test on
// error.
func generateAndWrite(t *testing.T, cfg config, output string) []outFile {
	t.Helper()
	files, err := generate(cfg, output)
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	if err := writeFiles(files); err != nil {
		t.Fatalf("writeFiles: %v", err)
	}
	return files
}

// TestOutputFilesDistinct: two interfaces whose names differ only in case
// would go to one file; rpcgen refuses rather than keep one of them.
func TestOutputFilesDistinct(t *testing.T) {
	dir := smallModule(t, map[string]string{"svc.go": `package small

import "context"

type Req struct{}

type Api interface {
	M(ctx context.Context, req *Req) (*Req, error)
}

type API interface {
	N(ctx context.Context, req *Req) (*Req, error)
}
`})
	_, err := generate(config{dir: dir, types: []string{"Api", "API"}}, "")
	if err == nil || !strings.Contains(err.Error(), "types Api and API would both be written to api_dabb.go") {
		t.Fatalf("err = %v, want the two types named", err)
	}
	if _, err := generate(config{dir: dir, types: []string{"Api", "API"}}, filepath.Join(dir, "both.go")); err != nil {
		t.Fatalf("into one file with -output: %v", err)
	}
}

// TestSeparateRunsNameClash: with one //go:generate line per interface,
// each run keeps the files the others wrote, so a name it would generate
// that one of them declares is refused: User.ProfileGet and UserProfile.Get
// would both get userProfileGetOptions.
func TestSeparateRunsNameClash(t *testing.T) {
	dir := smallModule(t, map[string]string{"svc.go": `package small

import "context"

type Req struct{}

type User interface {
	//dabb:idempotent
	ProfileGet(ctx context.Context, req *Req) (*Req, error)
}

type UserProfile interface {
	//dabb:idempotent
	Get(ctx context.Context, req *Req) (*Req, error)
}
`})
	generateAndWrite(t, config{dir: dir, types: []string{"User"}}, "")
	_, err := generate(config{dir: dir, types: []string{"UserProfile"}}, "")
	if err == nil {
		t.Fatal("no error; user_dabb.go and userprofile_dabb.go would both declare userProfileGetOptions")
	}
	src, _ := os.ReadFile(filepath.Join(dir, "user_dabb.go"))
	file, line, msg := splitPos(t, err.Error())
	want := slices.IndexFunc(strings.Split(string(src), "\n"), func(l string) bool { return strings.HasPrefix(l, "var userProfileGetOptions ") }) + 1
	if filepath.Base(file) != "user_dabb.go" || line != want || want == 0 {
		t.Errorf("error at %s:%d, want user_dabb.go:%d", file, line, want)
	}
	if want := "rpcgen: type UserProfile: the generated userProfileGetOptions is also declared here, in the code generated for User; rename an interface or a method, or delete user_dabb.go if it is stale"; msg != want {
		t.Errorf("message:\n got: %s\nwant: %s", msg, want)
	}

	// Regenerating User, in place or elsewhere (to compare), does not
	// count the names of user_dabb.go: it is that run's own output.
	generateAndWrite(t, config{dir: dir, types: []string{"User"}}, "")
	generateAndWrite(t, config{dir: dir, types: []string{"User"}}, filepath.Join(t.TempDir(), "user_dabb.go"))
}

// TestSeparateRunsOtherBuild: a file generated for another build does not
// take names: user_dabb.go, generated for User under the tag a, is left out
// of the build without the tag, where UserProfile is.
func TestSeparateRunsOtherBuild(t *testing.T) {
	dir := smallModule(t, map[string]string{
		"user.go": `//go:build a

package small

import "context"

type Req struct{}

type User interface {
	//dabb:idempotent
	ProfileGet(ctx context.Context, req *Req) (*Req, error)
}
`,
		"profile.go": `//go:build !a

package small

import "context"

type Req struct{}

type UserProfile interface {
	//dabb:idempotent
	Get(ctx context.Context, req *Req) (*Req, error)
}
`,
	})
	generateAndWrite(t, config{dir: dir, types: []string{"User"}, tags: []string{"a"}}, "")
	generateAndWrite(t, config{dir: dir, types: []string{"UserProfile"}}, "")
}

// TestStaleOutputOfOlderName: a file an older rpcgen wrote for Store of
// store_linux.go under the name store_dabb.go is reported by a Linux run,
// which would otherwise leave both it and store_dabb_linux.go declaring
// NewStoreClient, and is no concern of a Windows run, which does not build
// it.
func TestStaleOutputOfOlderName(t *testing.T) {
	dir := smallModule(t, platformFiles)
	linux := append(os.Environ(), "GOOS=linux")
	windows := append(os.Environ(), "GOOS=windows")
	old := filepath.Join(dir, "store_dabb.go")
	generateAndWrite(t, config{dir: dir, types: []string{"Store"}, env: linux}, old)

	_, err := generate(config{dir: dir, types: []string{"Store"}, env: linux}, "")
	want := "rpcgen: type Store: this run writes it to store_dabb_linux.go, but " + old + ", in the same build, holds code generated earlier for it, so both would declare its names; delete store_dabb.go if it is stale, or write Store there with -output"
	if err == nil || err.Error() != want {
		t.Fatalf("error:\n got: %v\nwant: %s", err, want)
	}
	var stderr bytes.Buffer
	t.Setenv("GOOS", "linux")
	if code := run([]string{"-dir", dir, "-type", "Store"}, &stderr); code != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("rpcgen -type Store: exit status %d, want 1; stderr:\n%s", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "store_dabb_linux.go")); err == nil {
		t.Error("store_dabb_linux.go was written despite the error")
	}
	generateAndWrite(t, config{dir: dir, types: []string{"Store"}, env: windows}, "")
	// As before, with -output, the old name stays usable.
	generateAndWrite(t, config{dir: dir, types: []string{"Store"}, env: linux}, old)

	if err := os.Remove(old); err != nil {
		t.Fatal(err)
	}
	generateAndWrite(t, config{dir: dir, types: []string{"Store"}, env: linux}, "")
	for _, name := range []string{"store_dabb_linux.go", "store_dabb_windows.go"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
}
