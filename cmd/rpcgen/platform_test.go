package main

import (
	"bytes"
	"errors"
	"go/build"
	"go/build/constraint"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOutputName: the default output name is <lowercase type>_dabb.go for a
// source file without a build constraint, and otherwise carries the source
// file's name, with the same _GOOS/_GOARCH suffix last, so that the name
// implies exactly the constraint the source file's name does.
func TestOutputName(t *testing.T) {
	tests := []struct {
		iface, src  string
		constrained bool
		want        string
	}{
		{"Store", "store.go", false, "store_dabb.go"},
		{"Store", "svc.go", false, "store_dabb.go"},
		{"Store", "store_v2.go", false, "store_dabb.go"},
		{"Store", "store.go", true, "store_dabb.go"},
		{"Store", "store_linux.go", true, "store_dabb_linux.go"},
		{"Store", "store_windows.go", true, "store_dabb_windows.go"},
		{"Store", "store_amd64.go", true, "store_dabb_amd64.go"},
		{"Store", "store_windows_amd64.go", true, "store_dabb_windows_amd64.go"},
		{"Store", "store_unix.go", true, "store_unix_dabb.go"},
		{"Store", "store_fast_linux.go", true, "store_fast_dabb_linux.go"},
		{"Store", "svc_linux.go", true, "store_svc_dabb_linux.go"},
		{"Store", "linux.go", true, "store_linux_dabb.go"},             // no suffix: linux.go is not Linux-only
		{"Store", "linux_amd64.go", true, "store_linux_dabb_amd64.go"}, // amd64 only
		{"Store", "Store_linux.go", true, "Store_dabb_linux.go"},
		{"Store", "store.a.go", true, "store_dabb.a.go"},
		{"Store", "store_linux.v2.go", true, "store_dabb_linux.v2.go"},
		{"KV", "kv_store_darwin_arm64.go", true, "kv_store_dabb_darwin_arm64.go"},
		{"KVStore", "kv_darwin.go", true, "kvstore_kv_dabb_darwin.go"},
	}
	for _, tc := range tests {
		got := outputName(tc.iface, tc.src, tc.constrained)
		if got != tc.want {
			t.Errorf("outputName(%q, %q, %v) = %q, want %q", tc.iface, tc.src, tc.constrained, got, tc.want)
		}
		if x, y := fileNameConstraint(tc.src), fileNameConstraint(got); tc.constrained && exprString(x) != exprString(y) {
			t.Errorf("%s implies %v, %s implies %v", tc.src, x, got, y)
		}
	}
}

// exprString is e as a //go:build expression; "" for none.
func exprString(e constraint.Expr) string {
	if e == nil {
		return ""
	}
	return e.String()
}

// platformFiles is a package that declares Store once per platform, Cache
// only on unix systems and Plain everywhere.
var platformFiles = map[string]string{
	"common.go": "package svc\n\ntype Req struct{}\n",
	"store_linux.go": `package svc

import "context"

type Store interface {
	Get(ctx context.Context, req *Req) (*Req, error)
}
`,
	"store_windows.go": `package svc

import "context"

// Store has one more method on Windows.
type Store interface {
	Get(ctx context.Context, req *Req) (*Req, error)
	Lock(ctx context.Context, req *Req) (*Req, error)
}
`,
	"cache_unix.go": `//go:build unix

package svc

import "context"

type Cache interface {
	Get(ctx context.Context, req *Req) (*Req, error)
}
`,
	"plain.go": `package svc

import "context"

type Plain interface {
	Get(ctx context.Context, req *Req) (*Req, error)
}
`,
}

// platformRun is one run of rpcgen for the package of platformFiles, as go
// generate makes it under GOOS.
type platformRun struct {
	goos  string
	types []string
}

var (
	linuxRun   = platformRun{"linux", []string{"Store", "Cache", "Plain"}}
	windowsRun = platformRun{"windows", []string{"Store", "Plain"}}
)

// platformOutputs are the files the runs write, by the file declaring their
// interface.
var platformOutputs = map[string]string{
	"store_linux.go":   "store_dabb_linux.go",
	"store_windows.go": "store_dabb_windows.go",
	"cache_unix.go":    "cache_unix_dabb.go",
	"plain.go":         "plain_dabb.go",
}

// TestPlatformFiles: an interface declared in store_linux.go and in
// store_windows.go is generated into a file per platform, whichever run
// comes first, and a run leaves the other platform's file alone. Each file
// builds exactly where its source file does, and the package vets on both
// platforms.
func TestPlatformFiles(t *testing.T) {
	root, env := shimModule(t)
	for _, order := range [][]platformRun{{linuxRun, windowsRun}, {windowsRun, linuxRun}} {
		t.Run(order[0].goos+" first", func(t *testing.T) {
			dir := filepath.Join(root, order[0].goos+"first")
			for name, src := range platformFiles {
				writeFile(t, filepath.Join(dir, name), src)
			}
			written := map[string][]byte{}
			for _, r := range append(order, order...) { // each run twice
				files := generateAndWrite(t, config{dir: dir, types: r.types, env: append(slices.Clip(env), "GOOS="+r.goos)}, "")
				for _, f := range files {
					written[filepath.Base(f.path)] = f.src
				}
			}
			// Every output is there, in a file of its own named for its
			// source file, as its last run wrote it.
			bySource := map[string]string{}
			gen, err := generatedFiles(dir)
			if err != nil {
				t.Fatal(err)
			}
			for out, src := range gen {
				source := grepLine(src, "// Source: ")
				if other, ok := bySource[source]; ok {
					t.Errorf("%s and %s both say %q", other, out, source)
				}
				bySource[source] = out
				if !bytes.Equal(src, written[out]) {
					t.Errorf("%s is not as its last run wrote it; it starts:\n%s", out, src[:min(len(src), 200)])
				}
			}
			for src, out := range platformOutputs {
				if got := bySource["// Source: "+src]; got != out {
					t.Errorf("the output for %s is %q, want %s; the generated files are %v", src, got, out, slices.Sorted(maps.Keys(gen)))
				}
			}
			if lock := bytes.Contains(written["store_dabb_windows.go"], []byte("func (c *storeClient) Lock(")); !lock {
				t.Error("store_dabb_windows.go lacks the Windows-only method Lock")
			}
			if lock := bytes.Contains(written["store_dabb_linux.go"], []byte("Lock")); lock {
				t.Error("store_dabb_linux.go has the Windows-only method Lock")
			}
			// Each builds exactly where its source file does.
			for _, goos := range []string{"linux", "windows", "darwin"} {
				ctx := build.Default
				ctx.GOOS, ctx.GOARCH = goos, "amd64"
				for src, out := range platformOutputs {
					s, err1 := ctx.MatchFile(dir, src)
					g, err2 := ctx.MatchFile(dir, out)
					if err1 != nil || err2 != nil {
						t.Error(errors.Join(err1, err2))
						continue
					}
					if s != g {
						t.Errorf("GOOS=%s: %s builds: %v, %s builds: %v", goos, src, s, out, g)
					}
				}
			}
		})
	}
	if testing.Short() {
		t.Skip("-short: skipping go vet, which compiles for each platform")
	}
	for _, goos := range []string{"linux", "windows"} {
		cmd := exec.Command(goTool(t), "vet", "./linuxfirst", "./windowsfirst")
		cmd.Dir = root
		cmd.Env = append(slices.Clip(env), "GOOS="+goos, "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s go vet: %v\n%s", goos, err, out)
		}
	}
}

