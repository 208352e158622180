// Package sockio waits for a socket's input the way a C server does: the
// goroutine that owns a connection blocks its thread in poll(2) on that
// one socket and then reads, instead of parking in Go's network poller.
//
// Why: on the paths where pd3 answers one request at a time (a memory-node
// READ of resident memory, a host's miss at queue depth 1), the network
// poller costs more than the work. Measured on the 2-vCPU test VMs at
// queue depth 1, a memory node serving one READ made about 7 syscalls and
// 3 context switches (a non-blocking and a blocking epoll_pwait, a read
// that found nothing, futex wake-ups of an idle thread to spin for work)
// where nbdkit makes 3 and 1. Blocked in poll(2), the thread is woken by
// the kernel directly when the bytes arrive and, if it still has its P,
// goes on with no scheduler involvement: poll, read, write.
//
// The cost: a thread blocked here holds its P while other goroutines may
// want it; the runtime's monitor takes the P back when they do, or when
// no P is idle (within its 20 µs–10 ms period), so other work is
// delayed, never stopped. A retaken thread, woken by its socket, must
// find a P again: with as many threads blocked here as Ps, it parks and
// another thread runs it, a wake-up more (docs/ARCHITECTURE.md). Use it
// for a few connections that carry most of a process's work, not for
// every connection of a busy server; a server whose load varies waits
// this way only while it serves one request (DirectIf with Busy).
//
// A blocked poll holds the socket's descriptor, so closing the connection
// must first shut its reading side down (Close does both); a connection
// closed by plain net.Conn.Close while a Reader is blocked stays blocked
// until its peer sends or hangs up.
//
// This is the only package besides internal/shm that makes raw syscalls.
package sockio

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reader reads a socket, waiting in poll(2) instead of the network
// poller. It is for the one goroutine that owns the connection's reading.
// Until Direct is called it reads through nc (the network poller, which
// honours read deadlines, as a handshake wants).
type Reader struct {
	nc     net.Conn
	raw    syscall.RawConn
	direct bool
	// drained: the last read did not fill its buffer, so the socket was
	// empty then; the next Read waits first instead of making a read
	// that would find nothing.
	drained bool

	// Wakeups counts returns from poll(2): an idle connection makes none
	// (nothing here polls on a timer).
	Wakeups atomic.Uint64

	// spin: how long a drained Read keeps trying before it sleeps;
	// spinners, if set, bounds how many Readers spin at once.
	spin     time.Duration
	spinners *Spinners
	// cold: the owner expects its next input late (Cold); no spin.
	cold bool
	// gap: how long the last drained Read waited for its input. A Read
	// spins only when that gap was within the window: a peer whose
	// requests come further apart than the window would find the spin
	// over every time, and each spin would burn its window of CPU for
	// nothing (docs/decisions.md, 9).
	gap time.Duration
	// busy, if set, is asked before each wait whether the thread may wait
	// in poll(2) (DirectIf): only while the process serves one request at
	// most, and only with one of its poll places; else it parks in the
	// network poller.
	busy *Busy
	// handed: the owner readied a goroutine since the last wait (Handed).
	handed bool
	// client: the connection carries a client's calls and answers
	// (Client); awaiting: it has answers outstanding (Awaiting).
	client   bool
	awaiting atomic.Bool
	// fromPoller: the last wait was in the network poller, so this
	// thread may be the one that polled the network for the process
	// (Busy.Await).
	fromPoller bool
	// Spins counts the attempts made while spinning: an idle connection
	// adds none once its window has passed.
	Spins atomic.Uint64

	// The arguments and results of the syscalls made through raw live
	// here, and the functions raw calls are bound once: a closure over
	// them would be allocated by every read and every wait.
	p      []byte
	n      int
	rerr   error
	fds    [1]unix.PollFd
	readFD func(fd uintptr) bool
	pollFD func(fd uintptr)
}

