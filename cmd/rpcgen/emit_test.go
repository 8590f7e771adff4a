package main

import (
	"bytes"
	"flag"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// goldenCase is one input package and the interfaces to generate for.
type goldenCase struct {
	name   string // directory under testdata, and subtest name
	types  []string
	output string // -output; "" for the default file names
	// protobuf: the messages include protobuf messages, which the
	// stand-in runtime of TestCompileShapes cannot build.
	protobuf bool
	// dubbo: the case has a //dabb:dubbo interface; TestCompile runs a
	// test of its generated code over a real connection.
	dubbo bool
}

var goldenCases = []goldenCase{
	{name: "basic", types: []string{"Inventory"}},
	{name: "service", types: []string{"Catalog"}},
	{name: "crosspkg", types: []string{"Shop"}},
	{name: "samepkg", types: []string{"Ledger"}},
	{name: "embedded", types: []string{"Admin"}},
	{name: "multi", types: []string{"Cars", "Trucks"}, output: "fleet_dabb.go"},
	{name: "codecs", types: []string{"Stock", "Ledger"}, output: "codecs_dabb.go", protobuf: true},
	{name: "dubbo", types: []string{"Shop"}, dubbo: true},
}

// TestGolden compares the generated code with testdata/<case>/<file>.golden.
// Run with -update to rewrite the golden files after a deliberate change.
func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join("testdata", tc.name)
			files, err := generate(config{dir: dir, types: tc.types}, tc.output)
			if err != nil {
				t.Fatalf("generate: %v", err)
			}
			if len(files) != 1 {
				t.Fatalf("generate returned %d files, want 1", len(files))
			}
			got := files[0].src
			golden := filepath.Join(dir, filepath.Base(files[0].path)+".golden")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("generated code differs from %s (run go test -update if the change is deliberate)\n%s", golden, lineDiff(string(want), string(got)))
			}
		})
	}
}

// TestCodecImports: the generated code imports only the codecs its
// services use: the protobuf codec for a service of protobuf messages, the
// JSON codec for one with a plain Go type among its messages.
func TestCodecImports(t *testing.T) {
	for _, tc := range []struct {
		dir   string
		types []string
		want  []string
	}{
		{"basic", []string{"Inventory"}, []string{jsonCodecPath}},
		{"codecs", []string{"Stock"}, []string{protoCodecPath}},
		{"codecs", []string{"Ledger"}, []string{jsonCodecPath}},
		{"codecs", []string{"Stock", "Ledger"}, []string{jsonCodecPath, protoCodecPath}},
	} {
		t.Run(strings.Join(tc.types, ","), func(t *testing.T) {
			files, err := generate(config{dir: filepath.Join("testdata", tc.dir), types: tc.types}, filepath.Join(t.TempDir(), "out_dabb.go"))
			if err != nil {
				t.Fatalf("generate: %v", err)
			}
			src := string(files[0].src)
			for _, p := range []string{protoCodecPath, jsonCodecPath} {
				if got := strings.Contains(src, strconv.Quote(p)); got != slices.Contains(tc.want, p) {
					t.Errorf("imports %s: %v, want %v", p, got, !got)
				}
			}
			hint := strings.Contains(src, `proxy.WithCodec("json")`)
			if hint != slices.Contains(tc.types, "Ledger") && tc.dir == "codecs" {
				t.Errorf("the JSON codec hint on the client constructor: %v, want it on Ledger's only", hint)
			}
		})
	}
}

// TestGoldenDeterministic checks that two runs produce the same bytes.
func TestGoldenDeterministic(t *testing.T) {
	tc := goldenCases[2] // crosspkg: the most imports
	var outs [2][]byte
	for i := range outs {
		files, err := generate(config{dir: filepath.Join("testdata", tc.name), types: tc.types}, "")
		if err != nil {
			t.Fatalf("generate: %v", err)
		}
		outs[i] = files[0].src
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Errorf("two runs differ:\n%s", lineDiff(string(outs[0]), string(outs[1])))
	}
}

