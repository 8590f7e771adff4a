package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/registry"
)

// TestErrors runs rpcgen on each interface of testdata/errors and checks the
// one error it must report: its file:line and its text.
func TestErrors(t *testing.T) {
	dir := filepath.Join("testdata", "errors")
	src, err := os.ReadFile(filepath.Join(dir, "bad.go"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	l, info, err := loadPackage(config{dir: dir})
	if err != nil {
		t.Fatalf("loading %s: %v", dir, err)
	}

	tests := []struct {
		typ  string
		at   string // text of the reported line, searched from the start of typ's block; "" = the type line
		want string // the message after "file:line: rpcgen: "
	}{
		// Signatures.
		{"TooFewParams", "M(", "method M: must take exactly two parameters (ctx context.Context, req *T), has 1"},
		{"TooManyParams", "M(", "method M: must take exactly two parameters (ctx context.Context, req *T), has 3"},
		{"CtxNotFirst", "M(", "method M: first parameter must be context.Context, got string"},
		{"Variadic", "M(", "method M: must not be variadic; want (ctx context.Context, req *T)"},
		{"ReqNotPointer", "M(", "method M: request must be a pointer to a named struct type, got Req"},
		{"ReqBasic", "M(", "method M: request must be a pointer to a named struct type, got *string"},
		{"ReqUnnamed", "M(", "method M: request must be a pointer to a named struct type, got *struct{A int}"},
		{"ReqNotStruct", "M(", "method M: request must be a pointer to a named struct type, got *Str"},
		{"ReqInterface", "M(", "method M: request must be a pointer to a named struct type, got *Iface"},
		{"ReqGeneric", "M(", "method M: request must be a pointer to a named struct type (generic types are not supported), got *Gen[int]"},
		{"OneResult", "M(", "method M: must return (*T, error), returns (error)"},
		{"NoError", "M(", "method M: must return (*T, error), returns (*Resp, bool)"},
		{"RespNotPointer", "M(", "method M: response must be a pointer to a named struct type, got Resp"},
		{"RespSlice", "M(", "method M: response must be a pointer to a named struct type, got []*Resp"},
		{"Unexported", "m(", "method m: must be exported"},
		{"EmbedsReader", "io.Reader", "method Read (embedded from io.Reader): must take exactly two parameters (ctx context.Context, req *T), has 1"},
		{"EmbedsInternal", "shared.Noter", "method Note (embedded from shared.Noter): request must be a pointer to a named struct type that github.com/dabbrpc/dabb/cmd/rpcgen/testdata/errors may import (a type of an internal package can be named through an exported alias declared outside it), got *github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/internal/hidden.Note"},
		{"EmbedsError", "error", "type EmbedsError: embedded error: its methods do not have the form M(ctx context.Context, req *T) (*U, error)"},
		{"EmbedsUnion", "~int", "type EmbedsUnion: ~int | ~string makes it a type constraint; only methods and interfaces may be embedded"},
		{"EmbedsComparable", "comparable", "type EmbedsComparable: embedded comparable makes it a type constraint"},
		{"EmbedsStruct", "Req", "type EmbedsStruct: embedded element Req is not an interface type"},
		{"Conflicting", "M(", "method M: declared twice with different //dabb: directives"},
		// Directives.
		{"UnknownDirective", "//dabb:idempotnet", "method M: unknown directive //dabb:idempotnet (want //dabb:idempotent, //dabb:timeout or //dabb:java)"},
		{"BadDuration", "//dabb:timeout fast", "method M: //dabb:timeout fast: not a duration such as 200ms or 2s"},
		{"NegativeDuration", "//dabb:timeout -2s", "method M: //dabb:timeout -2s: must be positive"},
		{"MissingDuration", "//dabb:timeout", `method M: //dabb:timeout wants one duration such as 200ms, got ""`},
		{"TwoDurations", "//dabb:timeout 1s 2s", `method M: //dabb:timeout wants one duration such as 200ms, got "1s 2s"`},
		{"IdempotentArg", "//dabb:idempotent yes", `method M: //dabb:idempotent takes no arguments, got "yes"`},
		{"ServiceOnMethod", "//dabb:service", "method M: //dabb:service belongs in the interface's doc comment"},
		{"IdempotentOnInterface", "//dabb:idempotent", "type IdempotentOnInterface: //dabb:idempotent belongs in a method's doc comment"},
		{"ServiceNoName", "//dabb:service", `type ServiceNoName: //dabb:service wants one service name, got ""`},
		{"UnknownOnInterface", "//dabb:servise", "type UnknownOnInterface: unknown directive //dabb:servise (want //dabb:service or //dabb:dubbo)"},
		{"Detached", "//dabb:idempotent", "type Detached: //dabb:idempotent is not in a method's doc comment (it must be on the lines directly above the method)"},
		{"Trailing", "//dabb:idempotent", "type Trailing: //dabb:idempotent is not in a method's doc comment (it must be on the lines directly above the method)"},
		{"DetachedInLiteral", "//dabb:idempotent", "type DetachedInLiteral: //dabb:idempotent is not in a method's doc comment (it must be on the lines directly above the method)"},
		{"GroupDoc", "//dabb:service", "//dabb:service x.Y is above a group of types, where it applies to none of them; move it to the doc comment of the interface, inside the parentheses"},
		{"SpacedDirective", "// dabb:idempotent", "type SpacedDirective: // dabb:idempotent is not a directive, for the space after //; write //dabb:idempotent"},
		{"SpacedOnInterface", "dabb:service", "type SpacedOnInterface: //\tdabb:service x.Y is not a directive, for the space after //; write //dabb:service x.Y"},
		{"ServiceSlash", "//dabb:service", `type ServiceSlash: //dabb:service: registry: invalid service name "shop/Orders": contains '/'`},
		{"ServiceDots", "//dabb:service", `type ServiceDots: //dabb:service: registry: invalid service name "..": reserved`},
		// Types.
		{"NotIface", "", "type NotIface: is a struct type, not an interface type"},
		{"NotAType", "var NotAType", "type NotAType: is a variable, not an interface type"},
		{"Empty", "", "type Empty: interface has no methods"},
		{"OnlyEmbedsEmpty", "", "type OnlyEmbedsEmpty: interface has no methods"},
		{"Constraint", "", "type Constraint: ~int makes it a type constraint; only methods and interfaces may be embedded"},
		{"Generic", "", "type Generic: generic interfaces are not supported"},
		{"Alias", "", "type Alias: is an alias; run rpcgen where the interface is declared"},
		{"unexportedIface", "", "type unexportedIface: interface must be exported"},
		{"Collide", "func NewCollideClient", "type Collide: the generated NewCollideClient would clash with this declaration; rename one of them"},
	}
	for _, tc := range tests {
		t.Run(tc.typ, func(t *testing.T) {
			svcs, err := l.services(info, []string{tc.typ})
			if err == nil {
				err = checkNames(info, svcs)
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			wantLine := findLine(t, lines, tc.typ, tc.at)
			msgs := strings.Split(err.Error(), "\n")
			if len(msgs) != 1 {
				t.Fatalf("got %d errors, want 1:\n%v", len(msgs), err)
			}
			file, line, msg := splitPos(t, msgs[0])
			if filepath.Base(file) != "bad.go" || line != wantLine {
				t.Errorf("error at %s:%d, want bad.go:%d\n%s", file, line, wantLine, msgs[0])
			}
			if msg != "rpcgen: "+tc.want {
				t.Errorf("message:\n got: %s\nwant: rpcgen: %s", msg, tc.want)
			}
		})
	}
}

// TestErrorsNotFound covers the errors that have no position.
func TestErrorsNotFound(t *testing.T) {
	tests := []struct {
		name string
		cfg  config
		want string
	}{
		{"missing type", config{dir: filepath.Join("testdata", "errors"), types: []string{"Missing"}}, "rpcgen: type Missing: not found in package bad"},
		{"no package", config{dir: "testdata", types: []string{"X"}}, "rpcgen: no Go files in"},
		{"no directory", config{dir: filepath.Join("testdata", "nonexistent"), types: []string{"X"}}, "rpcgen: open "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := generate(tc.cfg, "")
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %v, want prefix %q", err, tc.want)
			}
		})
	}
}

// TestErrorsAll checks that every problem of a run is reported, not only
// the first, and in the order of the -type list.
func TestErrorsAll(t *testing.T) {
	_, err := generate(config{dir: filepath.Join("testdata", "errors"), types: []string{"CtxNotFirst", "Missing", "BadDuration"}}, "")
	if err == nil {
		t.Fatal("no error")
	}
	msgs := strings.Split(err.Error(), "\n")
	want := []string{"method M: first parameter", "type Missing: not found", "method M: //dabb:timeout fast"}
	if len(msgs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(msgs), len(want), err)
	}
	for i, w := range want {
		if !strings.Contains(msgs[i], "rpcgen: "+w) {
			t.Errorf("error %d = %q, want it to contain %q", i, msgs[i], w)
		}
	}
}

