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

// TestBuildConstraintCarried: the generated file builds under the same
// constraint as the file declaring its interface, whether that comes from a
// //go:build line, // +build lines or the file's name, so a build where that
// file is left out does not see code referring to declarations that are not
// there.
func TestBuildConstraintCarried(t *testing.T) {
	tests := []struct {
		name   string
		file   string
		header string // before the package clause
		want   string // the generated //go:build expression; "" for none
	}{
		{"go:build line", "svc.go", "//go:build extra\n\n", "extra"},
		{"GOOS suffix", "svc_linux.go", "", "linux"},
		{"GOARCH suffix", "svc_amd64.go", "", "amd64"},
		{"GOOS_GOARCH suffix and go:build line", "svc_linux_amd64.go", "//go:build extra || other\n\n", "linux && amd64 && (extra || other)"},
		{"not a suffix", "svc_v2.go", "", ""},
		{"+build lines", "svc.go", "// +build extra\n// +build linux,amd64 darwin\n\n", "extra && ((linux && amd64) || darwin)"},
		{"+build line with a suffix", "svc_linux.go", "// +build extra\n\n", "linux && extra"},
		{"go:build line wins over +build", "svc.go", "//go:build extra\n// +build other\n\n", "extra"},
		{"+build line in the package doc, which the go command ignores", "svc.go", "// +build extra\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := smallModule(t, map[string]string{
				tc.file:  tc.header + "package small\n" + svcDecls,
				"doc.go": "package small\n",
			})
			env := append(os.Environ(), "GOOS=linux", "GOARCH=amd64")
			files := generateAndWrite(t, config{dir: dir, types: []string{"Svc"}, tags: []string{"extra"}, env: env}, "")
			want := ""
			if tc.want != "" {
				want = "//go:build " + tc.want
			}
			if line := grepLine(files[0].src, "//go:build"); line != want {
				t.Errorf("generated constraint %q, want %q", line, want)
			}
			// The generated file builds exactly where the source file does.
			for _, goos := range []string{"linux", "darwin", "windows"} {
				for _, goarch := range []string{"amd64", "arm64"} {
					for _, tags := range [][]string{nil, {"extra"}, {"other"}} {
						ctx := build.Default
						ctx.GOOS, ctx.GOARCH, ctx.BuildTags = goos, goarch, tags
						src, err1 := ctx.MatchFile(dir, tc.file)
						gen, err2 := ctx.MatchFile(dir, filepath.Base(files[0].path))
						if err1 != nil || err2 != nil {
							t.Fatal(errors.Join(err1, err2))
						}
						if src != gen {
							t.Errorf("GOOS=%s GOARCH=%s tags %v: %s builds: %v, the generated file builds: %v", goos, goarch, tags, tc.file, src, gen)
						}
					}
				}
			}
		})
	}
}

// TestKnownOSArch: the GOOS and GOARCH lists that give file-name suffixes
// their meaning are go/build's, and include every port of this Go.
func TestKnownOSArch(t *testing.T) {
	ctx := build.Default
	ctx.GOOS, ctx.GOARCH = "none", "none"
	dir := t.TempDir() // empty: go/build opens only files whose name it does not rule out
	for _, m := range []map[string]bool{knownOS, knownArch} {
		for w := range m {
			if ok, err := ctx.MatchFile(dir, "x_"+w+".go"); ok || err != nil {
				t.Errorf("go/build does not take the suffix _%s as a GOOS or GOARCH", w)
			}
		}
	}
	out, err := exec.Command(goTool(t), "tool", "dist", "list").Output()
	if err != nil {
		t.Skipf("go tool dist list: %v", err)
	}
	for _, port := range strings.Fields(string(out)) {
		goos, goarch, _ := strings.Cut(port, "/")
		if !knownOS[goos] || !knownArch[goarch] {
			t.Errorf("port %s is missing from knownOS or knownArch", port)
		}
	}
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
	writeFile(t, filepath.Join(root, "codec", "json", "json.go"), "// Package json stands in for the JSON codec.\npackage json\n")
	return root, append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod")
}

// grepLine returns the first line of src that contains s, or "".
func grepLine(src []byte, s string) string {
	for line := range strings.SplitSeq(string(src), "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}