// lineDiff shows the first differing line of want and got, with context.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl || i >= len(w) || i >= len(g) {
			return "first difference at line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl
		}
	}
	return "no line differs (line endings?)"
}

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
		{`"github.com/dabbrpc/dabb"`, `_`, `"github.com/dabbrpc/dabb/codec/json"`, "//", "the", "messages", "are", "plain", "Go", "types", `"github.com/dabbrpc/dabb/proxy"`},
		{`"harness/pb"`},
	}
	if !slices.EqualFunc(groups, want, slices.Equal) {
		t.Errorf("import groups %q, want %q; the file:\n%s", groups, want, src)
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

// TestCompile generates every golden case into a package inside this module,
// then vets it and runs a loopback test against the real dabb runtime. It is
// skipped while the runtime packages do not build.
func TestCompile(t *testing.T) {
	goCmd := goTool(t)
	out, err := exec.Command(goCmd, "build", dabbPath, proxyPath, protoCodecPath, jsonCodecPath, dubboPath).CombinedOutput()
	if err != nil {
		t.Skipf("skipping: the dabb runtime (%s, %s, %s, %s, %s) does not build yet, so generated code cannot be compiled against it; TestCompileShapes still checks it against the documented API:\n%s",
			dabbPath, proxyPath, protoCodecPath, jsonCodecPath, dubboPath, out)
	}
	// Under testdata, so that "go build ./..." ignores it, and inside the
	// module, so that it can import the runtime.
	dir, err := os.MkdirTemp("testdata", "compile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	compileCases(t, goCmd, dir, nil, true)
}

// TestCompileShapes does what TestCompile does, against a stand-in for the
// runtime in a module of its own that declares exactly the API the generated
// code is documented to use. It runs whether the real runtime builds or not.
func TestCompileShapes(t *testing.T) {
	goCmd := goTool(t)
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "go.mod"), "module github.com/dabbrpc/dabb\n\ngo 1.26\n")
	writeFile(t, filepath.Join(root, "dabb.go"), shimDabb)
	writeFile(t, filepath.Join(root, "proxy", "proxy.go"), shimProxy)
	writeFile(t, filepath.Join(root, "codec", "proto", "proto.go"), "// Package proto stands in for the protobuf codec.\npackage proto\n")
	writeFile(t, filepath.Join(root, "codec", "json", "json.go"), "// Package json stands in for the JSON codec.\npackage json\n")
	writeFile(t, filepath.Join(root, "dubbo", "dubbo.go"), shimDubbo)
	copyTree(t, filepath.Join("testdata", "types"), filepath.Join(root, "cmd", "rpcgen", "testdata", "types"))
	env := append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod")
	compileCases(t, goCmd, filepath.Join(root, "cmd", "rpcgen", "testdata", "compile"), env, false)
}

// compileCases copies each golden case into dir, runs rpcgen on it, adds a
// loopback test to the basic case, and vets and tests the result with env.
// With full set, dir is in this module and builds against the real runtime:
// it also holds the cases whose messages are protobuf messages, and the
// Dubbo case gets a test of its own over a real connection.
func compileCases(t *testing.T, goCmd, dir string, env []string, full bool) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping the compile test, which runs the go command")
	}
	var pkgs []string
	for _, tc := range goldenCases {
		if tc.protobuf && !full {
			continue
		}
		caseDir := filepath.Join(dir, tc.name)
		copyTree(t, filepath.Join("testdata", tc.name), caseDir)
		output := tc.output
		if output != "" {
			output = filepath.Join(caseDir, output)
		}
		files, err := generate(config{dir: caseDir, types: tc.types, env: env}, output)
		if err != nil {
			t.Fatalf("%s: generate: %v", tc.name, err)
		}
		if err := writeFiles(files); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, "./"+tc.name)
	}
	writeFile(t, filepath.Join(dir, "basic", "loopback_test.go"), loopbackTest)
	tests := []string{"./basic"}
	if full {
		writeFile(t, filepath.Join(dir, "dubbo", "loopback_test.go"), dubboLoopbackTest)
		tests = append(tests, "./dubbo")
	}

	goRun := func(args ...string) {
		t.Helper()
		cmd := exec.Command(goCmd, args...)
		cmd.Dir = dir
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	goRun(append([]string{"vet"}, pkgs...)...)
	goRun(append([]string{"test", "-count=1"}, tests...)...)
}

func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("skipping: no go command: %v", err)
	}
	return p
}

// copyTree copies the regular files below src to dst, leaving out golden
// files.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, ".golden") {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		writeFile(t, filepath.Join(dst, rel), string(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// shimDabb and shimProxy declare the runtime API exactly as generated code
// uses it.
const shimDabb = `// Package dabb stands in for the runtime.
package dabb

import (
	"context"
	"errors"
	"time"
)

// SupportPackageIsVersion1 is the generated-code version guard.
const SupportPackageIsVersion1 = true

// MethodHandler decodes a request and calls the implementation.
type MethodHandler func(srv any, ctx context.Context, dec func(any) error) (any, error)

// MethodDesc describes one method.
type MethodDesc struct {
	Name       string
	Idempotent bool
	Timeout    time.Duration
	Request    any
	Response   any
	Handler    MethodHandler
}

// ServiceDesc describes one service.
type ServiceDesc struct {
	Name        string
	HandlerType any
	Methods     []MethodDesc
}

// Server serves services.
type Server struct{ services map[string]any }

// RegisterService records impl under desc.Name.
func (s *Server) RegisterService(desc *ServiceDesc, impl any) error {
	if s.services == nil {
		s.services = map[string]any{}
	}
	if _, dup := s.services[desc.Name]; dup {
		return errors.New("dabb: duplicate service")
	}
	s.services[desc.Name] = impl
	return nil
}
`

const shimProxy = `// Package proxy stands in for the client side of the runtime.
package proxy

import (
	"context"
	"time"
)

// Client is what Dubbo stubs are built from.
type Client struct{}

// Caller is what stubs hold.
type Caller interface {
	Invoke(ctx context.Context, service, method string, req, resp any, opts ...CallOption) error
}

// CallOption adjusts one call.
type CallOption interface{ apply() }

type option struct {
	idempotent bool
	timeout    time.Duration
}

func (option) apply() {}

// Idempotent marks a call as safe to retry.
func Idempotent() CallOption { return option{idempotent: true} }

// Timeout bounds a call.
func Timeout(d time.Duration) CallOption { return option{timeout: d} }
`

