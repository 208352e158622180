// Package fsmodel checks a mounted filesystem against a directory of the
// local one, for tests: fsx and fsstress in one. A seeded run of random
// operations — writes (pwrite, O_APPEND, now and then 1 MiB), reads,
// truncates by descriptor and by name, fallocate's modes, writes through
// shared mappings, copy_file_range, renames of files and directories,
// links, symlinks, mkdir and rmdir, extended attributes and chmod, on open
// and unlinked files — runs on both, comparing bytes and errnos at every
// call and the whole tree after the kernel's pages are dropped and after
// each remount.
package fsmodel

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// modelPair is one file open on both sides: the mount and the reference
// directory. It follows its inode, not its name, through renames and
// unlinks, as an open file descriptor does.
type modelPair struct {
	m, r *os.File
	name string // the name it was opened by, for messages
}

// model runs the same operations on a pd3 mount and on a directory of the
// local filesystem and fails at the first difference: in bytes read, in
// sizes, or in the errno of a failed call.
type model struct {
	t    testing.TB
	dir  string // the mount
	ref  string
	rng  *rand.Rand
	open []*modelPair
	ops  []string // the last operations, for the failure message
	// succeeded counts the calls that succeeded on both sides, by name,
	// to show what a run exercised.
	succeeded map[string]int
	lastX     string // the last name given an extended attribute
	remountFn func(crash bool) string
	fileSpan  int64 // Config.Span
	// python is python3's path, which writes through the mount's shared
	// mappings ("" skips those operations; make test installs it).
	python string
}

func (md *model) path(name string) string { return filepath.Join(md.dir, name) }

var (
	modelNames = []string{"f0", "f1", "f2", "d/f3", "d/f4", "d/e/f5", "d/e/f6", "x/f7", "x/y/f8"}
	modelDirs  = []string{"d", "d/e", "x", "x/y"}
)

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return syscall.Errno(0xffff) // not an errno: compared as such
}

func (md *model) logf(format string, args ...any) {
	md.ops = append(md.ops, fmt.Sprintf(format, args...))
	if len(md.ops) > 40 {
		md.ops = md.ops[1:]
	}
}

func (md *model) fail(format string, args ...any) {
	md.t.Helper()
	md.t.Fatalf("%s\nlast operations:\n%s", fmt.Sprintf(format, args...), joinLines(md.ops))
}

func joinLines(s []string) string {
	var b bytes.Buffer
	for _, l := range s {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// same fails unless both sides failed with the same errno or both
// succeeded.
func (md *model) same(what string, em, er error) bool {
	md.t.Helper()
	if errnoOf(em) != errnoOf(er) {
		md.fail("%s: mount %v, reference %v", what, em, er)
	}
	if em == nil {
		md.succeeded[strings.Fields(what)[0]]++
	}
	return em == nil
}

func (md *model) sameBytes(what string, m, r []byte) {
	md.t.Helper()
	if bytes.Equal(m, r) {
		return
	}
	n := min(len(m), len(r))
	i := 0
	for i < n && m[i] == r[i] {
		i++
	}
	md.fail("%s: %d bytes from the mount, %d from the reference, first difference at byte %d", what, len(m), len(r), i)
}

func (md *model) pick() *modelPair {
	if len(md.open) == 0 {
		return nil
	}
	return md.open[md.rng.IntN(len(md.open))]
}

// span is an offset and length biased to page boundaries and small
// unaligned pieces, the shapes that cross a page cache's edge cases.
func (md *model) span(maxLen int) (int64, int) {
	off := md.rng.Int64N(md.fileSpan)
	if md.rng.IntN(2) == 0 {
		off &^= 4095
	}
	n := 1 + md.rng.IntN(maxLen)
	switch md.rng.IntN(3) {
	case 0:
		n = 1 + md.rng.IntN(100)
	case 1:
		n = (n + 4095) &^ 4095
	}
	return off, n
}

func (md *model) randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(md.rng.Uint32())
	}
	return b
}