// Spin makes a Read that finds the socket drained keep trying for up to
// d, yielding between attempts, before it sleeps in poll(2): a peer that
// sends its next request within d is served without a wake-up (on the
// test VMs a wake-up costs 10-25 µs, a memory node's READ 1 µs). Each
// window follows input, so a connection that goes quiet spins once, for
// d, and then sleeps: idle stays idle. A Read spins only if the input
// before it came within d of the Read that waited for it: a peer that
// paces its requests further apart (a client whose round trip is longer
// than d) is waited for in poll(2) until it speeds up again. d <= 0 never
// spins. With b, the
// Reader spins only while it holds one of b's places and otherwise
// sleeps at once, so many connections of one process cannot fill the
// cores with spinners. Call it before the first Read, from the reading
// goroutine.
func (r *Reader) Spin(d time.Duration, b *Spinners) { r.spin, r.spinners = d, b }

// Cold tells a spinning Reader whether its next input will be late: a
// server that handed its last request to a slower stage (a host whose
// read missed and went to a memory node) leaves the core to that stage
// instead of spinning through its wait. Call it from the reading
// goroutine.
func (r *Reader) Cold(cold bool) { r.cold = cold }

// Spinners bounds how many Readers spin at the same moment (the places
// of Spin). The zero value has one place: a process's spinner never
// competes with another of its own for a core.
type Spinners struct {
	// Max is the number of places; 0 means 1.
	Max  int32
	used atomic.Int32
}

func (b *Spinners) take() bool {
	if b.used.Add(1) <= max(b.Max, 1) {
		return true
	}
	b.used.Add(-1)
	return false
}

func (b *Spinners) give() { b.used.Add(-1) }

// Direct makes every later Read wait in poll(2); read deadlines no longer
// apply. Call it from the reading goroutine.
func (r *Reader) Direct() { r.direct = true }

// DirectIf is Direct for the waits at which b allows it: b.Lone (the
// process serves one request at most) and a free poll place of b. At the
// others Read parks in the network poller and leaves the thread's P to
// the process at once. A thread blocked in poll(2) keeps its P until the
// runtime's monitor takes it back, so under load the goroutines it could
// run wait 20 µs or more, and the hand-off and the return each cost a
// thread wake-up; and with as many threads blocked as the process has Ps,
// whatever the awaited answer readies (a memory node's reply on another
// connection) waits up to the monitor's 10 ms for a P. A nil b is
// Direct. Call it from the reading goroutine.
func (r *Reader) DirectIf(b *Busy) { r.direct, r.busy = true, b }

// Handed tells a direct Reader that its owner has readied another
// goroutine since its last wait (handed it a request, or a response it
// waits for): the next wait is in the network poller, whatever lone says.
// The readied goroutine is queued on this thread's P, which a thread
// blocked in poll(2) keeps; it would wait for the monitor's retake
// whenever no other P is idle (in a FUSE server, whose readers hold
// theirs in read(2), always). Call it from the reading goroutine.
func (r *Reader) Handed() { r.handed = true }

// Client marks the Reader as a client's: its connection carries answers
// to calls the process made (Awaiting says when some are outstanding).
// Call it before the first Read.
func (r *Reader) Client() { r.client = true }

// Awaiting tells a client's Reader whether its connection has answers
// outstanding; the owner counts the same in the Busy (Busy.Await). Safe
// from any goroutine.
func (r *Reader) Awaiting(on bool) { r.awaiting.Store(on) }

// Busy counts the requests a process is serving, for DirectIf: its
// front ends add each request from reading it to queueing its reply. It
// also bounds the Readers of the process blocked in poll(2) at once to
// one fewer than its Ps (at least one): a P always stays free for the
// goroutine an answer readies. Without that bound, idle NBD connections
// of one client (multi-conn: nbdfuse opens four) each held a P in
// poll(2) while the one request in flight waited for the memory node's
// reply to find a P: 4 KiB reads through nbdfuse at four threads took
// 2.5 ms instead of 0.1 (docs/decisions.md, 4).
// A nil *Busy counts nothing, is always lone and bounds nothing.
type Busy struct {
	n     atomic.Int32
	conns atomic.Int32 // client connections being served (AddConn)
	polls atomic.Int32 // Readers blocked in poll(2)
	max   atomic.Int32 // places; 0 until first used
	// awaited: client connections with answers outstanding (Await);
	// parked: servers' Readers waiting in the network poller.
	awaited atomic.Int32
	parked  atomic.Int32
	nudges  atomic.Uint64 // nudge calls
}

