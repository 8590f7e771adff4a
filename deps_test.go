package dabb_test

import (
	"encoding/json"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// allowed lists, for each library package, the dabb packages it may import,
// directly or not: the table in docs/design.md. A package that is not listed
// may import anything (examples, tests); commands follow commands below.
// Subpackages of codec and registry may also import their parent. DO NOT
// CHANGE THIS TABLE TO FIX A BUILD: fix the import.
var allowed = map[string][]string{
	"protocol":     {},
	"codec":        {},
	"registry":     {},
	"balancer":     {"registry"},
	"transport":    {"protocol"},
	"reflection":   {},
	"proxy":        {"protocol", "codec", "codec/proto", "codec/json", "registry", "balancer", "transport", "reflection"},
	"health":       {},
	"health/probe": {},
	"":             {"protocol", "codec", "codec/json", "registry", "transport", "health", "reflection"},
	// The optional integrations: the server's metrics link the server,
	// never the client; the client's link the client, never the server.
	"prometheus":       {"", "protocol", "codec", "codec/json", "registry", "transport", "health", "reflection"},
	"proxy/prometheus": {"proxy", "protocol", "codec", "codec/proto", "codec/json", "registry", "balancer", "transport", "reflection"},
}

// unlinked lists, for a library package, the standard packages it must
// not link, directly or not. The HTTP probes live in health/probe, so a
// program that mounts none links no HTTP server; health holds only the
// wire names the root package imports.
var unlinked = map[string][]string{
	"":       {"net/http"},
	"health": {"net/http"},
}

// integrations are the packages of allowed that may link the modules of
// optional integrations (foreign): a program that does not import them
// does not link those modules. OpenTelemetry's package, oteldabb, is a
// module of its own, outside ./... here.
var integrations = []string{"prometheus", "proxy/prometheus"}

// foreign are the path prefixes of the optional integrations' modules:
// Prometheus, OpenTelemetry, and Dubbo's (hessian2 and dubbo-go, linked
// only by the dubbo module, outside ./... here).
var foreign = []string{"github.com/prometheus/", "go.opentelemetry.io/",
	"github.com/apache/dubbo-go-hessian2", "github.com/dubbogo/", "dubbo.apache.org/"}

const module = "github.com/dabbrpc/dabb"

// leaves are internal packages any library package may import: they
// import no dabb package themselves (checked below), so they cannot turn
// an import against the table's direction.
var leaves = []string{"internal/bufpool", "internal/promutil"}

func TestImportDirection(t *testing.T) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Deps", "./...")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	for dec.More() {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if contains(leaves, rel) {
			for _, d := range p.Deps {
				if strings.HasPrefix(d, module) {
					t.Errorf("%s imports %s; a leaf imports no dabb package", p.ImportPath, d)
				}
			}
			continue
		}
		rule, parent, ok := ruleFor(rel)
		if !ok {
			continue
		}
		checked++
		for _, d := range p.Deps {
			if contains(unlinked[rel], d) {
				t.Errorf("%s links %s, which it must not (see unlinked)", p.ImportPath, d)
			}
			if !strings.HasPrefix(d, module) {
				if f := foreignPrefix(d); f != "" && !contains(integrations, rel) {
					t.Errorf("%s links %s: only the integration packages %v may link %s*", p.ImportPath, d, integrations, f)
				}
				continue
			}
			dep := strings.TrimPrefix(strings.TrimPrefix(d, module), "/")
			if dep == parent || contains(leaves, dep) {
				continue
			}
			if !contains(rule, dep) {
				t.Errorf("%s imports %s, which the import table does not allow", p.ImportPath, d)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("checked only %d packages: is go list working?", checked)
	}
}

// ruleFor returns the allowed imports of a package and its parent (for a
// backend subpackage of codec or registry).
func ruleFor(rel string) (rule []string, parent string, ok bool) {
	if r, ok := allowed[rel]; ok {
		return r, "", true
	}
	for _, p := range []string{"codec", "registry"} {
		if strings.HasPrefix(rel, p+"/") {
			return allowed[p], p, true
		}
	}
	return nil, "", false
}

