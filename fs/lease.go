package fs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pd3-go/pd3/memnode"
)

// ErrMounted means another host holds the filesystem's lease: two hosts
// writing one tree would each delete the other's new files as orphans.
var ErrMounted = errors.New("filesystem is mounted by another host")

// The lease is one 8-byte word of the metadata volume, taken and renewed
// with the memory node's CAS (a one-sided verb: no server logic), as
// OneSidedMW allocates without a memory-node CPU: expiry in Unix seconds
// (high 32 bits) | holder id (low 32 bits, never 0). Expiry is wall-clock
// time, so hosts sharing a memory node need roughly synchronised clocks.
const leaseOff = memnode.PageSize

type lease struct {
	c   *memnode.Client
	vol uint16
	ttl time.Duration
	id  uint32
	cur uint64 // the word we last wrote
}

// leaseWord encodes a lease; the expiry is rounded up to the next second,
// so a lease never lasts less than its TTL between renewals.
func leaseWord(exp time.Time, id uint32) uint64 { return uint64(exp.Unix()+1)<<32 | uint64(id) }

func (l *lease) read(ctx context.Context) (uint64, error) {
	// A CAS whose old value cannot match (holder id 0 with expiry 0 is
	// the free word, which the CAS then sets to itself) reads the word.
	return l.c.CompareAndSwap(ctx, l.vol, leaseOff, 0, 0)
}

// acquire takes the lease, waiting up to wait for a holder's lease to
// run out (a crashed host's lease expires on its own).
func (l *lease) acquire(ctx context.Context, wait time.Duration) error {
	for l.id == 0 {
		l.id = rand.Uint32()
	}
	deadline := time.Now().Add(wait)
	for {
		cur, err := l.read(ctx)
		if err != nil {
			return fmt.Errorf("fs: reading the lease: %w", err)
		}
		exp := time.Unix(int64(cur>>32), 0)
		if holder := uint32(cur); holder != 0 && holder != l.id && time.Now().Before(exp) {
			if time.Now().Add(time.Until(exp)).After(deadline) {
				return fmt.Errorf("fs: %w (lease until %s)", ErrMounted, exp.Format(time.RFC3339))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(exp) + 100*time.Millisecond):
			}
			continue
		}
		want := leaseWord(time.Now().Add(l.ttl), l.id)
		prev, err := l.c.CompareAndSwap(ctx, l.vol, leaseOff, cur, want)
		if err != nil {
			return fmt.Errorf("fs: taking the lease: %w", err)
		}
		if prev == cur {
			l.cur = want
			return nil
		}
	}
}

// renew extends the lease; it fails with ErrMounted if someone took it.
func (l *lease) renew(ctx context.Context) error {
	want := leaseWord(time.Now().Add(l.ttl), l.id)
	prev, err := l.c.CompareAndSwap(ctx, l.vol, leaseOff, l.cur, want)
	if err != nil {
		return fmt.Errorf("fs: renewing the lease: %w", err)
	}
	if prev != l.cur {
		return fmt.Errorf("fs: %w: the lease was taken over", ErrMounted)
	}
	l.cur = want
	return nil
}

// release frees the lease if it is still ours.
func (l *lease) release(ctx context.Context) error {
	_, err := l.c.CompareAndSwap(ctx, l.vol, leaseOff, l.cur, 0)
	return err
}