// TestErrorsOnce checks that a problem seen once per type of the run is
// reported once: a directive above a group of several types.
func TestErrorsOnce(t *testing.T) {
	_, err := generate(config{dir: filepath.Join("testdata", "errors"), types: []string{"GroupDoc", "GroupOther"}}, "")
	if err == nil {
		t.Fatal("no error")
	}
	if msgs := strings.Split(err.Error(), "\n"); len(msgs) != 1 || !strings.Contains(msgs[0], "is above a group of types") {
		t.Errorf("got %d errors, want 1 about the group:\n%v", len(msgs), err)
	}
}

// TestErrorsCapped checks that a run with many problems reports the first
// maxErrors and counts the rest.
func TestErrorsCapped(t *testing.T) {
	dir := filepath.Join("testdata", "errors")
	src, err := os.ReadFile(filepath.Join(dir, "bad.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^type ([A-Z]\w*) interface`).FindAllStringSubmatch(string(src), -1) {
		if m[1] != "ReqUnexportedOK" && m[1] != "Collide" && m[1] != "Base" && m[1] != "Iface" {
			names = append(names, m[1])
		}
	}
	if len(names) <= maxErrors {
		t.Fatalf("only %d failing interfaces in bad.go; the test needs more than %d", len(names), maxErrors)
	}
	_, err = generate(config{dir: dir, types: names}, "")
	if err == nil {
		t.Fatal("no error")
	}
	msgs := strings.Split(err.Error(), "\n")
	if len(msgs) != maxErrors+1 {
		t.Fatalf("got %d lines, want %d:\n%v", len(msgs), maxErrors+1, err)
	}
	if want := "rpcgen: and " + strconv.Itoa(len(names)-maxErrors) + " more problems"; msgs[maxErrors] != want {
		t.Errorf("last line %q, want %q", msgs[maxErrors], want)
	}
}

var posRE = regexp.MustCompile(`^(.+?):(\d+): (rpcgen: .*)$`)

// splitPos splits "file:line: message".
func splitPos(t *testing.T, s string) (file string, line int, msg string) {
	t.Helper()
	m := posRE.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("error %q does not start with file:line: rpcgen:", s)
	}
	n, _ := strconv.Atoi(m[2])
	return m[1], n, m[3]
}

