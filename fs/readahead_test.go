package fs_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/pd3-go/pd3/fs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// directFile opens name on the mount with O_DIRECT, so every read is a
// FUSE READ of its own size (no kernel page cache, no kernel read-ahead).
func directFile(t *testing.T, name string, flags int) *os.File {
	t.Helper()
	f, err := os.OpenFile(name, flags|unix.O_DIRECT, 0o644)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// alignedBuf is n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 0
	if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % 4096); r != 0 {
		off = 4096 - r
	}
	return b[off : off+n]
}

// randomBytes is n random bytes: a misplaced window shows.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

// TestStreamReadAheadAnswersSequentialReads: a reader of 1 MiB direct
// reads, or of the 128 KiB READs the kernel's read-ahead sends for a
// reader under memory pressure, one after the other, finds the reads after
// its first already read ahead — at least 512 KiB of them — and gets the
// file's bytes.
func TestStreamReadAheadAnswersSequentialReads(t *testing.T) {
	for _, chunk := range []int{1 << 20, 128 << 10} {
		t.Run(strconv.Itoa(chunk>>10)+"KiB", func(t *testing.T) {
			e := mount(t, startNode(t, 0), "", 0)
			const size = 8 << 20
			want := randomBytes(size)
			require.NoError(t, os.WriteFile(e.path("f"), want, 0o644))

			st, err := os.Stat(e.path("f"))
			require.NoError(t, err)
			first, ok := e.fs.KeyOf(st.Sys().(*syscall.Stat_t).Ino, 0)
			require.True(t, ok)
			require.False(t, e.fs.ReadingAhead(first))

			f := directFile(t, e.path("f"), os.O_RDONLY)
			buf := alignedBuf(chunk)
			depth := max(2, (512<<10)/chunk)
			for off := 0; off < size; off += chunk {
				if off == chunk {
					// The agent is told to leave this file to the mount.
					assert.True(t, e.fs.ReadingAhead(first), "reading ahead after the first read")
					_, _, held := e.fs.ReadAheadStats()
					assert.Equal(t, depth, held, "windows ahead of the reader")
				}
				n, err := f.ReadAt(buf, int64(off))
				require.NoError(t, err)
				require.Equal(t, chunk, n)
				require.True(t, bytes.Equal(want[off:off+chunk], buf), "bytes at %d", off)
			}
			hits, _, _ := e.fs.ReadAheadStats()
			assert.GreaterOrEqual(t, hits, uint64(size/chunk-2), "reads answered from read-ahead")

			// Closing the file gives its windows back.
			require.NoError(t, f.Close())
			require.Eventually(t, func() bool { _, _, held := e.fs.ReadAheadStats(); return held == 0 }, 5*time.Second, 10*time.Millisecond)
			assert.False(t, e.fs.ReadingAhead(first))
		})
	}
}

// TestStreamReadAheadPerReader: two readers streaming one file at
// different places each get their own read-ahead (with one stream per
// file, each read looked like a seek to the other and dropped its
// windows).
func TestStreamReadAheadPerReader(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	const mib, size = 1 << 20, 16 << 20
	want := randomBytes(size)
	require.NoError(t, os.WriteFile(e.path("f"), want, 0o644))
	a := directFile(t, e.path("f"), os.O_RDONLY)
	b := directFile(t, e.path("f"), os.O_RDONLY)
	buf := alignedBuf(mib)
	hits0, _, _ := e.fs.ReadAheadStats()
	const half = size / 2
	for off := 0; off < half; off += mib {
		for _, r := range []struct {
			f  *os.File
			at int
		}{{a, off}, {b, half + off}} {
			_, err := r.f.ReadAt(buf, int64(r.at))
			require.NoError(t, err)
			require.True(t, bytes.Equal(want[r.at:r.at+mib], buf), "bytes at %d", r.at)
		}
	}
	hits, _, _ := e.fs.ReadAheadStats()
	assert.GreaterOrEqual(t, hits-hits0, uint64(2*(half/mib-2)), "both readers were read ahead")
}

// TestStreamReadAheadIsNeverStale: every kind of change to a file between
// two stream reads (a direct write, a buffered write, a truncation and
// growth, a punched hole) is seen by the next read, though the window it
// would come from was read before the change. The changes go through
// handles opened before the first read: closing one would drop the
// windows anyway (Release) and hide a missed invalidation.
func TestStreamReadAheadIsNeverStale(t *testing.T) {
	const mib, size = 1 << 20, 6 << 20
	type handles struct{ direct, buffered *os.File }
	cases := []struct {
		name   string
		change func(t *testing.T, h handles, want []byte)
	}{
		{"direct-write", func(t *testing.T, h handles, want []byte) {
			p := alignedBuf(4096)
			for i := range p {
				p[i] = 0xAB
			}
			_, err := h.direct.WriteAt(p, mib+8192)
			require.NoError(t, err)
			copy(want[mib+8192:], p)
		}},
		{"buffered-write", func(t *testing.T, h handles, want []byte) {
			p := bytes.Repeat([]byte{0xCD}, 100)
			_, err := h.buffered.WriteAt(p, mib+3*mib/2)
			require.NoError(t, err)
			copy(want[mib+3*mib/2:], p)
		}},
		{"truncate-and-grow", func(t *testing.T, h handles, want []byte) {
			require.NoError(t, h.buffered.Truncate(mib+mib/2))
			require.NoError(t, h.buffered.Truncate(size))
			clear(want[mib+mib/2:])
		}},
		{"punch-hole", func(t *testing.T, h handles, want []byte) {
			require.NoError(t, unix.Fallocate(int(h.buffered.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 2*mib, mib))
			clear(want[2*mib : 3*mib])
		}},
	}
	e := mount(t, startNode(t, 0), "", 0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := randomBytes(size)
			path := e.path(tc.name)
			// Synced, so that no write-back of the kernel's drops the
			// windows before the change does.
			w, err := os.Create(path)
			require.NoError(t, err)
			_, err = w.Write(want)
			require.NoError(t, err)
			require.NoError(t, w.Sync())
			require.NoError(t, w.Close())
			h := handles{directFile(t, path, os.O_WRONLY), nil}
			h.buffered, err = os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			t.Cleanup(func() { h.buffered.Close() })
			f := directFile(t, path, os.O_RDONLY)
			buf := alignedBuf(mib)
			_, err = f.ReadAt(buf, 0)
			require.NoError(t, err)
			// The windows after it are read, so they hold the old bytes.
			require.Eventually(t, func() bool { _, _, held := e.fs.ReadAheadStats(); return held > 0 }, 10*time.Second, time.Millisecond,
				"windows read ahead before the change")
			_, discards, _ := e.fs.ReadAheadStats()
			tc.change(t, h, want)
			for off := mib; off < size; off += mib {
				_, err := f.ReadAt(buf, int64(off))
				require.NoError(t, err)
				require.True(t, bytes.Equal(want[off:off+mib], buf), "%s: stale bytes at %d", tc.name, off)
			}
			_, after, _ := e.fs.ReadAheadStats()
			assert.Greater(t, after, discards, "the change dropped the windows")
		})
	}
}

