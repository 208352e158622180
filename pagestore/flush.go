package pagestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"runtime"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// Dirty pages and write-back: the dirty bits, Flush and FlushVolume, the
// refusal of a remote that fails write-backs, and the background rounds
// of StartWriteback.

// markDirty sets frame f's dirty bit (its mu held for writing). Once
// half the frames are dirty it starts a background write-back round, so
// that a burst of writes does not leave the misses after it only dirty
// victims.
func (s *Store) markDirty(f int32) {
	bit := uint64(1) << (f % 64)
	if s.dirtyBits[f/64].Or(bit)&bit != 0 {
		return
	}
	if s.ndirty.Add(1) > int64(len(s.frames)/2) {
		s.kickWriteback()
	}
}

// markClean clears frame f's dirty bit (its mu held for writing).
func (s *Store) markClean(f int32) {
	bit := uint64(1) << (f % 64)
	if s.dirtyBits[f/64].And(^bit)&bit != 0 {
		s.ndirty.Add(-1)
	}
}

// dirty reports whether frame f holds a write the remote has not seen.
func (s *Store) dirty(f int32) bool { return s.dirtyBits[f/64].Load()>>(f%64)&1 == 1 }

// nextDirty returns the first frame from f on whose dirty bit is set, or
// len(s.frames).
func (s *Store) nextDirty(f int) int {
	for w := f / 64; w < len(s.dirtyBits); w++ {
		word := s.dirtyBits[w].Load()
		if w == f/64 {
			word &= ^uint64(0) << (f % 64)
		}
		if word != 0 {
			return w*64 + bits.TrailingZeros64(word)
		}
	}
	return len(s.frames)
}

// kickWriteback starts a background write-back round now if
// StartWriteback runs and none is pending.
func (s *Store) kickWriteback() {
	select {
	case s.cleanKick <- struct{}{}:
	default:
	}
}

// evicted finishes the eviction of page k from its claimed frame f (clean
// by now): out of the index, empty, and reported.
func (s *Store) evicted(f int32, k pageid.Key) {
	s.unindex(k, f)
	fr := &s.frames[f]
	fr.key, fr.valid = 0, false
	s.evictions.Add(1)
	if s.opt.OnEvict != nil {
		s.opt.OnEvict(k)
	}
}

// flushBatch is how many dirty pages Flush sends to the remote at once.
const flushBatch = 64

// wbRefusedFor is how long after a refused write-back claims skip dirty
// pages without trying to write them back.
const wbRefusedFor = time.Second

// writeBacksTaken ends a refusal of write-backs: the remote took one. It
// stores only when there is a refusal to end (write-backs are frequent; a
// store on every one would bounce the word between cores).
func (s *Store) writeBacksTaken() {
	if s.wbRefused.Load() != nil {
		s.wbRefused.Store(nil)
	}
}

// refusal is a write-back the remote refused, and when.
type refusal struct {
	at  time.Time
	err error
}

// maxClaimWait bounds how long a miss waits for a frame to become evictable.
const maxClaimWait = 10 * time.Second

// Flush returns once every page that was dirty when it was called is at the
// remote. Dirty pages are copied out in batches, so reads and writes go on
// while the batch travels; a page rewritten meanwhile stays dirty. Flushes
// run one at a time.
//
// Concurrent callers share rounds: a caller joins the next round that has
// not started (every write it completed before calling is then covered)
// and one of that round's callers runs it for all of them. Thirty-two
// FUA writers thus cost a few flushes, not thirty-two in a row.
func (s *Store) Flush(ctx context.Context) error {
	s.fmu.Lock()
	if s.nextRound == nil {
		s.nextRound = &flushRound{}
	}
	r := s.nextRound
	for s.flushing && !r.done {
		s.fcond.Wait()
	}
	if r.done {
		s.fmu.Unlock()
		return r.err
	}
	s.flushing = true
	s.nextRound = nil
	s.fmu.Unlock()
	// The round serves other callers too: one caller's cancellation must
	// not fail theirs (it is bounded by the retry budget and timeouts).
	err := s.flushRetrying(context.WithoutCancel(ctx), 0)
	s.fmu.Lock()
	r.err, r.done = err, true
	s.flushing = false
	s.fcond.Broadcast()
	s.fmu.Unlock()
	return err
}

// flushRound is one Flush pass and the callers waiting for it.
type flushRound struct {
	done bool
	err  error
}

// FlushVolume is Flush for the pages of volume vol only (a file's fsync).
// It does not share rounds with other callers.
func (s *Store) FlushVolume(ctx context.Context, vol uint16) error {
	return s.flushRetrying(ctx, vol)
}

