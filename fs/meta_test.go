package fs

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"sort"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// pagesBackend is a metadata volume in memory: sparse pages, zero where
// never written. Only ReadAt and WriteAt are used by metaStore.
type pagesBackend struct {
	Backend
	mu    sync.Mutex
	pages map[uint64][]byte
}

func (b *pagesBackend) each(off uint64, n int, fn func(page []byte, at int, p int)) {
	for done := 0; done < n; {
		pg, at := (off+uint64(done))/4096, int((off+uint64(done))%4096)
		m := min(4096-at, n-done)
		if b.pages[pg] == nil {
			b.pages[pg] = make([]byte, 4096)
		}
		fn(b.pages[pg][at:at+m], done, m)
		done += m
	}
}

func (b *pagesBackend) ReadAt(_ context.Context, _ uint16, off uint64, p []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.each(off, len(p), func(page []byte, at, _ int) { copy(p[at:], page) })
	return nil
}

func (b *pagesBackend) WriteAt(_ context.Context, _ uint16, off uint64, p []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.each(off, len(p), func(page []byte, at, m int) { copy(page, p[at:at+m]) })
	return nil
}

// treeOf is a snapshot's tree in a form assert can compare.
func treeOf(t *testing.T, s *snapshot) string {
	t.Helper()
	sort.Slice(s.Inodes, func(i, j int) bool { return s.Inodes[i].Ino < s.Inodes[j].Ino })
	b, err := json.Marshal(s)
	require.NoError(t, err)
	return string(b)
}

// journaled saves a snapshot of a root with one directory, then appends
// records that each add a file to it; it returns the store and the
// trees after the snapshot and after each record.
func journaled(t *testing.T, records int) (*metaStore, []string) {
	t.Helper()
	ctx := context.Background()
	m := &metaStore{c: &pagesBackend{pages: map[uint64][]byte{}}, vol: 1}
	s := &snapshot{Version: snapshotVersion, NextIno: 17, Inodes: []*inode{
		{attrs: attrs{Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 3, Parent: rootIno}, Entries: map[string]uint64{"d": 16}},
		{attrs: attrs{Ino: 16, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno}, Entries: map[string]uint64{}},
	}}
	b, err := json.Marshal(s)
	require.NoError(t, err)
	require.NoError(t, m.save(ctx, b))
	trees := []string{treeOf(t, s)}
	for i := range records {
		ino := uint64(17 + i)
		r := record{
			NextIno: ino + 1,
			Inodes: []attrs{
				{Ino: 16, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno, Mtime: int64(i)},
				{Ino: ino, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Size: ino, Vol: fmt.Sprintf("fs.pd3.%d", ino)},
			},
			Entries: []dentry{{Dir: 16, Name: fmt.Sprintf("f%d", i), Ino: ino}},
		}
		b, err := json.Marshal(&r)
		require.NoError(t, err)
		require.NoError(t, m.appendRecord(ctx, b))
		s.Inodes[1].Mtime = int64(i)
		s.Inodes[1].Entries[fmt.Sprintf("f%d", i)] = ino
		s.Inodes = append(s.Inodes, &inode{attrs: r.Inodes[1]})
		s.NextIno = ino + 1
		trees = append(trees, treeOf(t, s))
	}
	return m, trees
}

// loadAgain reads the metadata volume as the next mount would.
func loadAgain(t *testing.T, m *metaStore) (*metaStore, string) {
	t.Helper()
	again := &metaStore{c: m.c, vol: m.vol}
	s, err := again.load(context.Background())
	require.NoError(t, err)
	return again, treeOf(t, s)
}

// TestJournalReplays: a snapshot and its records load as the tree they
// made, across a compaction into the other slot and back.
func TestJournalReplays(t *testing.T) {
	m, trees := journaled(t, 5)
	again, got := loadAgain(t, m)
	assert.Equal(t, trees[5], got)
	assert.Equal(t, m.jlen, again.jlen)
	assert.Equal(t, uint32(5), again.seq)
}

