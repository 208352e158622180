package pagecache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Kind is what happened to a range of a file's pages.
type Kind uint32

const (
	Added    Kind = 1 // the kernel page cache now holds the pages
	Deleted  Kind = 2 // it dropped them
	Accessed Kind = 3 // a read or fault asked for them (hit or miss)
)

// Event is a range of pages, first to last inclusive, of inode Ino.
type Event struct {
	Kind        Kind
	Ino         uint64
	First, Last uint64
}

// Sink receives events, in kernel order, from one goroutine.
type Sink interface {
	Event(Event)
}

// A Muter is a Sink that wants no events of some files for a while: the
// files a host reads ahead itself, whose pages no prefetcher will fetch
// (docs/decisions.md, 37).
type Muter interface {
	Sink
	// Mute reports whether the events of inode ino are of no use now.
	// The tracker asks once per run of events it delivers; on yes the
	// kernel stops sending the file's events, and the tracker asks again
	// every muteCheck until the answer is no. The events in between are
	// lost: a sink that says yes must forget what it knew of the file's
	// pages.
	Mute(ino uint64) bool
}

// ErrUnavailable means the tracker cannot run here (not root, no
// tracefs, a kernel without the tracepoints or with another layout).
var ErrUnavailable = errors.New("page-cache tracker unavailable")

// Tracker follows the kernel page cache of one mounted filesystem.
type Tracker struct {
	objs  pagecacheObjects
	links []link.Link
	rd    *ringbuf.Reader
	done  chan struct{}
	once  sync.Once

	// Events counts the kernel's events delivered to the sink (a run of
	// them as one range, see deliver).
	Events atomic.Uint64
	// Wakeups counts the reader's waits that ended (an event, or
	// idleInterval): what an idle mount costs.
	Wakeups atomic.Uint64

	// Mutes counts files muted (see Muter).
	Mutes atomic.Uint64
	// nmuted is len(muted), for other goroutines.
	nmuted atomic.Int64

	// chosen: only the files given to Follow are traced (StartFollowing);
	// followed holds them, under fmu, until closed (the maps are gone:
	// a mount still serving may call Follow and Unfollow after Close).
	chosen   bool
	fmu      sync.Mutex
	followed map[uint64]struct{}
	closed   bool

	// The reader's goroutine only: pend is a run of events not yet given
	// to the sink, npend of them; muted the files muted in the kernel,
	// asked about again after checked+muteCheck.
	pend    Event
	npend   uint64
	muter   Muter
	muted   map[uint64]struct{}
	checked time.Time
}

// muteCheck is how often a muted file's sink is asked whether it wants
// the file's events again.
const muteCheck = 100 * time.Millisecond

// tracefs is where classic tracepoints are described.
const tracefs = "/sys/kernel/tracing"

// layouts are the tracepoint fields the BPF program reads, as "name:offset:size".
var layouts = map[string][]string{
	"mm_filemap_add_to_page_cache":      {"i_ino:16:8", "index:24:8", "s_dev:32:4", "order:36:1"},
	"mm_filemap_delete_from_page_cache": {"i_ino:16:8", "index:24:8", "s_dev:32:4", "order:36:1"},
	"mm_filemap_get_pages":              {"i_ino:8:8", "s_dev:16:4", "index:24:8", "last_index:32:8"},
	"mm_filemap_fault":                  {"i_ino:8:8", "s_dev:16:4", "index:24:8"},
}

var progs = []string{"mm_filemap_add_to_page_cache", "mm_filemap_delete_from_page_cache", "mm_filemap_get_pages", "mm_filemap_fault"}

// ensureTracefs mounts tracefs if it is missing (root only).
func ensureTracefs() error {
	if _, err := os.Stat(tracefs + "/events"); err == nil {
		return nil
	}
	if err := unix.Mount("tracefs", tracefs, "tracefs", 0, ""); err != nil {
		return fmt.Errorf("%w: mounting tracefs at %s: %v", ErrUnavailable, tracefs, err)
	}
	return nil
}

// checkLayout compares a tracepoint's format with what the program reads.
func checkLayout(name string) error {
	b, err := os.ReadFile(tracefs + "/events/filemap/" + name + "/format")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		var decl, off, size string
		for _, part := range strings.Split(strings.TrimSpace(line), ";") {
			part = strings.TrimSpace(part)
			switch {
			case strings.HasPrefix(part, "field:"):
				decl = part[len("field:"):]
			case strings.HasPrefix(part, "offset:"):
				off = part[len("offset:"):]
			case strings.HasPrefix(part, "size:"):
				size = part[len("size:"):]
			}
		}
		if decl != "" {
			f := strings.Fields(decl)
			fields[strings.TrimLeft(f[len(f)-1], "*")] = off + ":" + size
		}
	}
	for _, want := range layouts[name] {
		field, loc, _ := strings.Cut(want, ":")
		if fields[field] != loc {
			return fmt.Errorf("%w: tracepoint %s has %s at %q, the program reads %s", ErrUnavailable, name, field, fields[field], loc)
		}
	}
	return nil
}