func (md *model) step() {
	md.t.Helper()
	rng := md.rng
	name := modelNames[rng.IntN(len(modelNames))]
	p := md.pick()
	switch op := rng.IntN(26); {
	case op < 2 || p == nil: // open
		if len(md.open) >= 6 {
			md.closePair(md.open[0])
			return
		}
		flags := os.O_RDWR | os.O_CREATE
		if rng.IntN(8) == 0 {
			flags |= os.O_TRUNC
		}
		if rng.IntN(8) == 0 {
			flags |= os.O_APPEND
		}
		md.logf("open %s %#x", name, flags)
		fm, em := os.OpenFile(md.path(name), flags, 0o644)
		fr, er := os.OpenFile(filepath.Join(md.ref, name), flags, 0o644)
		if md.same("open "+name, em, er) {
			md.open = append(md.open, &modelPair{m: fm, r: fr, name: name})
		}
	case op < 3:
		md.closePair(p)
	case op < 7: // pwrite (an append on an O_APPEND file, as Linux has it)
		maxLen := 128 << 10
		if rng.IntN(16) == 0 {
			maxLen = 1 << 20
		}
		off, n := md.span(maxLen)
		b := md.randomBytes(n)
		md.logf("pwrite %s off %d len %d", p.name, off, n)
		nm, em := unix.Pwrite(int(p.m.Fd()), b, off)
		nr, er := unix.Pwrite(int(p.r.Fd()), b, off)
		md.same("pwrite", em, er)
		if nm != nr {
			md.fail("pwrite: %d bytes on the mount, %d on the reference", nm, nr)
		}
	case op < 10: // pread
		off, n := md.span(128 << 10)
		md.logf("pread %s off %d len %d", p.name, off, n)
		bm, br := make([]byte, n), make([]byte, n)
		nm, em := p.m.ReadAt(bm, off)
		nr, er := p.r.ReadAt(br, off)
		md.same("pread", ignoreEOF(em), ignoreEOF(er))
		md.sameBytes(fmt.Sprintf("pread %s off %d len %d", p.name, off, n), bm[:nm], br[:nr])
	case op < 11: // ftruncate
		size := rng.Int64N(md.fileSpan)
		if rng.IntN(2) == 0 {
			size &^= 4095
		}
		md.logf("ftruncate %s %d", p.name, size)
		md.same("ftruncate", p.m.Truncate(size), p.r.Truncate(size))
	case op < 12: // fallocate
		modes := []uint32{0, unix.FALLOC_FL_KEEP_SIZE, unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, unix.FALLOC_FL_ZERO_RANGE}
		mode := modes[rng.IntN(len(modes))]
		off, n := md.span(256 << 10)
		md.logf("fallocate %s mode %#x off %d len %d", p.name, mode, off, n)
		em := unix.Fallocate(int(p.m.Fd()), mode, off, int64(n))
		er := unix.Fallocate(int(p.r.Fd()), mode, off, int64(n))
		md.same("fallocate", em, er)
	case op < 13: // fsync
		md.logf("fsync %s", p.name)
		md.same("fsync", p.m.Sync(), p.r.Sync())
	case op < 14: // shared mapping: write through it, then unmap
		md.mmapWrite(p)
	case op < 15: // fstat
		md.logf("fstat %s", p.name)
		sm, em := p.m.Stat()
		sr, er := p.r.Stat()
		if md.same("fstat", em, er) && sm.Size() != sr.Size() {
			md.fail("fstat %s: size %d on the mount, %d on the reference", p.name, sm.Size(), sr.Size())
		}
	case op < 16: // rename
		to := modelNames[rng.IntN(len(modelNames))]
		md.logf("rename %s %s", name, to)
		md.same("rename", os.Rename(md.path(name), md.path(to)), os.Rename(filepath.Join(md.ref, name), filepath.Join(md.ref, to)))
	case op < 17: // link
		to := modelNames[rng.IntN(len(modelNames))]
		md.logf("link %s %s", name, to)
		md.same("link", os.Link(md.path(name), md.path(to)), os.Link(filepath.Join(md.ref, name), filepath.Join(md.ref, to)))
	case op < 18: // unlink
		md.logf("unlink %s", name)
		md.same("unlink", os.Remove(md.path(name)), os.Remove(filepath.Join(md.ref, name)))
	case op < 19: // whole file by name
		md.logf("read %s", name)
		bm, em := os.ReadFile(md.path(name))
		br, er := os.ReadFile(filepath.Join(md.ref, name))
		if md.same("read "+name, em, er) {
			md.sameBytes("read "+name, bm, br)
		}
	case op < 20: // truncate by name
		size := rng.Int64N(md.fileSpan)
		md.logf("truncate %s %d", name, size)
		md.same("truncate", os.Truncate(md.path(name), size), os.Truncate(filepath.Join(md.ref, name), size))
	case op < 21: // symlink
		target := modelNames[rng.IntN(len(modelNames))]
		md.logf("symlink %s -> %s", name, target)
		md.same("symlink", os.Symlink(target, md.path(name)), os.Symlink(target, filepath.Join(md.ref, name)))
	case op < 22: // a directory made, removed or moved
		d := modelDirs[rng.IntN(len(modelDirs))]
		switch rng.IntN(3) {
		case 0:
			md.logf("mkdir %s", d)
			md.same("mkdir", os.Mkdir(md.path(d), 0o755), os.Mkdir(filepath.Join(md.ref, d), 0o755))
		case 1:
			md.logf("rmdir %s", d)
			md.same("rmdir", unix.Rmdir(md.path(d)), unix.Rmdir(filepath.Join(md.ref, d)))
		default:
			to := modelDirs[rng.IntN(len(modelDirs))]
			md.logf("rename %s %s", d, to)
			md.same("rename", os.Rename(md.path(d), md.path(to)), os.Rename(filepath.Join(md.ref, d), filepath.Join(md.ref, to)))
		}
	case op < 23: // readlink
		md.logf("readlink %s", name)
		lm, em := os.Readlink(md.path(name))
		lr, er := os.Readlink(filepath.Join(md.ref, name))
		if md.same("readlink", em, er) && lm != lr {
			md.fail("readlink %s: %q on the mount, %q on the reference", name, lm, lr)
		}
	case op < 24: // extended attributes
		key := []string{"user.a", "user.b"}[rng.IntN(2)]
		if md.lastX != "" && rng.IntN(2) == 0 {
			name = md.lastX // most names have no attributes: ask one that may
		}
		switch rng.IntN(3) {
		case 0:
			v := md.randomBytes(rng.IntN(300))
			md.logf("setxattr %s %s len %d", name, key, len(v))
			if md.same("setxattr", unix.Setxattr(md.path(name), key, v, 0), unix.Setxattr(filepath.Join(md.ref, name), key, v, 0)) {
				md.lastX = name
			}
		case 1:
			md.logf("removexattr %s %s", name, key)
			md.same("removexattr", unix.Removexattr(md.path(name), key), unix.Removexattr(filepath.Join(md.ref, name), key))
		default:
			md.logf("getxattr %s %s", name, key)
			bm, br := make([]byte, 512), make([]byte, 512)
			nm, em := unix.Getxattr(md.path(name), key, bm)
			nr, er := unix.Getxattr(filepath.Join(md.ref, name), key, br)
			if md.same("getxattr", em, er) {
				md.sameBytes("getxattr "+name+" "+key, bm[:nm], br[:nr])
			}
		}
	case op < 25: // chmod, then the mode as fstat sees it
		mode := os.FileMode(0o600 | rng.IntN(0o200)) // never unreadable by the test
		md.logf("chmod %s %v", p.name, mode)
		if md.same("chmod", p.m.Chmod(mode), p.r.Chmod(mode)) {
			sm, em := p.m.Stat()
			sr, er := p.r.Stat()
			if md.same("fstat", em, er) && sm.Mode() != sr.Mode() {
				md.fail("fstat %s after chmod: %v on the mount, %v on the reference", p.name, sm.Mode(), sr.Mode())
			}
		}
	default: // copy_file_range between two open files
		q := md.pick()
		off, n := md.span(128 << 10)
		to := md.rng.Int64N(md.fileSpan)
		md.logf("copy_file_range %s off %d -> %s off %d len %d", p.name, off, q.name, to, n)
		om, tm := off, to
		or, tr := off, to
		nm, em := unix.CopyFileRange(int(p.m.Fd()), &om, int(q.m.Fd()), &tm, n, 0)
		nr, er := unix.CopyFileRange(int(p.r.Fd()), &or, int(q.r.Fd()), &tr, n, 0)
		md.same("copy_file_range", em, er)
		if nm != nr {
			md.fail("copy_file_range: %d bytes on the mount, %d on the reference", nm, nr)
		}
	}
}

func ignoreEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// mmapWrite writes random bytes through a shared mapping of part of p's
// file (both sides), as a database's mapped files do. The mount's side
// maps in a child process: a page fault on the mount from the process
// that serves it can deadlock (the faulting thread keeps its P in the
// kernel, so the Go runtime cannot stop the world to run the server).
func (md *model) mmapWrite(p *modelPair) {
	md.t.Helper()
	st, err := p.r.Stat()
	require.NoError(md.t, err)
	if st.Size() == 0 {
		return
	}
	off := md.rng.Int64N(st.Size()) &^ 4095
	n := 1 + md.rng.IntN(int(min(st.Size()-off, 64<<10)))
	at := md.rng.IntN(n)
	b := md.randomBytes(1 + md.rng.IntN(n-at))
	if md.python == "" {
		return
	}
	md.logf("mmap write %s map off %d len %d, bytes at %d len %d", p.name, off, n, at, len(b))
	mem, err := unix.Mmap(int(p.r.Fd()), off, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(md.t, err, "mmap")
	copy(mem[at:], b)
	require.NoError(md.t, unix.Munmap(mem))
	// The child opens the mount's file through this process's descriptor,
	// which reaches it after an unlink too.
	cmd := exec.Command(md.python, "-c", mmapScript, fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), p.m.Fd()),
		fmt.Sprint(off), fmt.Sprint(n), fmt.Sprint(at))
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.CombinedOutput()
	require.NoError(md.t, err, "mmap write in a child: %s", out)
}