// flushRetrying flushes the pages of volume vol (0: all), retrying while
// the remote is unreachable, for up to RetryFor.
func (s *Store) flushRetrying(ctx context.Context, vol uint16) error {
	var failedAt time.Time
	for {
		err := s.flushOnce(ctx, vol)
		if err == nil || !s.retryable(err) {
			return err
		}
		if failedAt.IsZero() {
			failedAt = time.Now()
		}
		if time.Since(failedAt) >= s.opt.RetryFor {
			return err
		}
		if err := sleepCtx(ctx, retryBackoff); err != nil {
			return err
		}
	}
}

// retryBackoff paces write-back retries against an unreachable remote.
const retryBackoff = 50 * time.Millisecond

// retryable tells a remote that may come back (connection lost, timed
// out) from an answer that will not change.
func (s *Store) retryable(err error) bool {
	return s.opt.RetryFor > 0 && errors.Is(err, pageid.ErrUnavailable)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) flushOnce(ctx context.Context, vol uint16) error {
	for i := 0; i < len(s.frames); {
		next, err := s.flushFrom(ctx, vol, i)
		if err != nil {
			return fmt.Errorf("flushing: %w", err)
		}
		i = next
		// Between batches the lock is free: a volume's flush (an fsync,
		// a file moving to a volume) waits for one batch of a round
		// that writes everything back, not for the whole round.
		runtime.Gosched()
	}
	return nil
}

// flushFrom writes back up to flushBatch dirty pages of volume vol (0:
// all) from frame i on, and returns where it stopped. One batch is
// copied and written at a time (flushMu), so no two write-backs of a page
// from Flush are in flight at once, and one cannot overtake the other.
func (s *Store) flushFrom(ctx context.Context, vol uint16, i int) (int, error) {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	if s.flushBuf == nil {
		s.flushBuf = make([]byte, flushBatch*pageid.Size)
	}
	var (
		keys  [flushBatch]pageid.Key
		pages [flushBatch][]byte
		held  [flushBatch]int32
		vers  [flushBatch]uint64
		n     int
	)
	for i = s.nextDirty(i); i < len(s.frames) && n < flushBatch; i = s.nextDirty(i + 1) {
		fr := &s.frames[i]
		fr.mu.RLock()
		if !fr.valid || !s.dirty(int32(i)) || (vol != 0 && fr.key.Volume() != vol) {
			fr.mu.RUnlock()
			continue
		}
		fr.wb.Store(true)
		keys[n], held[n], vers[n] = fr.key, int32(i), fr.ver
		pages[n] = s.flushBuf[n*pageid.Size : (n+1)*pageid.Size]
		copy(pages[n], s.page(int32(i)))
		fr.mu.RUnlock()
		n++
	}
	if n == 0 {
		return i, nil
	}
	err := s.remote.WritePages(ctx, keys[:n], pages[:n])
	for j := 0; j < n; j++ {
		fr := &s.frames[held[j]]
		if err == nil {
			fr.mu.Lock()
			if fr.key == keys[j] && fr.ver == vers[j] {
				s.markClean(held[j])
			}
			fr.mu.Unlock()
		}
		fr.wb.Store(false)
	}
	if err != nil {
		return i, err
	}
	s.writeBacks.Add(uint64(n))
	s.writeBacksTaken()
	return i, nil
}

// StartWriteback writes dirty pages back every interval until ctx ends, so
// data reaches the remote (and is retried after a remote outage) even when
// clients never flush. A miss that had to write back a dirty victim also
// starts a round at once: the round writes the dirty pages in batches, so
// the misses after it find clean victims instead of each waiting for a
// write-back of its own (docs/decisions.md, 10). Failures are counted and retried at the next tick;
// the pages stay dirty meanwhile. An outage is logged when it starts, every
// wbLogEvery failed rounds while it lasts, and when it ends, not once per
// round. The function returned waits, once ctx has ended, until the
// goroutine has stopped: no round runs after it returns.
func (s *Store) StartWriteback(ctx context.Context, interval time.Duration) (wait func()) {
	log := cmp.Or(s.opt.Log, slog.Default())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		failing := 0 // consecutive failed rounds
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-s.cleanKick:
			}
			n := s.dirtyCount()
			if n == 0 {
				continue
			}
			err := s.Flush(ctx)
			switch {
			case err == nil && failing > 0:
				log.Info(fmt.Sprintf("background write-back recovered after %d failed rounds", failing))
				failing = 0
			case err != nil && ctx.Err() == nil:
				s.wbFailures.Add(1)
				if failing%wbLogEvery == 0 {
					log.Warn(fmt.Sprintf("background write-back failed (%d rounds in a row); %d dirty pages stay cached and are retried every %v", failing+1, n, interval), "err", err)
				}
				failing++
			}
		}
	}()
	return func() { <-done }
}

// wbLogEvery is how many failed write-back rounds in a row pass between
// two warnings.
const wbLogEvery = 60

func (s *Store) dirtyCount() int { return int(s.ndirty.Load()) }
