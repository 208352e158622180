package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra/doc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/cli from the command tree (make docs)")

// cliDocs is where the command reference lives, generated from the
// command tree: flags are documented once, in --help.
var cliDocs = filepath.Join("..", "..", "docs", "cli")

// docs/cli is the command tree's --help as Markdown, one page per
// command. A change to a command, a flag or a help text that leaves it
// stale fails here; `make docs` rewrites it.
func TestCLIDocsAreCurrent(t *testing.T) {
	root := newRoot()
	root.DisableAutoGenTag = true // no date: the pages change only when the help does
	got := t.TempDir()
	require.NoError(t, doc.GenMarkdownTree(root, got))
	if *updateDocs {
		require.NoError(t, os.RemoveAll(cliDocs))
		require.NoError(t, os.CopyFS(cliDocs, os.DirFS(got)))
		return
	}
	pages := func(dir string) map[string]string {
		ents, err := os.ReadDir(dir)
		require.NoError(t, err, "docs/cli is missing: run make docs")
		m := make(map[string]string, len(ents))
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			m[e.Name()] = string(b)
		}
		return m
	}
	want, have := pages(got), pages(cliDocs)
	for name, text := range want {
		if assert.Contains(t, have, name, "docs/cli lacks %s: run make docs", name) {
			assert.Equal(t, text, have[name], "docs/cli/%s is stale: run make docs", name)
		}
	}
	for name := range have {
		assert.Contains(t, want, name, "docs/cli/%s documents no command: run make docs", name)
	}
}