// Start loads the programs for the filesystem whose device (kernel
// encoding, MAJOR<<20|MINOR) is dev and feeds sink with the events of
// every file until Close.
func Start(dev uint32, sink Sink) (*Tracker, error) { return start(dev, sink, false) }

// StartFollowing is Start for the files given to Follow only: the events
// of the others stop in the kernel, before the ring (docs/decisions.md,
// 44).
func StartFollowing(dev uint32, sink Sink) (*Tracker, error) { return start(dev, sink, true) }

func start(dev uint32, sink Sink, chosen bool) (*Tracker, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: needs root", ErrUnavailable)
	}
	if err := ensureTracefs(); err != nil {
		return nil, err
	}
	for _, p := range progs {
		if err := checkLayout(p); err != nil {
			return nil, err
		}
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	spec, err := loadPagecache()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if err := spec.Variables["target_dev"].Set(dev); err != nil {
		return nil, fmt.Errorf("pagecache: %w", err)
	}
	if chosen {
		if err := spec.Variables["follow_chosen"].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("pagecache: %w", err)
		}
	}
	t := &Tracker{done: make(chan struct{}), muted: make(map[uint64]struct{}), chosen: chosen, followed: make(map[uint64]struct{})}
	t.muter, _ = sink.(Muter)
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, fmt.Errorf("%w: loading: %v", ErrUnavailable, err)
	}
	for i, p := range []*ebpf.Program{t.objs.PageAdded, t.objs.PageDeleted, t.objs.PagesRead, t.objs.PageFault} {
		l, err := link.Tracepoint("filemap", progs[i], p, nil)
		if err != nil {
			t.closeObjs()
			return nil, fmt.Errorf("%w: attaching %s: %v", ErrUnavailable, progs[i], err)
		}
		t.links = append(t.links, l)
	}
	if t.rd, err = ringbuf.NewReader(t.objs.Events); err != nil {
		t.closeObjs()
		return nil, fmt.Errorf("pagecache: %w", err)
	}
	go t.read(sink)
	return t, nil
}

// pollInterval is how often the reader drains the ring while events
// flow: the programs wake it only when the ring is a quarter full, so
// Host View lags the kernel by at most this much.
const pollInterval = 2 * time.Millisecond

// idleInterval bounds how long the reader sleeps once it found the ring
// empty. The programs wake it when an event lands in a nearly empty
// ring; this only covers a wake-up lost to more racing producers than
// that margin allows.
const idleInterval = time.Second

// read delivers events to sink until Close: it drains what the ring
// holds, then sleeps pollInterval if there was any (a timer: the
// programs' wake-ups meanwhile find no waiter, so a page costs no context
// switch), or else waits in epoll until the programs wake it. An idle
// mount's reader wakes once per idleInterval, not 500 times a second
// (3.4% of a core when it polled every pollInterval).
func (t *Tracker) read(sink Sink) {
	defer close(t.done)
	var rec ringbuf.Record
	for {
		n, err := t.drain(&rec, sink)
		t.flush(sink)
		if err != nil {
			return // closed
		}
		t.recheck()
		if n > 0 {
			time.Sleep(pollInterval)
			continue
		}
		wait := idleInterval
		if len(t.muted) > 0 {
			wait = muteCheck
		}
		t.rd.SetDeadline(time.Now().Add(wait))
		err = t.rd.ReadInto(&rec)
		t.Wakeups.Add(1)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
		case err != nil:
			return // closed
		default:
			t.deliver(&rec, sink)
			t.flush(sink)
		}
	}
}

