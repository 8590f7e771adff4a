package dabb_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// allowed lists, for each library package, the dabb packages it may import,
// directly or not: the table in docs/design.md. A package that is not listed
// may import anything (examples, commands, tests). Subpackages of codec and
// registry may also import their parent. DO NOT CHANGE THIS TABLE TO FIX A
// BUILD: fix the import.
var allowed = map[string][]string{
	"protocol":  {},
	"codec":     {},
	"registry":  {},
	"balancer":  {"registry"},
	"transport": {"protocol"},
	"proxy":     {"protocol", "codec", "codec/proto", "registry", "balancer", "transport"},
	"":          {"protocol", "codec", "registry", "transport"},
}

const module = "github.com/dabbrpc/dabb"

// leaves are internal packages any library package may import: they
// import no dabb package themselves (checked below), so they cannot turn
// an import against the table's direction.
var leaves = []string{"internal/bufpool"}

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
			if !strings.HasPrefix(d, module) {
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

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