// shimDubbo declares the dubbo module's API exactly as generated Dubbo
// code uses it.
const shimDubbo = `// Package dubbo stands in for the dubbo module.
package dubbo

import (
	"context"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/proxy"
)

// SupportPackageIsVersion1 is the generated-code version guard.
const SupportPackageIsVersion1 = true

// ServiceOption declares a Java interface.
type ServiceOption func(*config)

type config struct{ n int }

// WithVersion sets the service key's version.
func WithVersion(v string) ServiceOption { return func(c *config) { c.n++ } }

// WithGroup sets the service key's group.
func WithGroup(g string) ServiceOption { return func(c *config) { c.n++ } }

// WithMethod names a method in Java and gives its types.
func WithMethod(goName, javaName string, javaTypes ...string) ServiceOption {
	return func(c *config) { c.n++ }
}

// WithIdempotent marks methods the client may retry.
func WithIdempotent(goNames ...string) ServiceOption { return func(c *config) { c.n++ } }

// Client calls a Java interface.
type Client struct{}

// NewClient returns a client of javaInterface declared by decl.
func NewClient(c *proxy.Client, javaInterface string, decl any, opts ...ServiceOption) (*Client, error) {
	return &Client{}, nil
}

// Call calls the Java method of the Go method goName.
func (cl *Client) Call(ctx context.Context, goName string, args []any, reply any, opts ...proxy.CallOption) error {
	return nil
}

// Service describes impl as javaInterface.
func Service(javaInterface string, impl any, opts ...ServiceOption) (*dabb.ServiceDesc, error) {
	return &dabb.ServiceDesc{Name: javaInterface}, nil
}
`

// loopbackTest is added to the generated basic package: a proxy.Caller that
// serves calls in process through the generated ServiceDesc, so that a call
// goes stub -> Invoke -> handler -> implementation and back.
const loopbackTest = `package inventory

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
	"github.com/dabbrpc/dabb/proxy"
)

type loopback struct {
	desc  *dabb.ServiceDesc
	impl  any
	nopts map[string]int
}

func (l *loopback) Invoke(ctx context.Context, service, method string, req, resp any, opts ...proxy.CallOption) error {
	if service != l.desc.Name {
		return errors.New("unknown service " + service)
	}
	for _, m := range l.desc.Methods {
		if m.Name != method {
			continue
		}
		l.nopts[method] = len(opts)
		out, err := m.Handler(l.impl, ctx, func(v any) error {
			reflect.ValueOf(v).Elem().Set(reflect.ValueOf(req).Elem())
			return nil
		})
		if err != nil {
			return err
		}
		reflect.ValueOf(resp).Elem().Set(reflect.ValueOf(out).Elem())
		return nil
	}
	return errors.New("unknown method " + method)
}

type store struct{}

func (store) Deduct(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error) {
	if req.Count < 0 {
		return nil, errors.New("negative count")
	}
	return &pb.DeductReply{Left: 10 - req.Count}, nil
}

func (store) Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error) {
	return &pb.StockReply{Count: int64(len(req.SKU))}, nil
}

func TestLoopback(t *testing.T) {
	lb := &loopback{desc: &InventoryServiceDesc, impl: store{}, nopts: map[string]int{}}
	c := NewInventoryClient(lb)
	ctx := context.Background()

	d, err := c.Deduct(ctx, &pb.DeductRequest{SKU: "a", Count: 3})
	if err != nil || d.Left != 7 {
		t.Errorf("Deduct = %+v, %v; want Left 7", d, err)
	}
	if d, err := c.Deduct(ctx, &pb.DeductRequest{Count: -1}); d != nil || err == nil || err.Error() != "negative count" {
		t.Errorf("Deduct(-1) = %+v, %v; want nil, negative count", d, err)
	}
	s, err := c.Stock(ctx, &pb.StockRequest{SKU: "abcd"})
	if err != nil || s.Count != 4 {
		t.Errorf("Stock = %+v, %v; want Count 4", s, err)
	}
	if lb.nopts["Deduct"] != 0 || lb.nopts["Stock"] != 2 {
		t.Errorf("options per call = %v, want Deduct 0, Stock 2", lb.nopts)
	}

	if InventoryServiceDesc.Name != "inventory.Inventory" {
		t.Errorf("ServiceDesc.Name = %q, want inventory.Inventory", InventoryServiceDesc.Name)
	}
	m := InventoryServiceDesc.Methods
	if len(m) != 2 || m[0].Name != "Deduct" || m[0].Idempotent || m[0].Timeout != 0 ||
		m[1].Name != "Stock" || !m[1].Idempotent || m[1].Timeout != 200*time.Millisecond {
		t.Errorf("methods = %+v", m)
	}
	if _, ok := InventoryServiceDesc.HandlerType.(*Inventory); !ok {
		t.Errorf("HandlerType is %T, want *Inventory", InventoryServiceDesc.HandlerType)
	}
}
`