// drain delivers every event the ring holds now, without waiting.
func (t *Tracker) drain(rec *ringbuf.Record, sink Sink) (int, error) {
	t.rd.SetDeadline(time.Now())
	for n := 0; ; n++ {
		err := t.rd.ReadInto(rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		t.deliver(rec, sink)
	}
}

// maxRun bounds the pages of a run of events given to the sink as one.
const maxRun = 1024

// deliver hands the event in rec to the sink, or holds it: a reader under
// a memory budget makes an add and a delete event per page, in runs of
// consecutive pages of one file (read-ahead brings them in, reclaim takes
// them out in order), and the sink's work per event (the file's key, its
// counters under a lock) is paid once per run (docs/decisions.md, 36).
// Reads are passed one by one. The caller flushes before it waits.
func (t *Tracker) deliver(rec *ringbuf.Record, sink Sink) {
	b := rec.RawSample
	if len(b) < 32 {
		return
	}
	e := Event{
		Ino:   binary.LittleEndian.Uint64(b),
		First: binary.LittleEndian.Uint64(b[8:]),
		Last:  binary.LittleEndian.Uint64(b[16:]),
		Kind:  Kind(binary.LittleEndian.Uint32(b[24:])),
	}
	p := &t.pend
	if t.npend > 0 && e.Kind != Accessed && e.Kind == p.Kind && e.Ino == p.Ino && e.First == p.Last+1 && e.Last >= e.First && e.Last-p.First < maxRun {
		p.Last = e.Last
		t.npend++
		return
	}
	t.flush(sink)
	t.pend, t.npend = e, 1
}

// flush gives the held run to the sink, unless its file is muted.
func (t *Tracker) flush(sink Sink) {
	if t.npend == 0 {
		return
	}
	if !t.mute(t.pend.Ino) {
		sink.Event(t.pend)
	}
	t.Events.Add(t.npend)
	t.npend = 0
}

// mute reports whether inode ino's events are muted, muting them in the
// kernel if the sink wants none now. Events of a file muted a moment ago
// may still be in the ring: they are dropped here.
func (t *Tracker) mute(ino uint64) bool {
	if t.muter == nil {
		return false
	}
	if _, ok := t.muted[ino]; ok {
		return true
	}
	if !t.muter.Mute(ino) {
		return false
	}
	if t.objs.Muted != nil {
		// A full map (more files read ahead at once than it holds)
		// leaves the file's events flowing; the sink drops them.
		if err := t.objs.Muted.Put(ino, uint8(1)); err != nil {
			return true
		}
	}
	t.muted[ino] = struct{}{}
	t.nmuted.Store(int64(len(t.muted)))
	t.Mutes.Add(1)
	return true
}

// recheck asks the sink, every muteCheck, about each muted file, and
// lets the events of those it wants again flow.
func (t *Tracker) recheck() {
	if len(t.muted) == 0 || time.Since(t.checked) < muteCheck {
		return
	}
	t.checked = time.Now()
	for ino := range t.muted {
		if t.muter.Mute(ino) {
			continue
		}
		if t.objs.Muted != nil {
			t.objs.Muted.Delete(ino)
		}
		delete(t.muted, ino)
	}
	t.nmuted.Store(int64(len(t.muted)))
}

// Follow makes a tracker started by StartFollowing deliver inode ino's
// events from now on; pages the kernel already held are not reported.
// It fails once the tracker follows as many files as its map holds (the
// file is then not followed). A tracker started by Start follows every
// file already.
func (t *Tracker) Follow(ino uint64) error {
	if !t.chosen {
		return nil
	}
	t.fmu.Lock()
	defer t.fmu.Unlock()
	if _, ok := t.followed[ino]; ok || t.closed {
		return nil
	}
	if err := t.objs.Followed.Put(ino, uint8(1)); err != nil {
		return fmt.Errorf("pagecache: following inode %d (%d files followed): %w", ino, len(t.followed), err)
	}
	t.followed[ino] = struct{}{}
	return nil
}

// Unfollow stops Follow's events of inode ino: for a file that is gone,
// whose pages the kernel dropped (and reported) before. Events already in
// the ring are still delivered.
func (t *Tracker) Unfollow(ino uint64) {
	t.fmu.Lock()
	defer t.fmu.Unlock()
	if _, ok := t.followed[ino]; !ok || t.closed {
		return
	}
	t.objs.Followed.Delete(ino)
	delete(t.followed, ino)
}

// FollowedFiles returns how many files Follow named and Unfollow did not
// (0 for a tracker that follows every file).
func (t *Tracker) FollowedFiles() int {
	t.fmu.Lock()
	defer t.fmu.Unlock()
	return len(t.followed)
}

// MutedFiles returns how many files' events are muted now.
func (t *Tracker) MutedFiles() int { return int(t.nmuted.Load()) }

// Lost reports events dropped in the kernel because the ring was full;
// after a loss Host View may miss pages (a redundant prefetch) or keep
// dropped ones (a missed prefetch) until the pages change again.
func (t *Tracker) Lost() uint64 { return t.counter(0) }

func (t *Tracker) counter(i uint32) uint64 {
	var per []uint64
	if err := t.objs.Counters.Lookup(i, &per); err != nil {
		return 0
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}

// Sync waits until every event emitted before the call has reached the
// sink (tests use it after reading or dropping caches).
func (t *Tracker) Sync(ctx context.Context) error {
	want := t.counter(1)
	for {
		if t.Events.Load() >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.done:
			return errors.New("pagecache: tracker closed")
		default:
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
}

// Close detaches the programs and stops delivering events.
func (t *Tracker) Close() error {
	t.once.Do(func() {
		for _, l := range t.links {
			l.Close()
		}
		t.rd.Close()
		<-t.done
		t.fmu.Lock()
		t.closed = true
		t.fmu.Unlock()
		t.closeObjs()
	})
	return nil
}

func (t *Tracker) closeObjs() {
	for _, l := range t.links {
		l.Close()
	}
	t.objs.Close()
}

// DevOf returns the device of the filesystem holding path in the kernel's
// internal encoding (MAJOR<<20 | MINOR), which the tracepoints report;
// stat(2) encodes it differently.
func DevOf(path string) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return uint32(unix.Major(st.Dev)<<20 | unix.Minor(st.Dev)), nil
}
