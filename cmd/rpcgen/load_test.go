package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
