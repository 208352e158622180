package memnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// crash abandons a persistent store the way a killed process would: no
// checkpoint, the log syncer stopped, files left as they are.
func crash(s *Store) {
	s.persist.log.close()
}

func pattern(seed byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*31)
	}
	return p
}

// TestPersistSurvivesCrash: acknowledged writes, trims and atomics are all
// there after a crash without checkpoint, after a checkpoint, and after
// more writes on top of a checkpoint.
func TestPersistSurvivesCrash(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	v, err := s.Create("vol", 4*ChunkSize+pageid.Size)
	require.NoError(t, err)
	model := make([]byte, v.Size)
	write := func(s *Store, off uint64, p []byte) {
		require.NoError(t, s.WriteAt(v.ID, off, p))
		copy(model[off:], p)
	}
	write(s, 100, pattern(1, 3*pageid.Size))
	write(s, ChunkSize-7, pattern(2, 100)) // across a chunk boundary
	write(s, 4*ChunkSize, pattern(3, pageid.Size))
	require.NoError(t, s.Trim(v.ID, 2*ChunkSize, ChunkSize)) // frees nothing written, still logged
	write(s, 3*ChunkSize, pattern(4, 5000))
	require.NoError(t, s.Trim(v.ID, 3*ChunkSize+1000, 1000))
	clear(model[3*ChunkSize+1000 : 3*ChunkSize+2000])
	_, err = s.FetchAndAdd(v.ID, 8*pageid.Size, 41)
	require.NoError(t, err)
	binary.LittleEndian.PutUint64(model[8*pageid.Size:], 41)

	check := func(s *Store) {
		t.Helper()
		got := make([]byte, v.Size)
		for off := uint64(0); off < v.Size; off += ChunkSize {
			require.NoError(t, s.ReadAt(v.ID, off, got[off:min(off+ChunkSize, v.Size)]))
		}
		for i := range model {
			if model[i] != got[i] {
				t.Fatalf("recovered byte %d (chunk %d, page %d) is %d, acknowledged %d", i, i/ChunkSize, i/pageid.Size, got[i], model[i])
			}
		}
		require.NoError(t, s.Check())
	}
	crash(s)
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	check(s)
	o, err := s.Open("vol")
	require.NoError(t, err)
	assert.Positive(t, o.Stored, "recovered chunks are counted")
	v.Stored = o.Stored
	assert.Equal(t, v, o, "the volume table survives")

	require.NoError(t, s.Checkpoint())
	write(s, 2*ChunkSize+5, pattern(5, 777))
	crash(s)
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	check(s)

	// A trim of data already in the page files, recovered from the log,
	// must reach the page files at the next checkpoint.
	require.NoError(t, s.Checkpoint())
	require.NoError(t, s.Trim(v.ID, 0, ChunkSize))
	clear(model[:ChunkSize])
	crash(s)
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	check(s)
	require.NoError(t, s.Checkpoint())
	crash(s)
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	check(s)

	// A clean close checkpoints; reopening needs no replay.
	require.NoError(t, s.Close())
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	check(s)
	require.NoError(t, s.Delete("vol"))
	crash(s)
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	_, err = s.Open("vol")
	assert.ErrorIs(t, err, pageid.ErrNoVolume)
	crash(s)
}

// lastSegment returns the newest non-empty log segment.
func lastSegment(t *testing.T, dir string) string {
	names, err := osDisk{}.Names(dir)
	require.NoError(t, err)
	gens := segments(names)
	for i := len(gens) - 1; i >= 0; i-- {
		p := segPath(dir, gens[i])
		if fi, err := os.Stat(p); err == nil && fi.Size() > 0 {
			return p
		}
	}
	t.Fatal("no log segment with entries")
	return ""
}

