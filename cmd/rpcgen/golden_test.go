package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// goldenCase is one input package and the interfaces to generate for.
type goldenCase struct {
	name   string // directory under testdata, and subtest name
	types  []string
	output string // -output; "" for the default file names
}

var goldenCases = []goldenCase{
	{name: "basic", types: []string{"Inventory"}},
	{name: "service", types: []string{"Catalog"}},
	{name: "crosspkg", types: []string{"Shop"}},
	{name: "samepkg", types: []string{"Ledger"}},
	{name: "embedded", types: []string{"Admin"}},
	{name: "multi", types: []string{"Cars", "Trucks"}, output: "fleet_dabb.go"},
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
