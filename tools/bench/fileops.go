package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pd3-go/pd3/internal/hist"
)

// fileOps are the metadata operations a files-OP job times, one file at
// a time, as a shell or a build does them.
var fileOps = []string{"create", "write4k", "stat", "rename", "unlink"}

// fileOpsCount is how many files a files-OP job works on.
const fileOpsCount = 2000

// fileOp is the files-OP job's operation, if job is one.
func fileOp(job string) (string, bool, error) {
	op, ok := strings.CutPrefix(job, "files-")
	if !ok {
		return "", false, nil
	}
	if !slices.Contains(fileOps, op) {
		return "", true, fmt.Errorf("bad FUSE job %q (want files-OP, OP one of %v)", job, fileOps)
	}
	return op, true, nil
}

// runFileOps times op on fileOpsCount files in dir (created, removed
// afterwards): create makes empty files; write4k opens an existing file,
// writes 4 KiB and closes it; stat, rename and unlink act on files made
// beforehand, untimed (stat once the kernel's cached attributes of them
// have expired).
func runFileOps(dir, op string) (Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	name := func(p string, i int) string { return filepath.Join(dir, fmt.Sprintf("%s%d", p, i)) }
	if op != "create" {
		for i := range fileOpsCount {
			if err := os.WriteFile(name("f", i), nil, 0o644); err != nil {
				return Result{}, err
			}
		}
	}
	if op == "stat" {
		// Past the kernel's attribute and entry timeouts (1 s, ours and
		// libfuse's default): every stat asks the filesystem, however
		// long the files took to make.
		time.Sleep(1100 * time.Millisecond)
	}
	page := make([]byte, 4096)
	do := map[string]func(i int) error{
		"create": func(i int) error {
			f, err := os.OpenFile(name("f", i), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
			if err != nil {
				return err
			}
			return f.Close()
		},
		"write4k": func(i int) error {
			f, err := os.OpenFile(name("f", i), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			if _, err := f.Write(page); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		},
		"stat":   func(i int) error { _, err := os.Stat(name("f", i)); return err },
		"rename": func(i int) error { return os.Rename(name("f", i), name("g", i)) },
		"unlink": func(i int) error { return os.Remove(name("f", i)) },
	}[op]
	var h hist.H
	start := time.Now()
	for i := range fileOpsCount {
		t := time.Now()
		if err := do(i); err != nil {
			return Result{}, fmt.Errorf("files-%s: %w", op, err)
		}
		h.Record(time.Since(t))
	}
	elapsed := time.Since(start)
	return Result{Ops: fileOpsCount, OpsPerSec: fileOpsCount / elapsed.Seconds(),
		P50us: float64(h.Quantile(0.5).Microseconds()), P99us: float64(h.Quantile(0.99).Microseconds())}, nil
}