// TestPersistTornTail: a truncated, bit-flipped or foreign last entry ends
// recovery there; everything before it is intact and the store works on.
func TestPersistTornTail(t *testing.T) {
	for _, damage := range []struct {
		name string
		do   func(t *testing.T, path string)
	}{
		{"truncated mid-entry", func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			require.NoError(t, os.Truncate(path, fi.Size()-100))
		}},
		{"bit flip in the payload", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			b[len(b)-200] ^= 0x10
			require.NoError(t, os.WriteFile(path, b, 0o600))
		}},
		{"garbage appended", func(t *testing.T, path string) {
			f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			f.Write(bytes.Repeat([]byte{0x50, 0x44, 0x33, 0x4c}, 100))
			f.Close()
		}},
		{"entry from another generation", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			// Rewrite the last entry's generation and fix its checksum:
			// only the generation check can reject it.
			last := len(b) - pad16(entryHeader+pageid.Size)
			e := b[last:]
			binary.LittleEndian.PutUint64(e[8:], 999)
			binary.LittleEndian.PutUint32(e[4:], crc32c(e[8:entryHeader+pageid.Size]))
			require.NoError(t, os.WriteFile(path, b, 0o600))
		}},
	} {
		t.Run(damage.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenPersistent(dir, 0)
			require.NoError(t, err)
			v, err := s.Create("vol", ChunkSize)
			require.NoError(t, err)
			for i := 0; i < 10; i++ {
				require.NoError(t, s.WriteAt(v.ID, uint64(i)*pageid.Size, pattern(byte(i), pageid.Size)))
			}
			crash(s)
			damage.do(t, lastSegment(t, dir))
			s, err = OpenPersistent(dir, 0)
			require.NoError(t, err)
			got := make([]byte, pageid.Size)
			for i := 0; i < 9; i++ {
				require.NoError(t, s.ReadAt(v.ID, uint64(i)*pageid.Size, got))
				require.Equal(t, pattern(byte(i), pageid.Size), got, "entry %d before the damage", i)
			}
			require.NoError(t, s.ReadAt(v.ID, 9*pageid.Size, got))
			if damage.name != "garbage appended" {
				assert.Equal(t, make([]byte, pageid.Size), got, "the damaged last entry is not replayed")
			}
			// The store goes on, and a second crash recovers the new writes.
			require.NoError(t, s.WriteAt(v.ID, 20*pageid.Size, pattern(99, pageid.Size)))
			crash(s)
			s, err = OpenPersistent(dir, 0)
			require.NoError(t, err)
			require.NoError(t, s.ReadAt(v.ID, 20*pageid.Size, got))
			assert.Equal(t, pattern(99, pageid.Size), got)
			require.NoError(t, s.ReadAt(v.ID, 0, got))
			assert.Equal(t, pattern(0, pageid.Size), got)
			crash(s)
		})
	}
}

func crc32c(b []byte) uint32 { return crc32Checksum(b) }

// TestPersistLogStaysBounded: with a small limit, checkpoints keep the log
// small while writes continue, and everything recovers.
func TestPersistLogStaysBounded(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	s.SetLogLimit(4 << 20)
	v, err := s.Create("vol", 8*ChunkSize)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	model := make([]byte, v.Size)
	for i := 0; i < 6000; i++ {
		off := rng.Uint64N(v.Size/pageid.Size) * pageid.Size
		p := pattern(byte(i), pageid.Size)
		require.NoError(t, s.WriteAt(v.ID, off, p))
		copy(model[off:], p)
	}
	require.NoError(t, s.Checkpoint()) // waits for a background one, if any
	var logBytes int64
	names, err := osDisk{}.Names(dir)
	require.NoError(t, err)
	for _, g := range segments(names) {
		fi, _ := os.Stat(segPath(dir, g))
		logBytes += fi.Size()
	}
	assert.Less(t, logBytes, int64(8<<20), "%d bytes of log after 24 MiB of writes", logBytes)
	crash(s)
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	got := make([]byte, v.Size)
	for off := uint64(0); off < v.Size; off += ChunkSize {
		require.NoError(t, s.ReadAt(v.ID, off, got[off:off+ChunkSize]))
	}
	assert.True(t, bytes.Equal(model, got))
	crash(s)
}

