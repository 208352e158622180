package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// The shutdown's write-back shows a bar of the bytes written back, on a
// terminal only.
func TestWritebackProgress(t *testing.T) {
	rem := pagestore.NewFaults(pagestore.NewMemRemote())
	st, err := pagestore.New(rem, pagestore.Options{CacheBytes: 1024 * pageid.Size})
	require.NoError(t, err)
	st.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: 1024 * pageid.Size})
	ctx := context.Background()
	page := make([]byte, pageid.Size)
	for p := uint64(0); p < 1024; p++ {
		require.NoError(t, st.Put(ctx, pageid.MakeKey(1, p), page))
	}

	var quiet testutil.SyncBuffer
	writebackProgress(&quiet, false, st, st.Stats().DirtyPages)()
	assert.Empty(t, quiet.String(), "nothing without a terminal")

	// A write-back slow enough to be drawn part way (a bar that jumps
	// straight to the end is cleared without a trace).
	rem.Delay.Store(int64(25 * time.Millisecond))
	var out testutil.SyncBuffer
	stop := writebackProgress(&out, true, st, st.Stats().DirtyPages)
	require.NoError(t, st.Flush(ctx))
	stop()
	assert.Contains(t, out.String(), "writing back 4MiB")
	assert.Regexp(t, `writing back 4MiB +[0-9]+% \|`, out.String(), "a partial bar was drawn")
}

// A benchmark's steps advance the bar; it counts a step once the next
// begins.
func TestBarProgress(t *testing.T) {
	var out testutil.SyncBuffer
	p := &barProgress{w: &out}
	p.Begin(3)
	p.Step("pd3: starting")
	assert.Equal(t, int64(0), p.bar.State().CurrentNum)
	p.Step("pd3: filling")
	p.Step("pd3: randread-q1t1")
	assert.Equal(t, int64(2), p.bar.State().CurrentNum)
	p.End()
	assert.Equal(t, int64(3), p.bar.State().CurrentNum)
	assert.Contains(t, out.String(), "pd3: filling")
}

// The recovery of a --persist directory draws a bar on a terminal only.
func TestRecoveryProgress(t *testing.T) {
	assert.Nil(t, recoveryProgress(io.Discard, false), "nothing without a terminal")
	var out testutil.SyncBuffer
	p := recoveryProgress(&out, true)
	p(0, 0) // an empty directory: no bar
	assert.Empty(t, out.String())
	const total = 4 << 20
	for done := int64(0); done <= total; done += 1 << 20 {
		p(done, total)
		time.Sleep(60 * time.Millisecond) // past the bar's throttle
	}
	assert.Regexp(t, `recovering 4MiB +[0-9]+% \|`, out.String(), "a partial bar was drawn")
}