// uncachedFile writes size random bytes to file f of e's mount and opens
// it, none of its pages in the kernel's cache.
func uncachedFile(t *testing.T, e *env, size int) ([]byte, *os.File) {
	t.Helper()
	want := randomBytes(size)
	require.NoError(t, os.WriteFile(e.path("f"), want, 0o644))
	f, err := os.Open(e.path("f"))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	require.NoError(t, f.Sync())
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	return want, f
}

// readBy4K reads f's size bytes 4 KiB at a time, from start to end.
func readBy4K(t *testing.T, f *os.File, size int) []byte {
	t.Helper()
	got := make([]byte, size)
	for off := 0; off < size; off += 4096 {
		_, err := f.ReadAt(got[off:off+4096], int64(off))
		require.NoError(t, err)
	}
	return got
}

// TestKernelReadsAheadOneREADsWorth: a buffered reader of a file no longer
// in the page cache, reading 4 KiB at a time from start to end, is sent
// READs of up to 1 MiB (the mount's max_read) by the kernel's read-ahead,
// not the 128 KiB a FUSE mount starts with, and gets the file's bytes.
func TestKernelReadsAheadOneREADsWorth(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	ra, err := fs.KernelReadAheadOf(e.dir)
	require.NoError(t, err)
	assert.Equal(t, fs.KernelReadAhead, ra)

	const size = 8 << 20
	want, f := uncachedFile(t, e, size)

	before := e.fs.Stats()
	require.True(t, bytes.Equal(want, readBy4K(t, f, size)))
	st := e.fs.Stats()
	reads := st.Reads - before.Reads
	require.NotZero(t, reads)
	// 128 KiB READs would be 64 or more; the kernel's window grows to
	// 1 MiB from a few small first ones, and a loaded machine (a CI run
	// under -race) sometimes splits a window in two, so the bound is
	// half the 128 KiB count and the mean READ twice 128 KiB.
	bytesRead := st.ReadBytes - before.ReadBytes
	assert.LessOrEqual(t, reads, uint64(32), "READs for %d MiB (%d bytes)", size>>20, bytesRead)
	assert.Greater(t, bytesRead/reads, uint64(256<<10), "mean READ of %d READs", reads)
}

// TestScanThroughCachedPagesIsReadAhead: a sequential reader of a file
// part of whose pages the kernel still caches (16 KiB of every 64 KiB)
// is sent READs of the 48 KiB between them; from the third in a row the
// page store reads the blocks ahead of them from the node, and the READs
// take their pages from its windows. The reader gets the file's bytes.
func TestScanThroughCachedPagesIsReadAhead(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 1<<20) // a cache of 1 MiB: the file is at the node
	const size = 8 << 20
	want, f := uncachedFile(t, e, size)
	// Another handle, without the kernel's read-ahead, caches 16 KiB of
	// every 64 KiB.
	r, err := os.Open(e.path("f"))
	require.NoError(t, err)
	require.NoError(t, unix.Fadvise(int(r.Fd()), 0, 0, unix.FADV_RANDOM))
	for off := 0; off < size; off += 64 << 10 {
		_, err := r.ReadAt(make([]byte, 16<<10), int64(off))
		require.NoError(t, err)
	}
	require.NoError(t, r.Close())

	before, sbefore := e.fs.Stats(), e.st.Stats()
	require.True(t, bytes.Equal(want, readBy4K(t, f, size)))
	st, sst := e.fs.Stats(), e.st.Stats()
	reads, hits := st.Reads-before.Reads, sst.ReadAheadHits-sbefore.ReadAheadHits
	t.Logf("%d READs of %d bytes; %d pages from read-ahead windows", reads, st.ReadBytes-before.ReadBytes, hits)
	require.Greater(t, reads, uint64(64), "the kernel's cached pages broke the scan into small READs")
	// 1 052–1 292 of the 1 536 pages read came from windows in runs on
	// a loaded machine; none without the scan's read-ahead.
	assert.Greater(t, hits, uint64(size/4096/4), "the READs took their pages from the store's windows")
}
