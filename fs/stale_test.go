package fs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore"
)

// TestCrashLeavesNoBytesPastTheSize: bytes that a crashed mount wrote
// back past the size it had saved never become part of the file, whether
// a truncation grows it over them, a write past them leaves them in a
// hole, fallocate extends it, or direct writes of whole pages past them
// race the zeroing; a mount that follows a clean unmount zeroes nothing.
func TestCrashLeavesNoBytesPastTheSize(t *testing.T) {
	ctx := context.Background()
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	const size = 3*4096 + 100 // saved, and not a whole number of pages
	const grown = size + 4*4096
	saved := bytes.Repeat([]byte{'a'}, size)
	secret := bytes.Repeat([]byte("secret! "), 4*4096/8)
	grow, wrote := waysToGrow(size, grown)
	for name := range grow {
		f, err := os.Create(e.path(name))
		require.NoError(t, err)
		_, err = f.Write(saved)
		require.NoError(t, err)
		require.NoError(t, f.Sync())
		require.NoError(t, f.Close())
	}
	for name := range grow { // never fsynced: the sizes saved stay
		f, err := os.OpenFile(e.path(name), os.O_WRONLY|os.O_APPEND, 0)
		require.NoError(t, err)
		_, err = f.Write(secret)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	// The secret reaches the memory node as a write-back by eviction
	// would, and the metadata does not.
	require.NoError(t, e.st.Flush(ctx))
	dir := e.dir
	e.crash()

	e = mount(t, addr, dir, 1<<20)
	for name, g := range grow {
		f, err := os.OpenFile(e.path(name), os.O_RDWR, 0)
		require.NoError(t, err)
		defer f.Close()
		growPast(t, f, size, g, "the size saved before the crash")
	}
	e = checkGrown(t, e, grow, wrote, size, grown, "the crashed mount's bytes show past the saved size")
	require.NoError(t, os.Truncate(e.path("truncated"), 2*grown))
	assert.Zero(t, e.fs.Stats().StaleTailsZeroed, "a mount after a clean unmount zeroed a tail")
}

// TestFailedWriteLeavesNoBytesPastTheSize: a write that fails past the
// size may have cached some of its pages first (here: the cache fills
// with them and the memory node refuses the write-backs that would make
// room). Those bytes never become part of the file when it grows over
// them later, whichever way it grows, and writers racing the zeroing keep
// their pages.
func TestFailedWriteLeavesNoBytesPastTheSize(t *testing.T) {
	addr := startNode(t, 0)
	const cachePages = 16
	var faults *pagestore.Faults
	tweak := func(cfg *fs.Config) {
		faults = pagestore.NewFaults(memnode.Remote{C: cfg.Backend.(*memnode.Client)})
		st, err := pagestore.New(faults, pagestore.Options{CacheBytes: cachePages * 4096})
		require.NoError(t, err)
		cfg.Store = st
	}
	e := mountWith(t, addr, "", 0, tweak)
	const size = 3*4096 + 100
	const firstPage = (size + 4095) &^ 4095
	const grown = firstPage + 2*cachePages*4096
	grow, wrote := waysToGrow(size, grown)
	secret := alignedBuf(2 * cachePages * 4096)
	copy(secret, bytes.Repeat([]byte("secret! "), len(secret)/8))
	for name, g := range grow {
		f, err := os.Create(e.path(name))
		require.NoError(t, err)
		_, err = f.Write(bytes.Repeat([]byte{'a'}, size))
		require.NoError(t, err)
		require.NoError(t, f.Sync()) // every page clean: room is made without the node
		d, err := os.OpenFile(e.path(name), os.O_WRONLY|syscall.O_DIRECT, 0)
		require.NoError(t, err)
		faults.Fail.Store(true)
		_, err = d.WriteAt(secret, firstPage) // one WRITE, twice the cache
		faults.Fail.Store(false)
		require.Error(t, err, "%s: a write the cache cannot hold and the node refuses", name)
		require.NoError(t, d.Close())
		growPast(t, f, size, g, "the failed write moved the size")
	}
	checkGrown(t, e, grow, wrote, size, grown, "the failed write's bytes show past the old size")
}

// waysToGrow are the ways to grow a file of size bytes to grown, past
// whatever lies beyond its size, and what each writes past the size on
// the way (want[0] is byte size).
func waysToGrow(size, grown int64) (grow map[string]func(f *os.File) error, wrote map[string]func(want []byte)) {
	firstPage := (size + 4095) &^ 4095 // the first whole page past the size
	grow = map[string]func(f *os.File) error{
		"truncated":  func(f *os.File) error { return f.Truncate(grown) },
		"written":    func(f *os.File) error { _, err := f.WriteAt([]byte{'z'}, grown-1); return err },
		"fallocated": func(f *os.File) error { return syscall.Fallocate(int(f.Fd()), 0, size, grown-size) },
		// Three direct writers of whole pages past the size at once
		// (O_DIRECT: each its own WRITE; the kernel may still take
		// them one at a time): none loses its page to the zeroing,
		// which runs once for the file.
		"concurrent": func(f *os.File) error {
			d, err := os.OpenFile(f.Name(), os.O_WRONLY|syscall.O_DIRECT, 0)
			if err != nil {
				return err
			}
			defer d.Close()
			pages := alignedBuf(3 * 4096)
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i := range 3 {
				p := pages[i*4096 : (i+1)*4096]
				for j := range p {
					p[j] = byte('0' + i)
				}
				wg.Go(func() { _, errs[i] = d.WriteAt(p, firstPage+int64(i)*4096) })
			}
			wg.Wait()
			return errors.Join(errors.Join(errs...), f.Truncate(grown))
		},
	}
	wrote = map[string]func(want []byte){
		"written": func(want []byte) { want[len(want)-1] = 'z' },
		"concurrent": func(want []byte) {
			for i := range 3 {
				at := firstPage - size + int64(i)*4096
				copy(want[at:at+4096], bytes.Repeat([]byte{byte('0' + i)}, 4096))
			}
		},
	}
	return grow, wrote
}

// growPast checks that f still has size bytes, grows it with g and
// closes it.
func growPast(t *testing.T, f *os.File, size int64, g func(*os.File) error, sizeMoved string) {
	t.Helper()
	st, err := f.Stat()
	require.NoError(t, err)
	require.EqualValues(t, size, st.Size(), "%s: %s", f.Name(), sizeMoved)
	require.NoError(t, g(f), f.Name())
	require.NoError(t, f.Close())
}

// checkGrown wants each file's stale tail zeroed once in e, then reads
// back each file grow grew from size to grown through a fresh mount of
// e's directory (the kernel's page cache of e would answer with the
// zeroes it filled in itself) and wants zeroes past size but for what
// wrote says each growth wrote. It returns the fresh mount.
func checkGrown(t *testing.T, e *env, grow map[string]func(*os.File) error, wrote map[string]func([]byte), size, grown int64, shows string) *env {
	t.Helper()
	assert.EqualValues(t, len(grow), e.fs.Stats().StaleTailsZeroed, "each file's tail zeroed once")
	dir := e.dir
	e.unmount()
	e = mount(t, e.addr, dir, 1<<20)
	for name := range grow {
		got, err := os.ReadFile(e.path(name))
		require.NoError(t, err)
		require.Len(t, got, int(grown), name)
		want := make([]byte, grown-size)
		if w := wrote[name]; w != nil {
			w(want)
		}
		at := 0
		for at < len(want) && want[at] == got[int(size)+at] {
			at++
		}
		if !assert.Equal(t, len(want), at, "%s: %s", name, shows) {
			t.Logf("%s: at byte %d: %.16q", name, int(size)+at, got[int(size)+at:])
		}
	}
	return e
}
