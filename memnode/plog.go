package memnode

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// The persistent store's write-ahead log (its format is in persist.go):
// appending, group commit by the syncer, the reserve that keeps a full
// disk from stopping it, and rolling to a new segment.

// plog is the write-ahead log with group commit.
type plog struct {
	dir  string
	disk disk

	mu      sync.Mutex // guards everything below
	cond    sync.Cond  // broadcast when durable advances or the syncer fails
	f       diskFile   // current segment
	gen     uint64
	wpos    int64  // end of what is written and synced of the segment
	pending []byte // appended, not yet written
	spare   []byte
	next    uint64 // next sequence number
	durable uint64 // every seq < durable is on stable storage
	size    int64  // bytes in all segments
	limit   int64  // checkpoint past this many bytes of log
	writing bool   // the syncer is writing a taken buffer
	err     error  // the log is broken: writes fail from now on
	// A full disk is a condition, not a failure (docs/decisions.md, 7).
	// full: the disk had no room; data mutations are refused (admit)
	// until the reserve is back. stalled: the last write of the log found
	// no room, so waiters are answered pageid.ErrNoSpace; their entries stay
	// pending and are written once there is room.
	full, stalled error
	isFull        atomic.Bool // full != nil, read without mu by admit
	reserved      bool        // the reserve file holds its room
	retry         *time.Timer // kicks the syncer while the disk is full
	kick          chan struct{}
	closed        bool
	done          chan struct{}

	// Counters.
	Syncs, Entries atomic.Uint64
}

type checkpoint struct {
	Gen    uint64 `json:"gen"`
	Offset int64  `json:"offset"`
	Seq    uint64 `json:"seq"`
	// Volumes is the table at the position (nil in checkpoints written
	// before the table was journaled: then volumes.json has it).
	Volumes []volumeRecord `json:"volumes"`
}

func segPath(dir string, gen uint64) string {
	return filepath.Join(dir, fmt.Sprintf("log-%016d.wal", gen))
}

func pad16(n int) int { return (n + 15) &^ 15 }

