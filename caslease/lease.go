// Package caslease is a time-limited claim on one 8-byte word of a volume
// at a memory node, taken and renewed with compare-and-swap alone: the
// mount lease of a filesystem, and a host's lease on a volume when no
// control plane holds it.
package caslease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// CAS is the one verb a lease needs: an 8-byte compare-and-swap of the
// word at off in volume vol, returning the word it found (a
// *memnode.Client).
type CAS interface {
	CompareAndSwap(ctx context.Context, vol uint16, off, old, new uint64) (uint64, error)
}

// Lease is a time-limited claim on one 8-byte word of a volume, taken and
// renewed with the node's CAS alone — a one-sided verb, no lock service on
// the node, as OneSidedMW allocates without the memory node's CPU. The
// word holds the expiry in Unix seconds (high 32 bits) and the holder's
// random id (low 32 bits, never 0); 0 is a free word. Expiry is wall-clock
// time, so hosts sharing a node need roughly synchronised clocks.
type Lease struct {
	C   CAS
	Vol uint16
	Off uint64
	TTL time.Duration

	id  uint32
	cur uint64 // the word we last wrote
}

// word encodes a lease; the expiry is rounded up to the next second, so a
// lease never lasts less than its TTL between renewals.
func (l *Lease) word(now time.Time) uint64 {
	return uint64(now.Add(l.TTL).Unix()+1)<<32 | uint64(l.id)
}

func (l *Lease) read(ctx context.Context) (uint64, error) {
	// A CAS whose old value is the free word sets it to itself: a read.
	return l.C.CompareAndSwap(ctx, l.Vol, l.Off, 0, 0)
}

// Acquire takes the lease, waiting up to wait for another holder's lease
// to run out (a crashed host's lease expires on its own).
func (l *Lease) Acquire(ctx context.Context, wait time.Duration) error {
	for l.id == 0 {
		l.id = rand.Uint32()
	}
	deadline := time.Now().Add(wait)
	for {
		cur, err := l.read(ctx)
		if err != nil {
			return fmt.Errorf("reading the lease: %w", err)
		}
		exp := time.Unix(int64(cur>>32), 0)
		if holder := uint32(cur); holder != 0 && holder != l.id && time.Now().Before(exp) {
			if exp.After(deadline) {
				return fmt.Errorf("%w (until %s)", pageid.ErrHeld, exp.Format(time.RFC3339))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(exp) + 100*time.Millisecond):
			}
			continue
		}
		want := l.word(time.Now())
		prev, err := l.C.CompareAndSwap(ctx, l.Vol, l.Off, cur, want)
		if err != nil {
			return fmt.Errorf("taking the lease: %w", err)
		}
		if prev == cur {
			l.cur = want
			return nil
		}
	}
}

// Renew extends the lease; it fails with pageid.ErrHeld if another holder
// took it. A word that holds an older lease of ours (a restarted node
// that lost its last writes) is still ours.
func (l *Lease) Renew(ctx context.Context) error {
	for {
		want := l.word(time.Now())
		prev, err := l.C.CompareAndSwap(ctx, l.Vol, l.Off, l.cur, want)
		if err != nil {
			return fmt.Errorf("renewing the lease: %w", err)
		}
		if prev == l.cur {
			l.cur = want
			return nil
		}
		if uint32(prev) != l.id {
			return fmt.Errorf("%w: the lease was taken over", pageid.ErrHeld)
		}
		l.cur = prev
	}
}

// Release frees the lease if it is still ours.
func (l *Lease) Release(ctx context.Context) error {
	_, err := l.C.CompareAndSwap(ctx, l.Vol, l.Off, l.cur, 0)
	return err
}