// TestJournalTornTail: a torn, bit-flipped, foreign or stale last record
// ends the replay there; everything before it loads, and the journal goes
// on from there.
func TestJournalTornTail(t *testing.T) {
	ctx := context.Background()
	lastRecord := func(m *metaStore) (off, size uint64) {
		// The records are the same length but for their digits: walk them.
		b := m.c.(*pagesBackend)
		at := slotOff(m.slot) + pageUp(m.n)
		hdr := make([]byte, journalHeader)
		for i := uint32(0); i < m.seq; i++ {
			require.NoError(t, b.ReadAt(ctx, 1, at, hdr))
			size = journalHeader + uint64(binary.LittleEndian.Uint32(hdr[20:]))
			off = at
			at += size
		}
		return off, size
	}
	for _, damage := range []struct {
		name string
		do   func(t *testing.T, m *metaStore)
	}{
		{"torn: its second half never written", func(t *testing.T, m *metaStore) {
			off, size := lastRecord(m)
			require.NoError(t, m.c.WriteAt(ctx, 1, off+size/2, make([]byte, size-size/2)))
		}},
		{"bit flip in the payload", func(t *testing.T, m *metaStore) {
			off, size := lastRecord(m)
			p := make([]byte, 1)
			require.NoError(t, m.c.ReadAt(ctx, 1, off+size-3, p))
			p[0] ^= 0x10
			require.NoError(t, m.c.WriteAt(ctx, 1, off+size-3, p))
		}},
		{"record of another generation", func(t *testing.T, m *metaStore) {
			// Only the generation check can reject it: the checksum is
			// made good again.
			off, size := lastRecord(m)
			e := make([]byte, size)
			require.NoError(t, m.c.ReadAt(ctx, 1, off, e))
			binary.LittleEndian.PutUint64(e[8:], m.gen-1)
			binary.LittleEndian.PutUint32(e[4:], crc32.Checksum(e[8:], castagnoli))
			require.NoError(t, m.c.WriteAt(ctx, 1, off, e))
		}},
		{"record out of sequence", func(t *testing.T, m *metaStore) {
			off, size := lastRecord(m)
			e := make([]byte, size)
			require.NoError(t, m.c.ReadAt(ctx, 1, off, e))
			binary.LittleEndian.PutUint32(e[16:], 7)
			binary.LittleEndian.PutUint32(e[4:], crc32.Checksum(e[8:], castagnoli))
			require.NoError(t, m.c.WriteAt(ctx, 1, off, e))
		}},
		{"length past the slot", func(t *testing.T, m *metaStore) {
			off, _ := lastRecord(m)
			p := make([]byte, 4)
			binary.LittleEndian.PutUint32(p, metaSlotSize)
			require.NoError(t, m.c.WriteAt(ctx, 1, off+20, p))
		}},
	} {
		t.Run(damage.name, func(t *testing.T) {
			m, trees := journaled(t, 4)
			damage.do(t, m)
			again, got := loadAgain(t, m)
			assert.Equal(t, trees[3], got, "the records before the damaged one, not it")
			assert.Equal(t, uint32(3), again.seq)

			// The journal goes on over the damaged record, and a later
			// load replays what was appended.
			r := record{NextIno: 100, Inodes: []attrs{{Ino: 99, Mode: syscall.S_IFLNK | 0o777, Nlink: 1, Target: "x"}},
				Entries: []dentry{{Dir: rootIno, Name: "l", Ino: 99}}}
			b, err := json.Marshal(&r)
			require.NoError(t, err)
			require.NoError(t, again.appendRecord(ctx, b))
			_, got = loadAgain(t, again)
			assert.Contains(t, got, `"Target":"x"`)
			assert.Contains(t, got, `"f2":19`)
			assert.NotContains(t, got, `"f3"`)
		})
	}
}

// TestJournalRestartsAfterASnapshot: a snapshot written over the slot
// two generations back starts an empty journal there; the old records
// that follow it are not replayed.
func TestJournalRestartsAfterASnapshot(t *testing.T) {
	ctx := context.Background()
	m, _ := journaled(t, 3)
	first := m.slot
	tiny := &snapshot{Version: snapshotVersion, NextIno: 16, Inodes: []*inode{
		{attrs: attrs{Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno}, Entries: map[string]uint64{}},
	}}
	b, err := json.Marshal(tiny)
	require.NoError(t, err)
	require.NoError(t, m.save(ctx, b))
	require.NoError(t, m.save(ctx, b))
	require.Equal(t, first, m.slot, "back in the slot whose journal holds three records")
	_, got := loadAgain(t, m)
	assert.Equal(t, treeOf(t, tiny), got)
}

