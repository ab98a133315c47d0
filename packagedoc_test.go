package onceflow_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A package doc speaks for its package: it says no "this file", and the files it names
// (a bare name: one in its directory; a path: from the repository's root) exist.
func TestPackageDocsNameTheirFiles(t *testing.T) {
	fileName := regexp.MustCompile(`[A-Za-z0-9_./-]*[a-z0-9_]+\.go\b`)
	docs := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "tools", "examples", "bin", ".run", ".git", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		if f.Doc == nil {
			return nil
		}
		docs++
		text := f.Doc.Text()
		if strings.Contains(strings.ToLower(text), "this file") {
			t.Errorf("%s: the package doc says \"this file\"", path)
		}
		for _, name := range fileName.FindAllString(text, -1) {
			where := filepath.Join(filepath.Dir(path), name)
			if strings.Contains(name, "/") {
				where = name
			}
			if _, err := os.Stat(where); err != nil {
				t.Errorf("%s: the package doc names %s, which does not exist", path, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if docs == 0 {
		t.Fatal("no package doc found")
	}
}
