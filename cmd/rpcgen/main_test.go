package main

import (
	"bytes"
	"errors"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

func TestDuration(t *testing.T) {
	g := &generator{imports: &importSet{byPath: map[string]string{"time": "time"}}}
	tests := []struct {
		d    time.Duration
		want string
	}{
		{200 * time.Millisecond, "200 * time.Millisecond"},
		{2 * time.Second, "2 * time.Second"},
		{time.Second, "time.Second"},
		{1500 * time.Microsecond, "1500 * time.Microsecond"},
		{1500 * time.Millisecond, "1500 * time.Millisecond"},
		{90 * time.Second, "90 * time.Second"},
		{2 * time.Hour, "2 * time.Hour"},
		{time.Minute, "time.Minute"},
		{7, "7 * time.Nanosecond"},
	}
	for _, tc := range tests {
		t.Run(tc.d.String(), func(t *testing.T) {
			if got := g.duration(tc.d); got != tc.want {
				t.Errorf("duration(%v) = %q, want %q", tc.d, got, tc.want)
			}
		})
	}
}

func TestFormatSourceError(t *testing.T) {
	_, err := formatSource([]byte("package x\n\nfunc {\n"))
	if err == nil {
		t.Fatal("no error for source that does not parse")
	}
	for _, want := range []string{"rpcgen: internal error", "    3\tfunc {"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
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

// TestNamesTheOutputWouldMisread: a package-level declaration hiding a
// builtin the generated code uses, and a message type named like one of
// its variables, are refused (the output would not compile, or would mean
// something else).
func TestNamesTheOutputWouldMisread(t *testing.T) {
	dir := smallModule(t, map[string]string{"svc.go": `package small

import "context"

type srv struct{}

type Resp struct{}

func new() {}

type Svc interface {
	M(ctx context.Context, req *srv) (*Resp, error)
}
`})
	_, err := generate(config{dir: dir, types: []string{"Svc"}}, "")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"svc.go:9: rpcgen: new: hides Go's builtin new, which the generated code uses; rename it",
		"svc.go:5: rpcgen: type srv: message of Svc.M, named like a variable of the generated code",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

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

// grepLine returns the first line of src that contains s, or "".
func grepLine(src []byte, s string) string {
	for line := range strings.SplitSeq(string(src), "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
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
