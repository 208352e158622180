// Package shmring is a single-producer, single-consumer ring of messages in
// shared memory, with a futex doorbell so an idle consumer sleeps instead of
// spinning. The host and a DPU agent process talk through a pair of them.
//
// Layout at the ring's base (the region is page-aligned):
//
//	0    head: bytes consumed (written by the consumer only)
//	64   tail: bytes produced (written by the producer only)
//	128  doorbell: futex word the producer bumps after publishing
//	132  sleeping: 1 while the consumer is parked on the doorbell
//	192  data: Size bytes (a power of two)
//
// A message is an 8-byte header (payload length) followed by the payload,
// padded to 8 bytes. A message never wraps: when it does not fit before the
// end of the data area, the producer writes a pad header (length
// padMarker) and starts again at offset 0. Head and tail only grow; their
// difference is the bytes in flight. Callers with several producers or
// consumers serialise them themselves.
package shmring

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/shm"
)

const (
	offHead   = 0
	offTail   = 64
	offBell   = 128
	offSleep  = 132
	dataStart = 192
	hdr       = 8
	padMarker = ^uint64(0)
)

// Bytes returns the region size a ring with size bytes of data needs.
func Bytes(size int) int { return dataStart + size }

// Ring is one end's view of a ring.
type Ring struct {
	b     []byte
	data  []byte
	size  uint64
	head  *atomic.Uint64
	tail  *atomic.Uint64
	bell  *atomic.Uint32
	sleep *atomic.Uint32
	// pending is the end of the message the consumer holds (Next/Release).
	pending uint64
}

// Attach views b (Bytes(size) bytes, zeroed for a new ring) as a ring.
func Attach(b []byte, size int) (*Ring, error) {
	if size < 4096 || size&(size-1) != 0 || len(b) < Bytes(size) {
		return nil, fmt.Errorf("shmring: bad ring of %d bytes in %d", size, len(b))
	}
	return &Ring{
		b: b, data: b[dataStart : dataStart+size], size: uint64(size),
		head: shm.U64(b, offHead), tail: shm.U64(b, offTail),
		bell: shm.U32(b, offBell), sleep: shm.U32(b, offSleep),
	}, nil
}

func pad8(n uint64) uint64 { return (n + 7) &^ 7 }

// Sleeping reports whether the consumer is parked on the doorbell (or about
// to be: the flag goes up just before the futex wait).
func (r *Ring) Sleeping() bool { return r.sleep.Load() != 0 }

// MaxMessage is the largest payload a ring of this size accepts.
func (r *Ring) MaxMessage() int { return int(r.size/2) - hdr }

// Send copies the parts of one message into the ring and rings the
// doorbell if the consumer sleeps. It reports false when the ring lacks
// room (the caller decides whether to wait, retry or drop).
func (r *Ring) Send(parts ...[]byte) bool {
	if !r.SendLazy(parts...) {
		return false
	}
	if r.sleep.Load() != 0 {
		shm.FutexWake(r.bell, 1)
	}
	return true
}

// SendLazy is Send without waking a sleeping consumer: the message waits
// for the next Send or the consumer's Wait timeout. For messages nobody
// waits on, it saves the producer a futex syscall per message.
func (r *Ring) SendLazy(parts ...[]byte) bool {
	var n uint64
	for _, p := range parts {
		n += uint64(len(p))
	}
	if n > uint64(r.MaxMessage()) {
		return false
	}
	need := hdr + pad8(n)
	t := r.tail.Load()
	h := r.head.Load()
	off := t % r.size
	skip := uint64(0)
	if off+need > r.size {
		skip = r.size - off // pad to the end, start again at 0
	}
	if t+skip+need-h > r.size {
		return false
	}
	if skip > 0 {
		binary.LittleEndian.PutUint64(r.data[off:], padMarker)
		off = 0
	}
	binary.LittleEndian.PutUint64(r.data[off:], n)
	w := off + hdr
	for _, p := range parts {
		w += uint64(copy(r.data[w:], p))
	}
	r.tail.Store(t + skip + need) // publishes the bytes written above
	r.bell.Add(1)
	return true
}

// Next returns the next message's payload, valid until Release, or nil
// when the ring is empty.
func (r *Ring) Next() []byte {
	h := r.head.Load()
	t := r.tail.Load()
	for h != t {
		off := h % r.size
		n := binary.LittleEndian.Uint64(r.data[off:])
		if n == padMarker {
			h += r.size - off
			r.head.Store(h)
			continue
		}
		if n > r.size-off-hdr {
			return nil // corrupt; the caller's liveness checks take over
		}
		r.pending = h + hdr + pad8(n)
		return r.data[off+hdr : off+hdr+n]
	}
	return nil
}

// Release frees the message Next returned.
func (r *Ring) Release() { r.head.Store(r.pending) }

// Wait parks the consumer until a message may be available or timeout
// passes: it spins briefly, then sleeps on the doorbell.
func (r *Ring) Wait(timeout time.Duration) {
	for i := 0; i < 64; i++ {
		if r.head.Load() != r.tail.Load() {
			return
		}
		runtime.Gosched()
	}
	bell := r.bell.Load()
	r.sleep.Store(1)
	if r.head.Load() == r.tail.Load() {
		shm.FutexWait(r.bell, bell, timeout)
	}
	r.sleep.Store(0)
}

// Used reports the bytes in flight.
func (r *Ring) Used() uint64 { return r.tail.Load() - r.head.Load() }
