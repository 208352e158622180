package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pd3-go/pd3/internal/memcg"
)

// The tree workloads read a source-tree-like directory of small files:
// tree-tar archives it (tar to a pipe, as a backup does) and tree-grep
// searches every file (grep -r). Both walk the metadata and read each
// file whole, small reads the kernel's read-ahead cannot batch across
// files.
const (
	treeDir      = "tree"
	treeMarker   = "pd3-tree-marker"
	treePerDir   = 200
	treeMinBytes = 1 << 10
	treeMaxBytes = 16 << 10
	// treeMarked: every treeMarked-th file holds the marker, at its end,
	// so that grep reads each file whole and finds a known count.
	treeMarked = 10
)

// writeTree writes files small files of text under dir/tree in
// directories of treePerDir, the same bytes on every system.
func writeTree(dir string, files int) error {
	rnd := rand.New(rand.NewPCG(1, 2))
	text := make([]byte, 256<<10)
	for i := range text {
		if i%64 == 63 {
			text[i] = '\n'
		} else {
			text[i] = byte('a' + rnd.IntN(26))
		}
	}
	for i := range files {
		d := filepath.Join(dir, treeDir, fmt.Sprintf("d%03d", i/treePerDir))
		if i%treePerDir == 0 {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		n := treeMinBytes + rnd.IntN(treeMaxBytes-treeMinBytes)
		at := rnd.IntN(len(text) - n)
		body := slices.Clone(text[at : at+n])
		if i%treeMarked == 0 {
			body = append(body, treeMarker+"\n"...)
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d.txt", i)), body, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// treeWorkload runs tree-tar or tree-grep in g (nil: no budget) three
// times and reports the median pass; a pass that does not read what
// writeTree wrote fails the run.
func treeWorkload(g *memcg.Group, dir, w string, files int) (Result, error) {
	var ms []float64
	for range 3 {
		var args []string
		switch w {
		case "tree-tar":
			args = []string{"tar", "-cf", "-", "-C", dir, treeDir}
		case "tree-grep":
			args = []string{"grep", "-rl", treeMarker, filepath.Join(dir, treeDir)}
		default:
			return Result{}, fmt.Errorf("unknown workload %q", w)
		}
		cmd := g.Command(args[0], args[1:]...)
		var errBuf bytes.Buffer
		cmd.Stderr = &errBuf
		out, err := cmd.StdoutPipe()
		if err != nil {
			return Result{}, err
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			return Result{}, fmt.Errorf("%s: %w", args[0], err)
		}
		var n int64
		var lines int
		if w == "tree-tar" {
			n, err = io.Copy(io.Discard, out)
		} else {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines++
			}
			err = sc.Err()
		}
		werr := cmd.Wait()
		took := time.Since(start)
		if err = cmp.Or(werr, err); err != nil {
			return Result{}, fmt.Errorf("%s: %w: %s", args[0], err, tail(errBuf.Bytes()))
		}
		want := (files + treeMarked - 1) / treeMarked
		switch {
		case w == "tree-tar" && n < int64(files)*treeMinBytes:
			return Result{}, fmt.Errorf("tar wrote %d bytes for %d files of at least %d", n, files, treeMinBytes)
		case w == "tree-grep" && lines != want:
			return Result{}, fmt.Errorf("grep found the marker in %d files, want %d: the tree does not read back as written", lines, want)
		}
		ms = append(ms, float64(took.Microseconds())/1e3)
	}
	slices.Sort(ms)
	return Result{Millis: ms[1], OpsPerSec: float64(files) / (ms[1] / 1e3), Ops: uint64(3 * files)}, nil
}

// isTree reports whether w is a tree workload.
func isTree(w string) bool { return strings.HasPrefix(w, "tree-") }

// treeNote describes the tree workloads for the report.
func treeNote(files int) string {
	return fmt.Sprintf("tree: %d files of 1-16 KiB of text in directories of %d, written with no budget; tree-tar: tar -cf - of the tree into a pipe; "+
		"tree-grep: grep -rl over it (every %dth file holds the marker at its end, and the count is checked); three passes each, the median; files/s, ms in its column",
		files, treePerDir, treeMarked)
}