// TestPlatformFilesGoGenerate: the same through go generate, once per
// platform, with a //go:generate line in each platform's file.
func TestPlatformFilesGoGenerate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the go generate test, which builds rpcgen")
	}
	goCmd := goTool(t)
	bin := t.TempDir()
	if out, err := exec.Command(goCmd, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	root, env := shimModule(t)
	dir := filepath.Join(root, "svc")
	for name, src := range platformFiles {
		if strings.HasPrefix(name, "store_") {
			src = strings.Replace(src, "\ntype Store", "\n//go:generate rpcgen -type Store\ntype Store", 1)
		}
		writeFile(t, filepath.Join(dir, name), src)
	}
	env = append(slices.Clip(env), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	for _, goos := range []string{"linux", "windows"} {
		cmd := exec.Command(goCmd, "generate", "./svc")
		cmd.Dir = root
		cmd.Env = append(slices.Clip(env), "GOOS="+goos)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("GOOS=%s go generate: %v\n%s", goos, err, out)
		}
	}
	for _, name := range []string{"store_dabb_linux.go", "store_dabb_windows.go"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "store_dabb.go")); err == nil {
		t.Error("store_dabb.go was written")
	}
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

// shimModule returns the root of a module standing in for the dabb runtime
// (see TestCompileShapes), in which packages of generated code can be vetted,
// and the environment of the go command for it.
func shimModule(t *testing.T) (string, []string) {
	t.Helper()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "go.mod"), "module github.com/dabbrpc/dabb\n\ngo 1.26\n")
	writeFile(t, filepath.Join(root, "dabb.go"), shimDabb)
	writeFile(t, filepath.Join(root, "proxy", "proxy.go"), shimProxy)
	writeFile(t, filepath.Join(root, "codec", "proto", "proto.go"), "// Package proto stands in for the protobuf codec.\npackage proto\n")
	return root, append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod")
}
