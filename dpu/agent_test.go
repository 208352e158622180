package dpu

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/dpu/parse"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
)

// request returns a page-protocol request for page k (with a page of
// data for a PUT), as a client sends it.
func request(op pageproto.Op, k pageid.Key) []byte {
	b := make([]byte, pageproto.HeaderSize)
	(&pageproto.Header{Op: op, ID: k}).EncodeRequest(b)
	if op == pageproto.OpPut {
		b = append(b, make([]byte, pageid.Size)...)
	}
	return b
}

// TestWritesWaitForTheNextRead: a write alone only changes Host View for
// the next prefetch decision, so it does not wake the prefetcher; the
// read that does finds it applied first, and a read of the written page
// is not prefetched (docs/decisions.md, 40).
func TestWritesWaitForTheNextRead(t *testing.T) {
	r := newRig(t, 64)
	a := NewAgent(r.hv, r.lz, r.e, func() parse.Parser { return new(parse.PageParser) })
	defer a.Close()
	s := a.NewStream()
	written := pageid.MakeKey(r.vol.ID, 3)
	s.Observe(request(pageproto.OpPut, written))
	a.mu.Lock()
	pending := len(a.pending)
	a.mu.Unlock()
	assert.Equal(t, 1, pending, "the write waits in the queue")
	assert.Zero(t, len(a.kick), "the write did not wake the prefetcher")
	assert.False(t, r.hv.Contains(uint64(written)))

	other := pageid.MakeKey(r.vol.ID, 9)
	s.Observe(request(pageproto.OpGet, written))
	s.Observe(request(pageproto.OpGet, other))
	require.Eventually(t, func() bool { return a.Skipped.Load() > 0 && a.Prefetches.Load() > 0 }, 5*time.Second, time.Millisecond)
	assert.True(t, r.hv.Contains(uint64(written)), "the write reached Host View before the reads were decided")
	assert.EqualValues(t, 1, a.Skipped.Load(), "the written page is not prefetched; the other page (and those predicted past it) are")
}
