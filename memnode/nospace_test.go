package memnode

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPersistFullDisk: a persistent node whose disk fills answers writes
// with pageid.ErrNoSpace, goes on serving reads and small atomics (a lease's
// renewal), takes writes again by itself once there is room, and loses
// nothing it acknowledged.
func TestPersistFullDisk(t *testing.T) {
	dir, resize := testutil.SmallTmpfs(t, "3m")
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	v, err := s.Create("v", 64<<20)
	require.NoError(t, err)

	acked := map[uint64][]byte{}
	page := func(i uint64) []byte {
		p := pattern(byte(i), pageid.Size)
		binary.LittleEndian.PutUint64(p, i+1)
		return p
	}
	var full error
	for i := uint64(1); i < 4096; i++ { // 16 MiB: far more than the disk holds
		if err := s.WriteAt(v.ID, i*pageid.Size, page(i)); err != nil {
			full = err
			break
		}
		acked[i] = page(i)
	}
	require.ErrorIs(t, full, pageid.ErrNoSpace, "after %d pages", len(acked))
	assert.Greater(t, len(acked), 64, "the reserve is not the whole disk")
	assert.Contains(t, full.Error(), "free room there")

	check := func() {
		got := make([]byte, pageid.Size)
		for i, want := range acked {
			require.NoError(t, s.ReadAt(v.ID, i*pageid.Size, got))
			require.Equal(t, want, got, "page %d", i)
		}
	}
	check()
	// A lease word is renewed by CAS: small entries still reach the log.
	var word uint64
	for i := range uint64(200) {
		prev, err := s.CompareAndSwap(v.ID, 0, word, i+1)
		require.NoError(t, err, "renewal %d with the disk full", i)
		require.Equal(t, word, prev)
		word = i + 1
	}
	for _, op := range []func() error{
		func() error { return s.WriteAt(v.ID, 5000*pageid.Size, page(5000)) },
		func() error { return s.Trim(v.ID, pageid.Size, pageid.Size) },
		func() error { _, err := s.Create("w", 1<<20); return err },
	} {
		assert.ErrorIs(t, op(), pageid.ErrNoSpace)
	}
	check()

	resize("64m")
	require.Eventually(t, func() bool { return s.WriteAt(v.ID, 5000*pageid.Size, page(5000)) == nil },
		10*time.Second, 5*time.Millisecond, "writes resume once there is room, with no restart")
	acked[5000] = page(5000)
	for i := uint64(5001); i < 5100; i++ {
		require.NoError(t, s.WriteAt(v.ID, i*pageid.Size, page(i)))
		acked[i] = page(i)
	}
	crash(s)

	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	check()
	got := make([]byte, 8)
	require.NoError(t, s.ReadAt(v.ID, 0, got))
	assert.Equal(t, word, binary.LittleEndian.Uint64(got), "the last renewal")
	require.NoError(t, s.Check())
}