// TestGroupCommit: concurrent writers over the network share syncs, and
// every acknowledged write is durable.
func TestGroupCommit(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &Server{Store: st}
	go srv.Serve(context.Background(), ln)
	c := dialT(t, ln.Addr().String(), "")
	ctx := context.Background()
	v, err := c.Create(ctx, "vol", 16*ChunkSize)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			calls := make([]Call, 32)
			for round := 0; round < 20; round++ {
				for i := range calls {
					off := uint64((w*640+round*32+i)%4096) * pageid.Size
					calls[i] = c.WriteAsync(ctx, v.ID, off, pattern(byte(w), pageid.Size))
				}
				for _, call := range calls {
					assert.NoError(t, call.Wait(ctx))
				}
			}
		}()
	}
	wg.Wait()
	syncs, entries := st.LogStats()
	t.Logf("%d entries in %d syncs (%.1f per sync)", entries, syncs, float64(entries)/float64(syncs))
	assert.Greater(t, entries, 4*syncs, "group commit shares syncs")
	srv.Close()
	crash(st)
	st, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	got := make([]byte, pageid.Size)
	require.NoError(t, st.ReadAt(v.ID, 0, got))
	assert.NotEqual(t, make([]byte, pageid.Size), got)
	crash(st)
}

// TestSparseVolume: a 4 TiB volume costs nothing until written, holes read
// as zeroes without allocating, trims free its chunks, and a checkpoint
// and reopen bring back exactly the written bytes.
func TestSparseVolume(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	v, err := s.Create("sparse", 4<<40)
	require.NoError(t, err)
	far := uint64(3<<40 + 5*pageid.Size)
	data := pattern(7, 2*pageid.Size)
	require.NoError(t, s.WriteAt(v.ID, far, data))
	require.NoError(t, s.WriteAt(v.ID, 0, data))
	assert.Equal(t, uint64(2*ChunkSize), s.Used())

	got := make([]byte, len(data))
	require.NoError(t, s.ReadAt(v.ID, 2<<40, got))
	assert.Equal(t, make([]byte, len(data)), got, "hole")
	assert.Len(t, s.byID[v.ID].chunks.view.Load().segs, 2, "reading a hole allocated a segment")
	require.NoError(t, s.ReadAt(v.ID, far, got))
	assert.Equal(t, data, got)
	require.NoError(t, s.Trim(v.ID, 1<<40, 1<<40)) // all hole
	require.NoError(t, s.Check())

	require.NoError(t, s.Close())
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	require.NoError(t, s.ReadAt(v.ID, far, got))
	assert.Equal(t, data, got)
	require.NoError(t, s.Trim(v.ID, far&^(ChunkSize-1), ChunkSize))
	assert.Equal(t, uint64(ChunkSize), s.Used())
	require.NoError(t, s.Check())
	require.NoError(t, s.Close())
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	require.NoError(t, s.ReadAt(v.ID, far, got))
	assert.Equal(t, make([]byte, len(data)), got, "trimmed before close")
	require.NoError(t, s.Close())
}