const mmapScript = `import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
off, n, at = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
b = sys.stdin.buffer.read()
m[at:at + len(b)] = b
m.close()
os.close(fd)
`

func (md *model) closePair(p *modelPair) {
	md.t.Helper()
	md.logf("close %s", p.name)
	md.same("close", p.m.Close(), p.r.Close())
	for i, q := range md.open {
		if q == p {
			md.open = append(md.open[:i], md.open[i+1:]...)
			break
		}
	}
}

func (md *model) closeAll() {
	for len(md.open) > 0 {
		md.closePair(md.open[0])
	}
}

// check compares the whole tree of both sides.
func (md *model) check(when string) {
	md.t.Helper()
	want, got := Tree(md.t, md.ref), Tree(md.t, md.dir)
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			md.fail("%s: %s is missing from the mount", when, k)
		}
		md.sameBytes(when+": "+k, []byte(g), []byte(v))
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			md.fail("%s: %s is on the mount only", when, k)
		}
	}
}

// remount closes every file and has cfg.Remount take the mount away and
// mount it again.
func (md *model) remount(crash bool) {
	md.t.Helper()
	md.closeAll()
	md.logf("remount (crash: %v)", crash)
	md.dir = md.remountFn(crash)
}

// files lists the regular files on the mount, wherever renames of their
// directories took them.
func (md *model) files() []string {
	md.t.Helper()
	var out []string
	require.NoError(md.t, filepath.WalkDir(md.dir, func(p string, de iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == md.path("volumes") {
			return filepath.SkipDir
		}
		if de.Type().IsRegular() {
			out = append(out, p)
		}
		return nil
	}))
	return out
}

