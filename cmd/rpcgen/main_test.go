package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRunUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"no type", nil, 2, "-type is required"},
		{"empty type", []string{"-type", " , "}, 2, "-type is required"},
		{"bad identifier", []string{"-type", "Inventory,1x"}, 2, `"1x" is not a Go identifier`},
		{"extra argument", []string{"-type", "X", "file.go"}, 2, "unexpected arguments: file.go"},
		{"unknown flag", []string{"-typo", "X"}, 2, "flag provided but not defined: -typo"},
		{"bad tag", []string{"-type", "X", "-tags", "extra,feature-v2"}, 2, `-tags: "feature-v2" is not a build tag (letters, digits, '_' and '.')`},
		{"negated tag", []string{"-type", "X", "-tags", "!extra"}, 2, `-tags: "!extra" is not a build tag`},
		{"help", []string{"-h"}, 0, "usage: rpcgen -type T"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tc.args, &stderr); code != tc.code {
				t.Errorf("exit status %d, want %d; stderr:\n%s", code, tc.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr.String())
			}
		})
	}
}

const fleetSrc = `package fleet

import "context"

type Car struct{ ID string }

//go:generate rpcgen -type Cars,Trucks
type Cars interface {
	Rent(ctx context.Context, req *Car) (*Car, error)
}

type Trucks interface {
	//dabb:timeout 3s
	Rent(ctx context.Context, req *Car) (*Car, error)
}

type Broken interface {
	Rent(req *Car) (*Car, error)
}

// Rent uses the code about to be generated: rpcgen must not mind that it
// does not exist yet.
var _ = NewCarsClient
`

// fleetModule writes a module of its own with fleetSrc in it, so that rpcgen
// is run on a package outside the dabb module, as users do.
func fleetModule(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "go.mod"), "module example.com/fleet\n\ngo 1.26\n")
	writeFile(t, filepath.Join(dir, "fleet.go"), fleetSrc)
	return dir
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRunWritesOneFilePerType(t *testing.T) {
	dir := fleetModule(t)
	var stderr bytes.Buffer
	if code := run([]string{"-dir", dir, "-type", "Cars,Trucks"}, &stderr); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr.String())
	}
	for _, iface := range []string{"Cars", "Trucks"} {
		name := strings.ToLower(iface) + "_dabb.go"
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(src, []byte(generatedHeader+"// Source: fleet.go\n// Interfaces: "+iface+"\n\npackage fleet\n")) {
			t.Errorf("%s starts with:\n%s", name, src[:min(len(src), 120)])
		}
	}
	trucks, _ := os.ReadFile(filepath.Join(dir, "trucks_dabb.go"))
	if !bytes.Contains(trucks, []byte("proxy.Timeout(3 * time.Second)")) {
		t.Errorf("trucks_dabb.go lacks the timeout option:\n%s", trucks)
	}

	// An unchanged file is not rewritten.
	cars := filepath.Join(dir, "cars_dabb.go")
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(cars, old, old); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"-dir", dir, "-type", "Cars"}, &stderr); code != 0 {
		t.Fatalf("second run: exit status %d; stderr:\n%s", code, stderr.String())
	}
	if fi, err := os.Stat(cars); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("unchanged cars_dabb.go was rewritten (mtime %v, err %v)", fi.ModTime(), err)
	}

	// A stale generated file that no longer compiles does not stand in the
	// way of its own regeneration.
	writeFile(t, cars, generatedHeader+"\npackage fleet\n\nimport \"example.com/gone\"\n\nvar NewCarsClient = gone.X + undefined\n")
	if code := run([]string{"-dir", dir, "-type", "Cars"}, &stderr); code != 0 {
		t.Fatalf("run over a stale file: exit status %d; stderr:\n%s", code, stderr.String())
	}
	if src, _ := os.ReadFile(cars); !bytes.Contains(src, []byte("func NewCarsClient(")) {
		t.Errorf("stale file was not regenerated:\n%s", src)
	}
}

func TestRunOutput(t *testing.T) {
	dir := fleetModule(t)
	out := filepath.Join(dir, "all_dabb.go")
	var stderr bytes.Buffer
	if code := run([]string{"-dir", dir, "-type", "Cars,Trucks", "-output", out}, &stderr); code != 0 {
		t.Fatalf("exit status %d; stderr:\n%s", code, stderr.String())
	}
	src, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"func NewCarsClient(", "func NewTrucksClient("} {
		if !bytes.Contains(src, []byte(want)) {
			t.Errorf("%s lacks %q", out, want)
		}
	}
	if n := bytes.Count(src, []byte("SupportPackageIsVersion1")); n != 1 {
		t.Errorf("version guard appears %d times, want 1", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "cars_dabb.go")); err == nil {
		t.Error("cars_dabb.go written although -output was given")
	}
}