// TestPersistManyVolumes: a checkpoint opens only the page files of
// volumes that changed and keeps none open, so many volumes (a
// filesystem's files) need no file descriptors; a page file left behind
// by a volume the table no longer lists never shows through a new volume
// that gets its id.
func TestPersistManyVolumes(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	var last pageid.VolumeInfo
	// More volumes than the 100 descriptors the check below allows: a
	// store that kept each page file open would fail it.
	const volumes = 150
	for i := range volumes {
		last, err = s.Create(fmt.Sprintf("f%d", i), 1<<20)
		require.NoError(t, err)
		require.NoError(t, s.WriteAt(last.ID, 0, pattern(byte(i), pageid.Size)))
	}
	require.NoError(t, s.Checkpoint())
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	assert.Less(t, len(fds), 100, "page files kept open")
	require.NoError(t, s.Close())

	// A crash between a delete's table update and its file removal
	// leaves a page file for an id the next volume will get.
	stale, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("vol-%d.pages", last.ID)))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("vol-%d.pages", last.ID+1)), stale, 0o600))
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	v, err := s.Create("new", 1<<20)
	require.NoError(t, err)
	require.Equal(t, last.ID+1, v.ID)
	got := make([]byte, pageid.Size)
	require.NoError(t, s.ReadAt(v.ID, 0, got))
	assert.Equal(t, make([]byte, pageid.Size), got)
	require.NoError(t, s.Checkpoint())
	require.NoError(t, s.Close())
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	require.NoError(t, s.ReadAt(v.ID, 0, got))
	assert.Equal(t, make([]byte, pageid.Size), got, "a stale page file showed through")
	require.NoError(t, s.ReadAt(last.ID, 0, got))
	assert.Equal(t, pattern(byte((volumes-1)%256), pageid.Size), got)
	require.NoError(t, s.Close())
}

// The recovery reports its progress: monotonic, over both the page files
// (after a checkpoint) and the log (writes after it), ending at the total.
func TestPersistRecoveryProgress(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	v, err := s.Create("vol", 8*ChunkSize)
	require.NoError(t, err)
	for i := uint64(0); i < 4; i++ {
		require.NoError(t, s.WriteAt(v.ID, i*ChunkSize, pattern(byte(i), ChunkSize)))
	}
	require.NoError(t, s.Checkpoint()) // 4 MiB into the page file
	for i := uint64(4); i < 7; i++ {
		require.NoError(t, s.WriteAt(v.ID, i*ChunkSize, pattern(byte(i), ChunkSize)))
	}
	crash(s) // 3 MiB only in the log

	var calls [][2]int64
	s, err = OpenPersistentProgress(dir, 0, func(done, total int64) { calls = append(calls, [2]int64{done, total}) })
	require.NoError(t, err)
	defer s.Close()
	require.NotEmpty(t, calls)
	total := calls[0][1]
	assert.GreaterOrEqual(t, total, int64(7*ChunkSize), "page files and log together")
	assert.Less(t, total, int64(8*ChunkSize))
	assert.Greater(t, len(calls), 6, "reported along the way, not only at the end")
	for i, c := range calls {
		assert.Equal(t, total, c[1], "one total")
		if i > 0 {
			assert.GreaterOrEqual(t, c[0], calls[i-1][0], "monotonic")
		}
	}
	assert.Equal(t, [2]int64{total, total}, calls[len(calls)-1])
	got := make([]byte, ChunkSize)
	require.NoError(t, s.ReadAt(v.ID, 6*ChunkSize, got))
	assert.Equal(t, pattern(6, ChunkSize), got, "and recovered")
}