// Await adds (on) or removes a client connection with answers
// outstanding (Reader.Awaiting): while one is counted, a Reader back from
// the network poller nudges before it waits in poll(2).
func (b *Busy) Await(on bool) {
	if b == nil {
		return
	}
	if on {
		b.awaited.Add(1)
	} else {
		b.awaited.Add(-1)
	}
}

// Awaited is the number of client connections with answers outstanding.
func (b *Busy) Awaited() int {
	if b == nil {
		return 0
	}
	return int(b.awaited.Load())
}

// Nudges counts the waits in poll(2) that first woke a thread to poll
// the network (Await).
func (b *Busy) Nudges() uint64 {
	if b == nil {
		return 0
	}
	return b.nudges.Load()
}

// Parked is the number of servers' Readers waiting in the network poller.
func (b *Busy) Parked() int {
	if b == nil {
		return 0
	}
	return int(b.parked.Load())
}

// othersWait reports whether a connection other than r's waits in the
// network poller for input that matters (Await).
func (b *Busy) othersWait(r *Reader) bool {
	if b == nil {
		return false
	}
	n := b.awaited.Load()
	if r.client && r.awaiting.Load() {
		n--
	}
	return n > 0 || b.parked.Load() > 0
}

// nudge makes sure a thread other than the caller's polls the network,
// for a Reader back from the network poller about to wait in poll(2)
// while another connection of its Busy waits in the poller for input
// that matters (a client's answers outstanding, or a server's next
// request: its Reader parked). Woken by the poller, the Reader's thread
// may be the one that polled the network for the process, the other Ps'
// threads asleep: blocked in poll(2), it would leave the network
// unpolled until Go's monitor polls it, every 10 ms (the monitor takes
// the thread's P back only when no P is idle). Those were the 10-12 ms
// waits of a host reading from two memory nodes at once and the 12 ms
// tails of its NBD reads at depth 32 over two nodes (docs/decisions.md,
// 27). Starting a goroutine wakes a thread for an idle P (the runtime's
// wakep), and that thread, finding nothing else to run, polls the
// network until there is. A Reader woken from poll(2) was not the poller
// and needs no nudge.
func (b *Busy) nudge() {
	b.nudges.Add(1)
	go nop()
}

func nop() {}

// AddConn adds d to the client connections the process serves (1 as one
// starts sending requests, -1 as it ends). With more than one the process
// is never lone: each connection's reader would wait in poll(2) between
// its own requests while another's request needs the P it holds (two
// NBD connections at one 4 KiB read each: 2 600 reads/s and stalls of
// 20 ms, against 13 500 and 2 ms in the network poller; docs/decisions.md, 4).
func (b *Busy) AddConn(d int32) {
	if b != nil {
		b.conns.Add(d)
	}
}

// Add adds d (1 as a request is read, -1 as its reply is queued).
func (b *Busy) Add(d int32) {
	if b != nil {
		b.n.Add(d)
	}
}

// Count is the number of requests being served.
func (b *Busy) Count() int {
	if b == nil {
		return 0
	}
	return int(b.n.Load())
}

// Lone reports whether at most one request is being served, for one
// client connection at most: the input a reader waits for is then the
// next thing the process does, and waiting in poll(2) saves the
// scheduler's wake-ups.
func (b *Busy) Lone() bool { return b == nil || b.n.Load() <= 1 && b.conns.Load() <= 1 }