// TestJournalRefusesWhatDoesNotApply: a record that passed its checksum
// but names a directory that is not there is damage, not a torn tail.
func TestJournalRefusesWhatDoesNotApply(t *testing.T) {
	ctx := context.Background()
	m, _ := journaled(t, 1)
	b, err := json.Marshal(&record{NextIno: 30, Entries: []dentry{{Dir: 29, Name: "x", Ino: 17}}})
	require.NoError(t, err)
	require.NoError(t, m.appendRecord(ctx, b))
	_, err = (&metaStore{c: m.c, vol: 1}).load(ctx)
	assert.ErrorContains(t, err, "no directory")
}

// TestJournalFull: a record that does not fit the slot is refused with
// errJournalFull and the journal is unchanged.
func TestJournalFull(t *testing.T) {
	m, _ := journaled(t, 2)
	m.jlen = metaSlotSize - pageUp(m.n) - 10
	assert.ErrorIs(t, m.appendRecord(context.Background(), []byte("{}")), errJournalFull)
	assert.Equal(t, uint32(2), m.seq)
}

// TestSnapshotVersions: a version 2 snapshot (before the journal) still
// loads; one newer than this pd3 knows is refused, not misread.
func TestSnapshotVersions(t *testing.T) {
	for _, c := range []struct {
		version int
		ok      bool
	}{{1, false}, {2, true}, {3, true}, {4, false}} {
		s := &snapshot{Version: c.version, NextIno: 16, Inodes: []*inode{
			{attrs: attrs{Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno}, Entries: map[string]uint64{}},
		}}
		b, err := json.Marshal(s)
		require.NoError(t, err)
		_, err = decodeSnapshot(b)
		if c.ok {
			assert.NoError(t, err, "version %d", c.version)
		} else {
			assert.ErrorContains(t, err, "this pd3 reads 2 to 3", "version %d", c.version)
		}
	}
}

// metaOnly is a Backend holding nothing but the metadata volume (id 1).
type metaOnly struct{ *pagesBackend }

func (b metaOnly) OpenOrCreate(context.Context, string, uint64) (pageid.VolumeInfo, error) {
	return pageid.VolumeInfo{ID: 1, Name: "fs.pd3.meta", Size: metaVolSize}, nil
}

func (b metaOnly) List(ctx context.Context) ([]pageid.VolumeInfo, error) {
	v, _ := b.OpenOrCreate(ctx, "", 0)
	return []pageid.VolumeInfo{v}, nil
}

// TestOldSnapshotIsReplacedFirst: a tree saved by a pd3 before the
// journal (version 2) gets a snapshot of this version before the first
// record, so that a downgrade cannot mount it without its journal.
func TestOldSnapshotIsReplacedFirst(t *testing.T) {
	ctx := context.Background()
	b := metaOnly{&pagesBackend{pages: map[uint64][]byte{}}}
	old := &snapshot{Version: 2, NextIno: 16, Inodes: []*inode{
		{attrs: attrs{Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2, Parent: rootIno}, Entries: map[string]uint64{}},
	}}
	enc, err := json.Marshal(old)
	require.NoError(t, err)
	require.NoError(t, (&metaStore{c: b, vol: 1}).save(ctx, enc))
	f := openOn(t, b)
	f.mu.Lock()
	f.changedLocked(f.inodes[rootIno])
	f.mu.Unlock()
	require.NoError(t, f.syncMeta(ctx, false))
	require.NoError(t, f.Close(ctx))

	m := &metaStore{c: b, vol: 1}
	_, err = m.load(ctx)
	require.NoError(t, err)
	buf := make([]byte, m.n)
	require.NoError(t, m.read(ctx, slotOff(m.slot), buf))
	assert.Contains(t, string(buf), `"Version":3`, "the newest snapshot is this version's")
}

// The metadata's requests fit the memory node's largest.
func TestMetaIOFitsAMemoryNodeRequest(t *testing.T) {
	assert.LessOrEqual(t, metaIO, memnode.MaxIO)
}
