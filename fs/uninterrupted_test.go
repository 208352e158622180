package fs

import (
	"context"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/stretchr/testify/assert"
)

// uninterrupted keeps the caller, drops the cancellation, and costs a
// READ or WRITE no allocation.
func TestUninterruptedKeepsCallerDropsCancel(t *testing.T) {
	cancel := make(chan struct{})
	close(cancel)
	fc := &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: 7, Gid: 8}}, Cancel: cancel}
	ctx := uninterrupted(fc)
	assert.NoError(t, ctx.Err())
	assert.Nil(t, ctx.Done())
	uid, gid := caller(ctx)
	assert.Equal(t, [2]uint32{7, 8}, [2]uint32{uid, gid})
	var sink context.Context
	assert.Zero(t, testing.AllocsPerRun(100, func() { sink = uninterrupted(fc) }))
	_ = sink
}