// Polls is the number of Readers blocked in poll(2) now.
func (b *Busy) Polls() int {
	if b == nil {
		return 0
	}
	return int(b.polls.Load())
}

// takePoll reserves a place to block in poll(2).
func (b *Busy) takePoll() bool {
	if b == nil {
		return true
	}
	m := b.max.Load()
	if m == 0 {
		// GOMAXPROCS when first asked; a governor that lowers it later
		// (procgov) leaves one place, which is what one P allows.
		m = int32(max(1, runtime.GOMAXPROCS(0)-1))
		b.max.Store(m)
	}
	if b.polls.Add(1) <= m {
		return true
	}
	b.polls.Add(-1)
	return false
}

func (b *Busy) givePoll() {
	if b != nil {
		b.polls.Add(-1)
	}
}

// NewReader returns a Reader for nc, or nil if nc is not a socket this
// package can wait on (then read nc itself).
func NewReader(nc net.Conn) *Reader {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nil // TLS and other wrappers read through their own layer
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &Reader{nc: nc, raw: raw}
	r.readFD, r.pollFD = r.read, r.poll
	return r
}

// Read reads at least one byte into p, waiting for input in poll(2).
func (r *Reader) Read(p []byte) (int, error) {
	if !r.direct {
		return r.nc.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if r.drained && r.spin > 0 && !r.cold {
		start := time.Now()
		n, err := r.waitRead(p, r.gap <= r.spin)
		r.gap = time.Since(start)
		return n, err
	}
	return r.waitRead(p, false)
}

// waitRead is Read once it knows whether it may spin first.
func (r *Reader) waitRead(p []byte, spin bool) (int, error) {
	if r.drained && (r.handed || !r.busy.Lone()) {
		return r.pollerRead(p)
	}
	if r.drained && spin {
		if n, err := r.spinRead(p); n > 0 || err != nil {
			r.drained = n < len(p)
			return n, err
		}
	}
	if !r.drained {
		if n, err := r.TryRead(p); n > 0 || err != nil {
			r.drained = n < len(p)
			return n, err
		}
	}
	// A read that filled its buffer left the socket unread, so the wait
	// comes only now; the same rules apply to it.
	if r.handed || !r.busy.Lone() || !r.busy.takePoll() {
		return r.pollerRead(p)
	}
	if r.fromPoller && r.busy.othersWait(r) {
		r.busy.nudge()
	}
	defer r.busy.givePoll()
	for {
		if err := r.Wait(); err != nil {
			return 0, err
		}
		r.fromPoller = false
		n, err := r.TryRead(p)
		if n > 0 || err != nil {
			r.drained = n < len(p)
			return n, err
		}
	}
}

// pollerRead reads through the network poller.
func (r *Reader) pollerRead(p []byte) (int, error) {
	r.handed, r.fromPoller = false, true
	server := !r.client && r.busy != nil
	if server {
		r.busy.parked.Add(1)
	}
	n, err := r.nc.Read(p)
	if server {
		r.busy.parked.Add(-1)
	}
	r.drained = n < len(p)
	return n, err
}

// spinRead tries to read p until input arrives or the spin window ends
// (0, nil).
func (r *Reader) spinRead(p []byte) (int, error) {
	if r.spinners != nil {
		if !r.spinners.take() {
			return 0, nil
		}
		defer r.spinners.give()
	}
	end := time.Now().Add(r.spin)
	for {
		n, err := r.TryRead(p)
		r.Spins.Add(1)
		if n > 0 || err != nil || time.Now().After(end) {
			return n, err
		}
		// Give way to the process's other goroutines, then the core to
		// whoever else can run on it (the peer, on a machine with few
		// cores): a spinner must not delay what it waits for.
		runtime.Gosched()
		syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// TryRead makes one non-blocking read attempt: 0, nil means nothing was
// waiting.
func (r *Reader) TryRead(p []byte) (int, error) {
	r.p = p
	err := r.raw.Read(r.readFD)
	n, rerr := r.n, r.rerr
	r.p, r.rerr = nil, nil
	if err != nil {
		return 0, err
	}
	switch {
	case rerr == syscall.EAGAIN:
		return 0, nil
	case rerr != nil:
		return 0, &net.OpError{Op: "read", Net: r.nc.LocalAddr().Network(), Source: r.nc.LocalAddr(), Addr: r.nc.RemoteAddr(), Err: rerr}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (r *Reader) read(fd uintptr) bool {
	for {
		r.n, r.rerr = syscall.Read(int(fd), r.p)
		if r.rerr != syscall.EINTR {
			return true
		}
	}
}

// Wait blocks until the socket has input, has hung up or has failed.
func (r *Reader) Wait() error {
	err := r.raw.Control(r.pollFD)
	perr := r.rerr
	r.rerr = nil
	if err == nil {
		err = perr
	}
	return err
}

func (r *Reader) poll(fd uintptr) {
	r.fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}
	for {
		_, r.rerr = unix.Poll(r.fds[:], -1)
		if r.rerr != unix.EINTR {
			r.Wakeups.Add(1)
			return
		}
	}
}

// Close shuts nc's reading side down, which wakes a Reader blocked in
// Wait, and closes nc.
func Close(nc net.Conn) error {
	if cr, ok := nc.(interface{ CloseRead() error }); ok {
		cr.CloseRead()
	}
	return nc.Close()
}

// Writer makes non-blocking write attempts on a socket, for a producer
// that must never wait for the network (it is on another request's path)
// and hands what the socket does not take to a goroutine that may. One
// goroutine at a time may write (the owner of a BatchWriter's write side).
type Writer struct {
	raw syscall.RawConn
	// As Reader's: no closure per write.
	p       []byte
	n       int
	werr    error
	writeFD func(fd uintptr) bool
	// TryWrite2's two buffers, kept here so a call allocates nothing.
	iov      [2]unix.Iovec
	writevFD func(fd uintptr) bool
}

// NewWriter returns a Writer for nc, or nil if nc is not a socket.
func NewWriter(nc io.Writer) *Writer {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &Writer{raw: raw}
	w.writeFD, w.writevFD = w.write, w.writev
	return w
}

// TryWrite makes one non-blocking write attempt of p: it returns how much
// the socket took (0, nil when it is full).
func (w *Writer) TryWrite(p []byte) (int, error) {
	w.p = p
	err := w.raw.Write(w.writeFD)
	n, werr := w.n, w.werr
	w.p, w.werr = nil, nil
	if err == nil {
		err = werr
	}
	if err == syscall.EAGAIN {
		return 0, nil
	}
	return max(n, 0), err
}

// TryWrite2 is TryWrite of a followed by b, in one writev(2): a frame's
// header and a large payload leave together without being copied into
// one buffer first. Neither may be empty.
func (w *Writer) TryWrite2(a, b []byte) (int, error) {
	w.iov[0].Base, w.iov[1].Base = &a[0], &b[0]
	w.iov[0].SetLen(len(a))
	w.iov[1].SetLen(len(b))
	err := w.raw.Write(w.writevFD)
	n, werr := w.n, w.werr
	w.iov[0].Base, w.iov[1].Base, w.werr = nil, nil, nil
	if err == nil {
		err = werr
	}
	if err == syscall.EAGAIN {
		return 0, nil
	}
	return max(n, 0), err
}

func (w *Writer) writev(fd uintptr) bool {
	for {
		n, _, errno := syscall.Syscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(len(w.iov)))
		w.n, w.werr = int(n), nil
		if errno != 0 {
			w.n, w.werr = -1, errno
		}
		if w.werr != syscall.EINTR {
			return true
		}
	}
}

func (w *Writer) write(fd uintptr) bool {
	for {
		w.n, w.werr = syscall.Write(int(fd), w.p)
		if w.werr != syscall.EINTR {
			return true
		}
	}
}
