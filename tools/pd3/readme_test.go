package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shBlocks returns the ```sh blocks of a Markdown file, in order.
func shBlocks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var blocks []string
	var cur []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// Every command block of the README runs, as a user would paste it into
// a shell in the directory make run started pd3 in: against a pd3 up in
// a temporary directory, with the addresses it printed in place of the
// README's (the ports there are the defaults; the etcd URL is an
// example). The first block (make run, make test) is what runs this.
func TestREADMECommandsRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the README's examples mount a filesystem, trace the page cache and attach a loop device: root only")
	}
	for _, tool := range []string{"sqlite3", "fio", "nbdinfo", "nbdcopy", "nbdfuse", "xxd", "losetup", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (make deps-system; .ci/run does)", tool)
		}
	}
	blocks := shBlocks(t, "../../README.md")
	require.GreaterOrEqual(t, len(blocks), 3)
	require.Contains(t, blocks[0], "make run")

	dir := t.TempDir()
	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.Symlink(pd3Bin, filepath.Join(dir, "bin", "pd3")))
	for _, d := range []string{"docs", "tools"} {
		require.NoError(t, os.Symlink(filepath.Join(repo, d), filepath.Join(dir, d)))
	}
	mnt := filepath.Join(dir, "pd3-mnt")
	// After pd3 stops (cleanups run last first), in case it could not.
	t.Cleanup(func() {
		if mounted(mnt) {
			exec.Command("fusermount3", "-u", mnt).Run()
		}
	})
	up := start(t, []string{"etcd", "NBD server", "page server", "metrics"}, "up", "--mount", mnt,
		"--nbd", "127.0.0.1:0", "--page", "127.0.0.1:0", "--metrics", "127.0.0.1:0")

	metrics, err := url.Parse(up.Addrs["metrics"])
	require.NoError(t, err)
	etcdURL := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+`)
	for i, block := range blocks[1:] {
		script := strings.NewReplacer(
			"127.0.0.1:10809", up.Addrs["NBD server"],
			"127.0.0.1:7000", up.Addrs["page server"],
			"127.0.0.1:9100", metrics.Host,
		).Replace(block)
		script = etcdURL.ReplaceAllString(script, up.Addrs["etcd"])
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		cancel()
		require.NoError(t, err, "README block %d:\n%s\noutput:\n%s", i+2, script, out)
		t.Logf("README block %d: %d lines of output", i+2, strings.Count(string(out), "\n"))
		if strings.Contains(block, "page get") {
			assert.Contains(t, string(out), "hello", "the page written is read back")
		}
	}
}
