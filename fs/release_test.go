package fs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowDeletes is a Backend whose DELETEs wait for release (or for their
// context, as a memory-node request does), counting those cut short.
type slowDeletes struct {
	mu       sync.Mutex
	vols     map[string]pageid.VolumeInfo
	next     uint16
	release  chan struct{}
	started  chan struct{}
	canceled int
}

func (b *slowDeletes) OpenOrCreate(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error) {
	b.mu.Lock()
	v, ok := b.vols[name]
	b.mu.Unlock()
	if ok {
		return v, nil
	}
	return b.Create(ctx, name, size)
}

func (b *slowDeletes) Create(_ context.Context, name string, size uint64) (pageid.VolumeInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	v := pageid.VolumeInfo{ID: b.next, Name: name, Size: size}
	b.vols[name] = v
	return v, nil
}

func (b *slowDeletes) Delete(ctx context.Context, name string) error {
	select {
	case b.started <- struct{}{}:
	default:
	}
	select {
	case <-b.release:
	case <-ctx.Done():
		b.mu.Lock()
		b.canceled++
		b.mu.Unlock()
		return ctx.Err()
	}
	b.mu.Lock()
	delete(b.vols, name)
	b.mu.Unlock()
	return nil
}

func (b *slowDeletes) DeleteFenced(ctx context.Context, name string, _ uint64) error {
	return b.Delete(ctx, name)
}

func (b *slowDeletes) List(context.Context) ([]pageid.VolumeInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []pageid.VolumeInfo
	for _, v := range b.vols {
		out = append(out, v)
	}
	return out, nil
}

func (b *slowDeletes) ReadAt(_ context.Context, _ uint16, _ uint64, p []byte) error {
	clear(p)
	return nil
}

func (b *slowDeletes) WriteAt(context.Context, uint16, uint64, []byte) error { return nil }

// openOn opens a filesystem over b without a mount: a page store over
// memory, and a fencing token that is always granted.
func openOn(t *testing.T, b Backend) *FS {
	t.Helper()
	st, err := pagestore.New(pagestore.NewMemRemote(), pagestore.Options{CacheBytes: 1 << 20})
	require.NoError(t, err)
	f, err := Open(context.Background(), Config{Backend: b, Store: st, SyncInterval: -1, Fencing: &Fencing{
		Token:   func(context.Context, uint16) (uint64, error) { return 1, nil },
		Present: func(context.Context, uint16, uint64) error { return nil },
	}})
	require.NoError(t, err)
	return f
}

// An unlink that finds the background deleter behind deletes the volume
// itself; the request ending (an interrupted unlink) must not cut that
// DELETE short: the inode is gone either way, and its volume would stay
// at the node until the next mount.
func TestReleaseWhenTheDeleterIsBehind(t *testing.T) {
	b := &slowDeletes{vols: map[string]pageid.VolumeInfo{}, release: make(chan struct{}), started: make(chan struct{}, 1)}
	ctx := context.Background()
	f := openOn(t, b)
	file := func(i int) *inode {
		v, err := b.Create(ctx, fmt.Sprintf("fs.pd3.%d", 100+i), MaxFileSize)
		require.NoError(t, err)
		n := &inode{attrs: attrs{Ino: uint64(100 + i), Vol: v.Name}, vol: v.ID}
		f.mu.Lock()
		f.inodes[n.Ino], f.byVol[v.ID] = n, n
		f.mu.Unlock()
		return n
	}
	f.release(ctx, file(0))
	<-b.started // the deleter waits in its DELETE
	for i := range pendingDeletes {
		f.release(ctx, file(1+i))
	}
	req, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.release(req, file(pendingDeletes+1)) // the queue is full: this caller deletes
	}()
	<-b.started // this caller's DELETE waits
	cancel()    // the unlink's request is interrupted
	// An absence is asserted (the DELETE goes on): a DELETE bound to the
	// request would return now, and this window lets it show.
	time.Sleep(50 * time.Millisecond)
	close(b.release)
	<-done
	require.NoError(t, f.Close(ctx))
	assert.Zero(t, b.canceled, "a DELETE cut short by the request's end")
	assert.Zero(t, f.PendingDeletes())
	left, _ := b.List(ctx)
	for _, v := range left {
		assert.Equal(t, "fs.pd3.meta", v.Name, "only the metadata volume is left")
	}
}