// The volume table is journaled: creates, deletes, the re-use of a
// deleted volume's id and fencing tokens all come back after a crash,
// with no checkpoint since, with one in the middle, and from a
// checkpoint alone; a deleted volume's bytes never show through the
// volume that gets its id.
func TestPersistVolumeTableJournal(t *testing.T) {
	for _, cpAt := range []string{"never", "after the first create", "at the end"} {
		t.Run(cpAt, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenPersistent(dir, 0)
			require.NoError(t, err)
			a, err := s.Create("a", 4*ChunkSize)
			require.NoError(t, err)
			require.NoError(t, s.WriteAt(a.ID, ChunkSize, pattern(1, pageid.Size)))
			if cpAt == "after the first create" {
				require.NoError(t, s.Checkpoint())
			}
			keep, err := s.Create("keep", ChunkSize)
			require.NoError(t, err)
			require.NoError(t, s.WriteAt(keep.ID, 0, pattern(2, pageid.Size)))
			_, err = s.raiseFence(s.byID[keep.ID], 7)
			require.NoError(t, err)
			require.NoError(t, s.Delete("a"))
			s.mu.Lock()
			s.nextID = a.ID // as after the ids wrapped around
			s.mu.Unlock()
			b, err := s.Create("b", 4*ChunkSize)
			require.NoError(t, err)
			require.Equal(t, a.ID, b.ID, "the id is re-used")
			require.NoError(t, s.WriteAt(b.ID, 0, pattern(3, pageid.Size)))
			if cpAt == "at the end" {
				require.NoError(t, s.Checkpoint())
			}
			crash(s)
			assert.NoFileExists(t, filepath.Join(dir, "volumes.json"), "the table is not rewritten per change")

			s, err = OpenPersistent(dir, 0)
			require.NoError(t, err)
			defer s.Close()
			names := map[string]uint16{}
			for _, v := range s.List() {
				names[v.Name] = v.ID
			}
			assert.Equal(t, map[string]uint16{"keep": keep.ID, "b": b.ID}, names)
			got := make([]byte, pageid.Size)
			require.NoError(t, s.ReadAt(b.ID, ChunkSize, got))
			assert.Equal(t, make([]byte, pageid.Size), got, "the deleted volume's bytes showed through")
			require.NoError(t, s.ReadAt(b.ID, 0, got))
			assert.Equal(t, pattern(3, pageid.Size), got)
			require.NoError(t, s.ReadAt(keep.ID, 0, got))
			assert.Equal(t, pattern(2, pageid.Size), got)
			tok, err := s.Fence(keep.ID)
			require.NoError(t, err)
			assert.Equal(t, uint64(7), tok)
			next, err := s.Create("next", ChunkSize)
			require.NoError(t, err)
			assert.NotEqual(t, keep.ID, next.ID)
			assert.NotEqual(t, b.ID, next.ID)
		})
	}
}

// A create whose log entry is torn was never acknowledged: the volume is
// absent after recovery, and the store opens.
func TestPersistTornCreate(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	_, err = s.Create("first", ChunkSize)
	require.NoError(t, err)
	_, err = s.Create("torn", ChunkSize)
	require.NoError(t, err)
	crash(s)
	path := lastSegment(t, dir)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(path, fi.Size()-20)) // into the name, past the padding
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Open("first")
	require.NoError(t, err)
	_, err = s.Open("torn")
	assert.ErrorIs(t, err, pageid.ErrNoVolume)
}

// A store written before the table was journaled (volumes.json, a
// checkpoint without the table) opens with its volumes, and its next
// checkpoint takes the table over.
func TestPersistOlderLayout(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	v, err := s.Create("old", ChunkSize)
	require.NoError(t, err)
	require.NoError(t, s.WriteAt(v.ID, 0, pattern(5, pageid.Size)))
	require.NoError(t, s.Close())
	var cp checkpoint
	b, err := os.ReadFile(filepath.Join(dir, "checkpoint"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &cp))
	table, err := json.Marshal(cp.Volumes)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "volumes.json"), table, 0o600))
	cp.Volumes = nil
	b, err = json.Marshal(cp)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "checkpoint"), bytes.Replace(b, []byte(`,"volumes":null`), nil, 1), 0o600))

	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	got := make([]byte, pageid.Size)
	require.NoError(t, s.ReadAt(v.ID, 0, got))
	assert.Equal(t, pattern(5, pageid.Size), got)
	require.NoError(t, s.Close())
	assert.NoFileExists(t, filepath.Join(dir, "volumes.json"), "superseded by the checkpoint's table")
	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	_, err = s.Open("old")
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