// findLine returns the 1-based number of the first line containing at,
// searching from the start of the block (lines between blank lines) that
// declares typ; with at == "", the declaration's own line.
func findLine(t *testing.T, lines []string, typ, at string) int {
	t.Helper()
	decl := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "type "+typ+" ") || strings.HasPrefix(l, "type "+typ+"[") || strings.HasPrefix(l, "var "+typ+" ") ||
			strings.HasPrefix(l, "\t"+typ+" interface") { // in a type group

			decl = i
			break
		}
	}
	if decl < 0 {
		t.Fatalf("no declaration of %s in bad.go", typ)
	}
	if at == "" {
		return decl + 1
	}
	start := decl
	for start > 0 && strings.TrimSpace(lines[start-1]) != "" {
		start--
	}
	for i := start; i < len(lines); i++ {
		if strings.Contains(lines[i], at) {
			return i + 1
		}
	}
	t.Fatalf("no line containing %q after the declaration of %s", at, typ)
	return 0
}

// TestServiceNameRule holds rpcgen's copy of the service-name rule to
// registry's: the same names refused, with the same message.
func TestServiceNameRule(t *testing.T) {
	names := []string{
		"", ".", "..", "...", ".a", "a.", "inventory.Inventory", "shop/Orders", "/", "a/",
		"a\x00b", "a\tb", "a\nb", "\x1f", "a\x7f", "\u0080", "a b", "ünïcode.Svc", "a\\b", "-", "_",
	}
	for _, name := range names {
		want, got := registry.ValidateService(name), checkServiceName(name)
		switch {
		case (want == nil) != (got == nil):
			t.Errorf("%q: registry says %v, rpcgen says %v", name, want, got)
		case want != nil && want.Error() != got.Error():
			t.Errorf("%q: registry says %q, rpcgen says %q", name, want, got)
		}
	}
}
