package fs

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// poolSize is how many empty file volumes a mount makes ahead of the
// files that need one: a file growing past its inode (inline.go) takes
// one instead of waiting for the memory node's CREATE (a round trip).
const poolSize = 32

// volumePool is the mount's made-ahead file volumes, named fs.NAME.vSEQ.
// It fills from the first file that takes one on, in the background; unused volumes
// are deleted at unmount, and a crash leaves them as orphans the next
// mount deletes.
type volumePool struct {
	ready chan pageid.VolumeInfo // made and fenced, not a file's yet
	kick  chan struct{}
	seq   atomic.Uint64 // the next name's number
	done  chan struct{} // closed once the filler has stopped
}

func newVolumePool(next uint64) *volumePool {
	p := &volumePool{
		ready: make(chan pageid.VolumeInfo, poolSize),
		kick:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
	p.seq.Store(next)
	return p
}

// poolBatch is how many CREATEs the filler keeps in flight: one at a time,
// a loop of creates drains the pool faster than it fills.
const poolBatch = 8

// poolSeq is the number after the largest of names that is a pool
// volume's of filesystem fsName: where the pool's names go on.
func poolSeq(fsName string, names []string) uint64 {
	prefix := "fs." + fsName + ".v"
	next := uint64(0)
	for _, n := range names {
		if rest, ok := strings.CutPrefix(n, prefix); ok {
			if seq, err := strconv.ParseUint(rest, 10, 64); err == nil {
				next = max(next, seq+1)
			}
		}
	}
	return next
}

// VolumesMadeAhead is how many empty file volumes the mount holds ready
// for its next creates.
func (f *FS) VolumesMadeAhead() int { return len(f.pool.ready) }

// takeVolume is a made-ahead volume if one is ready; either way it asks
// for the pool to be topped up.
func (f *FS) takeVolume() (pageid.VolumeInfo, bool) {
	select {
	case f.pool.kick <- struct{}{}:
	default:
	}
	select {
	case v := <-f.pool.ready:
		return v, true
	default:
		return pageid.VolumeInfo{}, false
	}
}

// fillPool makes volumes until the pool is full, poolBatch at a time,
// each time it is asked, until the syncer stops.
func (f *FS) fillPool() {
	defer close(f.pool.done)
	ctx := context.Background()
	var made [poolBatch]pageid.VolumeInfo
	var errs [poolBatch]error
	for {
		select {
		case <-f.done:
			return
		case <-f.pool.kick:
		}
		for len(f.pool.ready) < cap(f.pool.ready) && !f.fenced.Load() {
			n := min(poolBatch, cap(f.pool.ready)-len(f.pool.ready))
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { made[i], errs[i] = f.makePoolVolume(ctx) })
			}
			wg.Wait()
			// Only this goroutine adds to ready, and at most the room
			// there was: these sends never block.
			for i := range n {
				if errs[i] == nil {
					f.pool.ready <- made[i]
				}
			}
			if err := errors.Join(errs[:n]...); err != nil {
				f.cfg.Log.Warn("fs: making file volumes ahead", "err", err)
				break
			}
		}
	}
}

// makePoolVolume creates the next pool volume and presents the mount's
// token for it.
func (f *FS) makePoolVolume(ctx context.Context) (pageid.VolumeInfo, error) {
	for {
		name := "fs." + f.cfg.Name + ".v" + strconv.FormatUint(f.pool.seq.Add(1)-1, 10)
		v, err := f.cfg.Backend.Create(ctx, name, MaxFileSize)
		if errors.Is(err, pageid.ErrExists) {
			continue // not this mount's (Open deleted its orphans): the next name
		}
		if err != nil {
			return v, err
		}
		if err := f.present(ctx, v.ID); err != nil {
			f.freeVolume(ctx, name)
			return v, err
		}
		return v, nil
	}
}

// emptyPool deletes the volumes made ahead and not used, once the filler
// has stopped.
func (f *FS) emptyPool(ctx context.Context) {
	<-f.pool.done
	drain(f.pool.ready, func(v pageid.VolumeInfo) { f.freeVolume(ctx, v.Name) })
}