// syncAll makes every file on the mount durable: each one opened and
// fsynced (which records the tree too).
func (md *model) syncAll() {
	md.t.Helper()
	for _, p := range md.open {
		require.NoError(md.t, p.m.Sync())
	}
	for _, n := range md.files() {
		f, err := os.OpenFile(n, os.O_RDWR, 0)
		require.NoError(md.t, err)
		require.NoError(md.t, f.Sync())
		require.NoError(md.t, f.Close())
	}
}

// dropPages drops the kernel's cached pages of every file on the mount
// (POSIX_FADV_DONTNEED writes dirty ones back first), so the next reads
// come from the mount; only these files, unlike drop_caches, which would
// disturb other tests that look at the page cache.
func (md *model) dropPages() {
	md.t.Helper()
	for _, n := range md.files() {
		f, err := os.Open(n)
		require.NoError(md.t, err)
		require.NoError(md.t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
		require.NoError(md.t, f.Close())
	}
}

// Config is one run.
type Config struct {
	// Dir is the mount; Ref the reference directory (empty, local).
	Dir, Ref string
	// Steps is how many operations run (a fifth under -short).
	Steps int
	Seed  uint64
	// Remount, if set, takes the mount away and mounts it again, and
	// returns where: every 500 steps cleanly, every 1000 as a crash, after
	// every file was fsynced (crash true). Every file is closed first.
	Remount func(crash bool) string
	// Span is the part of a file operations touch (default 2 MiB): make
	// it larger than the host cache, so pages are evicted and read back.
	Span int64
}

// Run runs cfg and returns how many calls of each kind succeeded on both
// sides.
func Run(t testing.TB, cfg Config) map[string]int {
	t.Helper()
	md := &model{t: t, dir: cfg.Dir, ref: cfg.Ref, rng: rand.New(rand.NewPCG(cfg.Seed, 7)), succeeded: map[string]int{}, remountFn: cfg.Remount, fileSpan: cfg.Span}
	if md.fileSpan == 0 {
		md.fileSpan = 2 << 20
	}
	if py, err := exec.LookPath("python3"); err == nil {
		md.python = py
	} else {
		t.Logf("no python3 (apt-get install python3): no writes through shared mappings in this run")
	}
	for _, d := range modelDirs {
		require.NoError(t, os.Mkdir(md.path(d), 0o755))
		require.NoError(t, os.Mkdir(filepath.Join(md.ref, d), 0o755))
	}
	defer md.closeAll()
	steps := cfg.Steps
	if testing.Short() {
		steps /= 5
	}
	for i := 1; i <= steps; i++ {
		md.step()
		switch {
		case i%1000 == 0 && md.remountFn != nil:
			md.syncAll()
			md.remount(true)
			md.check(fmt.Sprintf("after a crash at step %d", i))
		case i%500 == 0 && md.remountFn != nil:
			md.remount(false)
			md.check(fmt.Sprintf("after a remount at step %d", i))
		case i%250 == 0:
			md.logf("drop the kernel's pages")
			md.dropPages()
			md.check(fmt.Sprintf("at step %d, the kernel's pages dropped", i))
		}
	}
	md.closeAll()
	md.check("at the end")
	return md.succeeded
}

// Tree reads every file and symlink under dir into a map (path → bytes,
// or "-> target"; directories as "path/"), leaving out a pd3 mount's
// volumes/ directory.
func Tree(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(rel string)
	walk = func(rel string) {
		ents, err := os.ReadDir(dir + rel)
		require.NoError(t, err)
		for _, de := range ents {
			p := rel + "/" + de.Name()
			if p == "/volumes" {
				continue
			}
			switch {
			case de.Type()&os.ModeSymlink != 0:
				target, err := os.Readlink(dir + p)
				require.NoError(t, err)
				out[p] = "-> " + target
			case de.IsDir():
				out[p+"/"] = ""
				walk(p)
			default:
				b, err := os.ReadFile(dir + p)
				require.NoError(t, err)
				out[p] = string(b)
			}
		}
	}
	walk("")
	return out
}