// foreignPrefix returns the prefix of foreign that path has, or "".
func foreignPrefix(path string) string {
	for _, f := range foreign {
		if strings.HasPrefix(path, f) {
			return f
		}
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// commands lists, for each command under cmd/, the dabb packages it may
// import, directly or not. Beside those, a command depends only on the
// standard library and golang.org/x/tools, with what that module's
// go/packages needs: a generator builds without the runtime's dependencies.
var commands = map[string][]string{
	"cmd/rpcgen": {},
}

// clientCommands lists, for each command under cmd/ that is a client of dabb
// services, the dabb packages it may import, directly or not. Such a
// command links the client side (proxy, the registries), and imports the
// root package, the server, never itself: only through dubbo, whose
// Service serves Java consumers in the same package as the calls and the
// zookeeper:// registry. It is a module of its own (cmd/dabbctl/go.mod), so
// that it can import dabb's other modules without their requirements
// entering the library's go.mod; its own packages, below its path, are
// allowed too.
var clientCommands = map[string][]string{
	"cmd/dabbctl": {
		"balancer", "codec", "codec/json", "codec/proto", "dubbo", "health", "internal/bufpool", "protocol",
		"proxy", "reflection", "registry", "registry/etcd", "registry/static", "registry/zk", "transport",
	},
}

// toolsPackages is the package whose dependencies a command may share.
const toolsPackages = "golang.org/x/tools/go/packages"

// listedPackage is what TestImportCommands reads of a package from go list.
type listedPackage struct {
	ImportPath string
	Standard   bool
	Module     *struct{ Path string }
	Imports    []string
	Deps       []string
}

// listDeps runs go list -deps in dir on patterns, and returns every package
// listed by import path.
func listDeps(t *testing.T, dir string, patterns ...string) map[string]*listedPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-deps", "-json=ImportPath,Standard,Module,Imports,Deps"}, patterns...)...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", dir, err, stderr.String())
	}
	byPath := map[string]*listedPackage{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		p := new(listedPackage)
		if err := dec.Decode(p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		byPath[p.ImportPath] = p
	}
	return byPath
}

func TestImportCommands(t *testing.T) {
	// ./cmd/... stops at a go.mod: a command that is a module of its own
	// (cmd/dabbctl) is listed in its own directory.
	byPath := listDeps(t, ".", "./cmd/...", toolsPackages)
	modules, err := filepath.Glob(filepath.Join("cmd", "*", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range modules {
		maps.Copy(byPath, listDeps(t, filepath.Dir(m), "./..."))
	}
	if !slices.Contains(modules, filepath.Join("cmd", "dabbctl", "go.mod")) {
		t.Errorf("cmd/dabbctl/go.mod is missing: dabbctl is a module of its own (docs/design.md, Modules)")
	}
	var roots []*listedPackage
	for path, p := range byPath {
		if strings.HasPrefix(path, module+"/cmd/") {
			roots = append(roots, p)
		}
	}
	tools, ok := byPath[toolsPackages]
	if !ok {
		t.Fatalf("go list did not list %s", toolsPackages)
	}
	shared := map[string]bool{}
	for _, d := range tools.Deps {
		shared[d] = true
	}
	if len(roots) == 0 {
		t.Fatal("go list found no package under cmd/: is go list working?")
	}
	checkedClients := 0
	for _, p := range roots {
		rel := strings.TrimPrefix(p.ImportPath, module+"/")
		if rule, name, ok := clientRuleFor(rel); ok {
			if rel == name {
				checkedClients++
			}
			for _, d := range p.Deps {
				if d == module && (!contains(rule, "dubbo") || contains(p.Imports, module)) {
					t.Errorf("%s imports %s, the server; a client command does not", p.ImportPath, d)
				} else if dep, ok := strings.CutPrefix(d, module+"/"); ok && !contains(rule, dep) && !strings.HasPrefix(dep, name+"/") {
					t.Errorf("%s imports %s, which clientCommands does not list for it", p.ImportPath, d)
				}
			}
			continue
		}
		rule, ok := commands[rel]
		if !ok {
			t.Errorf("%s has no entry in commands: add one, with the dabb packages it may import", p.ImportPath)
			continue
		}
		for _, d := range p.Deps {
			dp := byPath[d]
			switch {
			case strings.HasPrefix(d, module+"/"):
				if dep := strings.TrimPrefix(d, module+"/"); !contains(rule, dep) {
					t.Errorf("%s imports %s; a command imports no dabb package but those listed in commands", p.ImportPath, d)
				}
			case dp != nil && dp.Standard, shared[d], d == toolsPackages:
			case dp != nil && dp.Module != nil && dp.Module.Path == "golang.org/x/tools":
			default:
				t.Errorf("%s depends on %s, outside the standard library and golang.org/x/tools (with what %s needs); a command stays a standalone tool", p.ImportPath, d, toolsPackages)
			}
		}
	}
	if checkedClients != len(clientCommands) {
		t.Errorf("checked %d of the %d client commands: is go list working in their modules?", checkedClients, len(clientCommands))
	}
}

// clientRuleFor returns the allowed imports of a client command's package
// (the command or a package below it) and the command's name.
func clientRuleFor(rel string) (rule []string, name string, ok bool) {
	for name, rule := range clientCommands {
		if rel == name || strings.HasPrefix(rel, name+"/") {
			return rule, name, true
		}
	}
	return nil, "", false
}
