package dabb_test

import (
	"bufio"
	"bytes"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// maxLines bounds the length of every non-test .go file but generated
// ones (docs/design.md, "File layout").
const maxLines = 600

// TestFileTable keeps docs/design.md's file table true: every non-test .go
// file of every module in go.work has a row, the row says the file's
// summary, no row names a missing file, and no file is over maxLines.
func TestFileTable(t *testing.T) {
	rows := fileTable(t, "docs/design.md")
	files := map[string]bool{}
	for _, mod := range workModules(t, "go.work") {
		for _, path := range goFiles(t, mod) {
			files[path] = true
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			sum, generated := summary(t, path, src)
			row, ok := rows[path]
			switch {
			case !ok:
				t.Errorf("docs/design.md has no row for %s; add:\n| `%s` | %s |", path, path, sum)
			case row != sum:
				t.Errorf("docs/design.md's row for %s says\n\t%q\nbut the file's first comment says\n\t%q", path, row, sum)
			}
			if n := bytes.Count(src, []byte("\n")); n > maxLines && !generated {
				t.Errorf("%s has %d lines, over %d", path, n, maxLines)
			}
		}
	}
	for path := range rows {
		if !files[path] {
			t.Errorf("docs/design.md has a row for %s, which is not a non-test .go file of a module in go.work", path)
		}
	}
}

// workModules returns the directories of go.work's use directives,
// relative to the repository's root and cleaned ("." for the root).
func workModules(t *testing.T, name string) []string {
	t.Helper()
	src, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	block := false
	for line := range strings.Lines(string(src)) {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case block && line == ")":
			block = false
		case block && line != "":
			dirs = append(dirs, filepath.Clean(line))
		case line == "use (":
			block = true
		case strings.HasPrefix(line, "use "):
			dirs = append(dirs, filepath.Clean(strings.TrimSpace(strings.TrimPrefix(line, "use "))))
		}
	}
	if !slices.Contains(dirs, ".") {
		t.Fatalf("%s: no use of the root module among %q", name, dirs)
	}
	return dirs
}

// goFiles returns the non-test .go files of the module in dir, with
// slash-separated paths relative to the repository's root. Like the go
// command, it skips testdata, directories starting with . or _, and
// nested modules.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path == dir {
				return nil
			}
			if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return fs.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			files = append(files, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// summary returns the first sentence of the file's first comment (a
// doc.go's: of its package doc), and whether the file says it is
// generated. Build constraints and other directives are not comments here.
func summary(t *testing.T, path string, src []byte) (string, bool) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	generated := isGenerated(src)
	var text string
	if filepath.Base(path) == "doc.go" && f.Doc != nil {
		text = f.Doc.Text()
	} else {
		for _, g := range f.Comments {
			if text = g.Text(); text != "" {
				break
			}
		}
	}
	if text == "" {
		t.Errorf("%s has no comment to say its job", path)
	}
	return firstSentence(text), generated
}

// isGenerated reports whether src has the line Go's convention marks
// generated files with.
func isGenerated(src []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "// Code generated ") && strings.HasSuffix(line, " DO NOT EDIT.") {
			return true
		}
		if strings.HasPrefix(line, "package ") {
			return false
		}
	}
	return false
}

// firstSentence returns the first sentence of text's first paragraph,
// its lines joined by spaces. The sentence ends at the first period
// followed by a space; the paragraph at a blank line or a code block.
func firstSentence(text string) string {
	var para []string
	for line := range strings.Lines(text) {
		if strings.TrimSpace(line) == "" || line[0] == ' ' || line[0] == '\t' {
			break
		}
		para = append(para, line)
	}
	text = strings.Join(strings.Fields(strings.Join(para, " ")), " ")
	if i := strings.Index(text+" ", ". "); i >= 0 {
		return text[:i+1]
	}
	return text
}

// tableRow is a row of the file table: a file in backquotes, then its job.
var tableRow = regexp.MustCompile("^\\| `([^`]+\\.go)` \\| (.*) \\|$")

// fileTable returns the rows of the file table in the "File layout"
// section of the markdown file name: each file's job by its path.
func fileTable(t *testing.T, name string) map[string]string {
	t.Helper()
	src, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	in := false
	for line := range strings.Lines(string(src)) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "## ") {
			in = line == "## File layout"
			continue
		}
		m := tableRow.FindStringSubmatch(line)
		if !in || m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("%s: two rows for %s", name, m[1])
		}
		rows[m[1]] = strings.ReplaceAll(m[2], `\|`, "|")
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no file table under \"## File layout\"", name)
	}
	return rows
}