// TestPersistResize: a grown volume keeps its size and the bytes written
// past its old end across a crash, wherever the checkpoints fall; one
// that grows while a checkpoint writes chunks (between the table it took
// and the chunks) keeps the new bytes in the log until a checkpoint whose
// table has the new size writes them.
func TestPersistResize(t *testing.T) {
	old, grown := uint64(pageid.Size), uint64(3*ChunkSize)
	// in the first chunk past the old end, in the next chunk
	near, far := uint64(2*pageid.Size), uint64(ChunkSize+pageid.Size)
	for _, cpAt := range []string{"never", "after the resize", "after the writes", "during the checkpoint", "cut short"} {
		t.Run(cpAt, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenPersistent(dir, 0)
			require.NoError(t, err)
			v, err := s.Create("v", old)
			require.NoError(t, err)
			require.NoError(t, s.WriteAt(v.ID, 0, pattern(1, pageid.Size)))
			grow := func() {
				info, err := s.Resize("v", grown)
				require.NoError(t, err)
				require.Equal(t, grown, info.Size)
				require.NoError(t, s.WriteAt(v.ID, near, pattern(2, pageid.Size)))
				require.NoError(t, s.WriteAt(v.ID, far, pattern(3, pageid.Size)))
			}
			switch cpAt {
			case "during the checkpoint":
				s.persist.afterTable = grow
				require.NoError(t, s.Checkpoint())
				s.persist.afterTable = nil
				// This one deletes the log that holds the new bytes.
				require.NoError(t, s.Checkpoint())
			case "cut short":
				// A checkpoint after the growth wrote the page file, new
				// bytes included, and the node died before it replaced the
				// checkpoint file, whose table has the old size (found by
				// TestCrashPoints).
				require.NoError(t, s.Checkpoint())
				grow()
				f, err := os.OpenFile(s.persist.pagePath(v.ID), os.O_RDWR, 0)
				require.NoError(t, err)
				_, err = f.WriteAt(pattern(3, pageid.Size), int64(far))
				require.NoError(t, err)
				require.NoError(t, f.Close())
			case "after the resize":
				_, err := s.Resize("v", grown)
				require.NoError(t, err)
				require.NoError(t, s.Checkpoint())
				grow()
			default:
				grow()
				if cpAt == "after the writes" {
					require.NoError(t, s.Checkpoint())
				}
			}
			crash(s)

			s, err = OpenPersistent(dir, 0)
			require.NoError(t, err)
			defer s.Close()
			info, err := s.Open("v")
			require.NoError(t, err)
			assert.Equal(t, grown, info.Size)
			got := make([]byte, pageid.Size)
			for at, want := range map[uint64][]byte{0: pattern(1, pageid.Size), near: pattern(2, pageid.Size),
				far: pattern(3, pageid.Size), 2 * ChunkSize: make([]byte, pageid.Size)} {
				require.NoError(t, s.ReadAt(v.ID, at, got))
				assert.Equal(t, want, got, "at %d", at)
			}
			require.NoError(t, s.Check())
		})
	}
}

// TestTrimAcrossSparseSegments: a trim of terabytes skips the segments
// never written and still frees or zeroes every chunk it covers, in a
// written segment after holes as in the first one.
func TestTrimAcrossSparseSegments(t *testing.T) {
	s := NewStore(0)
	v, err := s.Create("sparse", 4<<40)
	require.NoError(t, err)
	data := pattern(3, pageid.Size)
	at := []uint64{0, 1<<30 + 5*ChunkSize + 7*pageid.Size, 3<<40 + ChunkSize/2, 4<<40 - pageid.Size}
	for _, off := range at {
		require.NoError(t, s.WriteAt(v.ID, off, data))
	}
	require.Equal(t, uint64(len(at)*ChunkSize), s.Used())

	require.NoError(t, s.Trim(v.ID, pageid.Size, 4<<40-2*pageid.Size))
	got := make([]byte, pageid.Size)
	require.NoError(t, s.ReadAt(v.ID, 0, got))
	assert.Equal(t, data, got, "the page before the trim")
	require.NoError(t, s.ReadAt(v.ID, at[3], got))
	assert.Equal(t, data, got, "the page after the trim")
	for _, off := range at[1:3] {
		require.NoError(t, s.ReadAt(v.ID, off, got))
		assert.Equal(t, make([]byte, pageid.Size), got, "byte %d survived the trim", off)
	}
	assert.Equal(t, uint64(2*ChunkSize), s.Used(), "only the first and last chunks hold data")
	require.NoError(t, s.Check())
}