func TestRunWritesNothingOnError(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		types string
		want  string
	}{
		{
			name:  "bad method",
			types: "Cars,Broken",
			want:  "fleet.go:18: rpcgen: method Rent: must take exactly two parameters",
		},
		{
			name:  "hand-written file in the way",
			types: "Cars,Trucks",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "trucks_dabb.go"), "package fleet\n\n// Mine.\n")
			},
			want: "trucks_dabb.go: it was not written by rpcgen",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := fleetModule(t)
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			var stderr bytes.Buffer
			if code := run([]string{"-dir", dir, "-type", tc.types}, &stderr); code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr.String())
			}
			if _, err := os.Stat(filepath.Join(dir, "cars_dabb.go")); err == nil {
				t.Error("cars_dabb.go was written despite the error")
			}
			if tc.setup != nil {
				if src, _ := os.ReadFile(filepath.Join(dir, "trucks_dabb.go")); !bytes.Contains(src, []byte("// Mine.")) {
					t.Error("the hand-written file was overwritten")
				}
			}
		})
	}
}

func TestRunTags(t *testing.T) {
	dir := fleetModule(t)
	writeFile(t, filepath.Join(dir, "extra.go"), `//go:build extra

package fleet

import "context"

type Extra interface {
	Rent(ctx context.Context, req *Car) (*Car, error)
}
`)
	var stderr bytes.Buffer
	if code := run([]string{"-dir", dir, "-type", "Extra"}, &stderr); code != 1 || !strings.Contains(stderr.String(), "type Extra: not found in package fleet: build constraints exclude the file that declares it, extra.go (extra); pass -tags") {
		t.Errorf("without -tags: exit status %d, stderr:\n%s", code, stderr.String())
	}
	// Every form the go command accepts, with a tag that is not an
	// identifier.
	for _, tags := range []string{"extra", "extra,feature.v2", "feature.v2 extra", " extra, "} {
		os.Remove(filepath.Join(dir, "extra_dabb.go"))
		stderr.Reset()
		if code := run([]string{"-dir", dir, "-type", "Extra", "-tags", tags}, &stderr); code != 0 {
			t.Errorf("with -tags %q: exit status %d, stderr:\n%s", tags, code, stderr.String())
		}
		if _, err := os.Stat(filepath.Join(dir, "extra_dabb.go")); err != nil {
			t.Errorf("with -tags %q: %v", tags, err)
		}
	}
}

// TestSeparateRunsSameFile: a generated file holding the code of an
// interface is replaced only by a run that generates that interface again:
// -type Api and -type API in separate runs both write api_dabb.go, and the
// second must not silently drop NewApiClient.
func TestSeparateRunsSameFile(t *testing.T) {
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
	api := filepath.Join(dir, "api_dabb.go")
	both := filepath.Join(dir, "both_dabb.go")
	tests := []struct {
		name   string
		before []string // -type of a first run, if any
		output string
		types  []string
		want   string // error; "" for none
	}{
		{"other type", []string{"Api"}, "", []string{"API"},
			"rpcgen: refusing to overwrite " + api + ": it holds the code generated for Api, which this run (for API) would drop; write one of them to another file with -output, or delete " + api + " if that code is no longer wanted"},
		{"same type", []string{"Api"}, "", []string{"Api"}, ""},
		{"more types", []string{"Api"}, both, []string{"Api", "API"}, ""},
		{"fewer types", []string{"Api", "API"}, both, []string{"API"},
			"rpcgen: refusing to overwrite " + both + ": it holds the code generated for Api, which this run (for API) would drop"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(api)
			os.Remove(both)
			first := generateAndWrite(t, config{dir: dir, types: tc.before}, tc.output)
			files, err := generate(config{dir: dir, types: tc.types}, tc.output)
			if err != nil {
				t.Fatal(err)
			}
			err = writeFiles(files)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("writeFiles: %v", err)
			case tc.want == "":
				return
			case err == nil || !strings.HasPrefix(err.Error(), tc.want):
				t.Fatalf("error:\n got: %v\nwant: %s", err, tc.want)
			}
			if src, _ := os.ReadFile(first[0].path); !bytes.Equal(src, first[0].src) {
				t.Errorf("%s was overwritten despite the error", first[0].path)
			}
		})
	}
}

// TestOverwriteOlderOutput: a generated file that does not say which
// interfaces it holds (rpcgen wrote none before) may be replaced.
func TestOverwriteOlderOutput(t *testing.T) {
	dir := smallModule(t, map[string]string{"svc.go": "package small\n" + svcDecls})
	writeFile(t, filepath.Join(dir, "svc_dabb.go"), generatedHeader+"// Source: svc.go\n\npackage small\n")
	files := generateAndWrite(t, config{dir: dir, types: []string{"Svc"}}, "")
	if src, _ := os.ReadFile(files[0].path); !bytes.Equal(src, files[0].src) {
		t.Errorf("svc_dabb.go was not regenerated:\n%s", src)
	}
}