// append queues an entry and returns a durability token (its sequence
// number + 1): the entry is on stable storage once waitDurable(token)
// returns. Token 0 means nothing to wait for.
func (l *plog) append(op byte, vol uint16, off, count uint64, payload []byte) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0, l.err
	}
	seq := l.next
	l.next++
	n := pad16(entryHeader + len(payload))
	start := len(l.pending)
	l.pending = append(l.pending, make([]byte, n)...)
	e := l.pending[start : start+n]
	binary.LittleEndian.PutUint32(e[0:], logMagic)
	binary.LittleEndian.PutUint64(e[8:], l.gen)
	binary.LittleEndian.PutUint64(e[16:], seq)
	e[24] = op
	binary.LittleEndian.PutUint16(e[26:], vol)
	binary.LittleEndian.PutUint32(e[28:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(e[32:], off)
	binary.LittleEndian.PutUint64(e[40:], count)
	copy(e[entryHeader:], payload)
	binary.LittleEndian.PutUint32(e[4:], crc32.Checksum(e[8:entryHeader+len(payload)], crcTable))
	l.size += int64(n)
	l.Entries.Add(1)
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return seq + 1, nil
}

// waitDurable blocks until the entry with durability token t (and every
// earlier one) is on stable storage, the log failed, or the disk has no
// room for it (pageid.ErrNoSpace: the entry stays queued and may still become
// durable). durable counts the entries synced, so token t is durable once
// durable ≥ t.
func (l *plog) waitDurable(t uint64) error {
	if t == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.durable < t && l.err == nil && l.stalled == nil {
		l.cond.Wait()
	}
	if l.durable >= t {
		return nil
	}
	return cmp.Or(l.err, l.stalled)
}

// admit refuses a mutation that carries data while the disk is full, before
// it changes anything: small entries (atomics, fences, deletes) still go
// to the log, written into the room the reserve gave up.
func (l *plog) admit() error {
	if !l.isFull.Load() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.full
}

// reserveBytes is the room the reserve file holds for the small entries a
// full disk still takes: a lease renewal every few seconds is 64 bytes, so
// 1 MiB lasts days.
const reserveBytes = 1 << 20

func (l *plog) reservePath() string { return filepath.Join(l.dir, "reserve") }

// fillReserve allocates the reserve file (l.mu held, or before the syncer
// runs) and reports whether it holds its room.
func (l *plog) fillReserve() bool {
	f, err := l.disk.OpenFile(l.reservePath(), os.O_RDWR|os.O_CREATE)
	if err != nil {
		return false
	}
	err = f.Allocate(0, reserveBytes)
	f.Close()
	return err == nil
}

// isNoSpace reports whether err says the disk (or the user's quota) is full.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// fullRetry is how often the syncer tries again while the disk is full.
const fullRetry = 200 * time.Millisecond

// writeOut writes buf at the end of what the segment holds and syncs it.
// A write the disk had no room for is written again from the same place.
func (l *plog) writeOut(f diskFile, buf []byte, at int64) error {
	if _, err := f.WriteAt(buf, at); err != nil {
		return err
	}
	return f.Datasync()
}

// syncer writes and fdatasyncs whatever was appended, sharing one sync
// among all the entries that arrived while the previous one ran.
func (l *plog) syncer() {
	defer close(l.done)
	for range l.kick {
		for l.syncOnce() {
		}
	}
}

// syncOnce writes out and syncs what is pending, and reports whether more
// was appended meanwhile (and can be written).
func (l *plog) syncOnce() bool {
	l.mu.Lock()
	buf, upto, f, at := l.pending, l.next, l.f, l.wpos
	l.pending = l.spare[:0]
	l.writing = true
	l.mu.Unlock()
	var err error
	if len(buf) > 0 {
		err = l.writeOut(f, buf, at)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil && isNoSpace(err) && l.reserved {
		// The first time: give up the reserve and write again at once,
		// so that the entries in hand (a lease renewal among them) need
		// not fail.
		l.reserved = false
		l.full = fmt.Errorf("%w: %v", pageid.ErrNoSpace, err)
		l.isFull.Store(true)
		if rerr := l.disk.Remove(l.reservePath()); rerr == nil {
			err = l.writeOut(f, buf, at)
		}
	}
	l.writing = false
	switch {
	case err == nil:
		if len(buf) > 0 {
			l.Syncs.Add(1)
		}
		l.spare = buf[:0]
		l.wpos = at + int64(len(buf))
		if upto > l.durable {
			l.durable = upto
		}
		l.stalled = nil
		if l.full != nil && l.fillReserve() {
			l.reserved = true
			l.full = nil
			l.isFull.Store(false)
		}
	case isNoSpace(err):
		// Keep the entries, in order, ahead of those appended since.
		l.pending = append(buf, l.pending...)
		l.full = fmt.Errorf("%w: %v", pageid.ErrNoSpace, err)
		l.stalled = l.full
		l.isFull.Store(true)
	case l.err == nil:
		l.err = fmt.Errorf("memnode: writing the log: %w", err)
	}
	if l.full != nil && !l.closed {
		// Try again while the disk is full: writing out what is pending,
		// and taking the reserve back, needs room to return.
		if l.retry == nil {
			l.retry = time.AfterFunc(fullRetry, l.poke)
		} else {
			l.retry.Reset(fullRetry)
		}
	}
	l.cond.Broadcast()
	return len(l.pending) > 0 && l.stalled == nil && l.err == nil
}

// poke wakes the syncer.
func (l *plog) poke() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// roll writes out what is pending, starts a new segment and returns the
// generation and first sequence number of the new segment, taken under the
// same lock, so an entry appended concurrently lands after that position.
func (l *plog) roll() (uint64, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Entries carry the old generation: they must reach the old segment,
	// in order. Wait for a write the syncer has in hand, then write the
	// rest here, holding the lock so nothing is appended meanwhile (once
	// per checkpoint; waiting for pending to drain could starve).
	for l.writing {
		l.cond.Wait()
	}
	if l.err != nil {
		return 0, 0, l.err
	}
	if l.stalled != nil {
		return 0, 0, l.stalled // the pending entries wait for room
	}
	if len(l.pending) > 0 {
		if err := l.writeOut(l.f, l.pending, l.wpos); err != nil {
			if isNoSpace(err) {
				return 0, 0, fmt.Errorf("%w: %v", pageid.ErrNoSpace, err)
			}
			l.err = fmt.Errorf("memnode: writing the log: %w", err)
			l.cond.Broadcast()
			return 0, 0, l.err
		}
		l.wpos += int64(len(l.pending))
		l.pending = l.pending[:0]
		l.durable = l.next
		l.cond.Broadcast()
	}
	gen := l.gen + 1
	f, err := l.disk.OpenFile(segPath(l.dir, gen), os.O_RDWR|os.O_CREATE|os.O_EXCL)
	if err != nil {
		return 0, 0, fmt.Errorf("memnode: new log segment: %w", err)
	}
	if err := l.disk.SyncDir(l.dir); err != nil {
		// The new segment's name may not survive a crash: keep writing
		// the old one, whose name did, and drop the new.
		f.Close()
		l.disk.Remove(segPath(l.dir, gen))
		return 0, 0, fmt.Errorf("memnode: new log segment: %w", err)
	}
	l.f.Close()
	l.f, l.gen, l.wpos = f, gen, 0
	return gen, l.next, nil
}

func (l *plog) close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.kick)
		if l.retry != nil {
			l.retry.Stop()
		}
	}
	l.mu.Unlock()
	<-l.done
	l.f.Close()
}
