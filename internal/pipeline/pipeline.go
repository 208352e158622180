// Package pipeline is the client half shared by pd3's request/response
// protocols (memnode, page server): many goroutines issue tagged requests on
// one connection, their bytes are combined into few writes, one reader
// goroutine matches responses to callers by tag, and a failed connection
// fails every call that was in flight instead of leaving it hanging.
//
// Ownership: a Call belongs to its issuer until Send, to the session while in
// flight, and to the issuer again once Wait returns (Wait recycles it). A
// caller that stops waiting because its context ended abandons the call; the
// session then discards the late response and never touches the caller's
// buffers again.
//
// A call with a completion function (Fn) is never waited for: the session
// runs Fn on its reader goroutine when the response has been read (or on
// the goroutine that breaks the session) and recycles the call afterwards.
// That saves the hand-off to a parked caller — a futex wake and a context
// switch per request when callers are few — at the price that Fn must not
// block: it delays every response behind it.
//
// The steady state allocates nothing per request: calls are pooled, headers
// are written into a reused buffer, and payloads are read straight into the
// caller's destination.
package pipeline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/sockio"
)

// Header describes one decoded response header.
type Header struct {
	Tag        uint32
	Status     uint16
	PayloadLen int
}

// Protocol is what a session needs to know about a wire format.
type Protocol interface {
	// PutTag writes tag into the request header hdr.
	PutTag(hdr []byte, tag uint32)
	// ReadHeader reads and decodes one response header. An error is fatal
	// to the connection.
	ReadHeader(r *bufio.Reader) (Header, error)
}

const (
	idxBits = 16
	// MaxInFlight is the most requests one session can have outstanding.
	MaxInFlight = 1 << idxBits

	stPending   = 0
	stReceiving = 1
	stAbandoned = 2

	sigNone   = 0
	sigDone   = 1
	sigParked = 2
)

// Call is one request in flight and, when done, its result.
type Call struct {
	// Dst receives the response payload after the first len(Head) bytes.
	Dst []byte
	// HeadLen is how many leading payload bytes go to Head instead of Dst.
	HeadLen int
	// Head holds the first HeadLen payload bytes (a key, a result word).
	Head [16]byte
	// KeepExtra asks for payload beyond Head and Dst to be kept in Extra
	// (control responses such as lists); otherwise it is discarded.
	KeepExtra bool
	Extra     []byte

	// Status and N are the response's status and payload length.
	Status uint16
	N      int

	// Fn, if set, completes the call instead of Wait (see the package
	// doc); Arg is the caller's, for Fn to use (a func or a pointer, so
	// storing it does not allocate).
	Fn  func(*Call)
	Arg any

	err   error
	state atomic.Uint32
	// signal tells a waiter its call is complete: the session stores
	// sigDone; a waiter that finds sigNone stores sigParked and blocks on
	// done, which the session then sends on. A waiter that comes after the
	// response (the usual case with many calls in flight) touches no
	// channel (docs/decisions.md, 21).
	signal atomic.Uint32
	done   chan struct{}
	s      *Session
}

// Options tune a session.
type Options struct {
	// OpTimeout: when requests are outstanding and nothing has been
	// received for this long, the connection is declared dead and every
	// call fails. Zero means 30s.
	OpTimeout time.Duration
	// MaxInFlight bounds outstanding requests (default and maximum
	// MaxInFlight); Send blocks while the bound is reached.
	MaxInFlight int
	// ReadBuf is the reader's buffer size (default 256 KiB).
	ReadBuf int
	// MaxPending bounds the bytes waiting to be written (default 8 MiB).
	MaxPending int
	// Busy, if set, is asked before the reader waits for responses: while
	// it is lone, with a poll place free, the reader waits in poll(2) (a
	// lone request's answer wakes it directly), else in the network
	// poller (sockio.Reader.DirectIf). nil always waits in poll(2).
	// Either way, a reader that has woken a caller waiting in Wait since
	// its last wait parks in the network poller.
	Busy *sockio.Busy
	// Cork, if set, is shared by the sessions of one host: while a
	// front end holds it, requests wait for its release and leave
	// together (Cork).
	Cork *Cork
}

// ErrTimeout is wrapped by the error of calls failed by the watchdog.
var ErrTimeout = errors.New("no response within the operation timeout")

// Session runs one connection.
type Session struct {
	nc    net.Conn
	proto Protocol
	opt   Options
	pool  sync.Pool

	calls *Table[Call]

	w *BatchWriter
	// fast is the reader's sockio.Reader (nil if nc is not a socket it
	// can wait on): the reader goroutine's alone, but for its counters.
	fast *sockio.Reader

	// progress counts responses read and the starts of work (a first call
	// in flight); the watchdog times the silence between its changes. A
	// count, not a timestamp (docs/decisions.md, 21).
	progress atomic.Uint64
	closed   chan struct{}
	wg       sync.WaitGroup
}

// New starts a session on nc; its reader and watchdog run until Close or a
// connection failure.
func New(nc net.Conn, p Protocol, opt Options) *Session {
	if opt.OpTimeout <= 0 {
		opt.OpTimeout = 30 * time.Second
	}
	if opt.MaxInFlight <= 0 || opt.MaxInFlight > MaxInFlight {
		opt.MaxInFlight = MaxInFlight
	}
	if opt.ReadBuf <= 0 {
		opt.ReadBuf = 256 << 10
	}
	if opt.MaxPending <= 0 {
		opt.MaxPending = 8 << 20
	}
	s := &Session{nc: nc, proto: p, opt: opt, calls: NewTable[Call](opt.MaxInFlight), closed: make(chan struct{}), fast: sockio.NewReader(nc)}
	s.w = NewBatchWriter(nc, opt.MaxPending, func(err error) { s.fail(fmt.Errorf("writing request: %w", err)) })
	if s.fast != nil {
		s.fast.Client()
	}
	s.calls.OnAwait(func(on bool) {
		if s.fast != nil {
			s.fast.Awaiting(on)
		}
		opt.Busy.Await(on)
	})
	s.pool.New = func() any { return &Call{done: make(chan struct{}, 1)} }
	s.wg.Add(2)
	go s.readLoop()
	go s.watchdog()
	return s
}

// Get returns a clean call from the session's pool.
func (s *Session) Get() *Call {
	c := s.pool.Get().(*Call)
	c.s = s
	return c
}

func (s *Session) put(c *Call) {
	c.Dst, c.HeadLen, c.KeepExtra, c.Extra = nil, 0, false, nil
	c.Fn, c.Arg = nil, nil
	c.Status, c.N, c.err = 0, 0, nil
	c.state.Store(stPending)
	c.signal.Store(sigNone)
	s.pool.Put(c)
}

// Writer exposes the session's batch writer (for its counters).
func (s *Session) Writer() *BatchWriter { return s.w }

// Err reports the error that broke the session, or nil while it is healthy.
func (s *Session) Err() error { return s.calls.Err() }

// Send registers c, queues hdr and payload for the writer (hdr's tag is
// filled in), and returns without waiting. On error c has been recycled.
func (s *Session) Send(c *Call, hdr, payload []byte) error {
	tag, inFlight, err := s.register(c)
	if err != nil {
		s.put(c)
		return err
	}
	buf, err := s.w.Begin()
	if err != nil {
		return nil // the session is failing; c completes through the table
	}
	start := len(buf)
	buf = append(buf, hdr...)
	// Tag the copy, not hdr: hdr then stays on the caller's stack.
	s.proto.PutTag(buf[start:], tag)
	if s.opt.Cork.holding() {
		s.w.EndLater(append(buf, payload...))
		s.opt.Cork.add(s.w)
		return nil
	}
	s.w.EndInFlight(append(buf, payload...), inFlight)
	return nil
}

// register puts c in the tag table; inFlight counts the calls in flight,
// c included.
func (s *Session) register(c *Call) (tag uint32, inFlight int, err error) {
	tag, inFlight, err = s.calls.Register(c)
	if err == nil && inFlight == 1 {
		// The watchdog measures silence from the moment work exists.
		s.progress.Add(1)
	}
	return tag, inFlight, err
}

// fail breaks the session: the connection is closed and every call in flight
// completes with err.
func (s *Session) fail(err error) {
	calls, first := s.calls.Fail(err)
	if !first {
		return
	}
	s.w.Fail(err)
	sockio.Close(s.nc) // the reader may be blocked in poll(2)
	for _, c := range calls {
		if c.state.CompareAndSwap(stPending, stReceiving) {
			c.err = err
			s.complete(c)
		} else {
			s.put(c)
		}
	}
}

// complete hands a finished call to its waiter, or runs its Fn and
// recycles it; woke reports whether a waiter blocked in Wait was readied.
func (s *Session) complete(c *Call) (woke bool) {
	if c.Fn == nil {
		if c.signal.Swap(sigDone) == sigParked {
			c.done <- struct{}{}
			return true
		}
		return false
	}
	c.Fn(c)
	s.put(c)
	return false
}

// Err is the transport error a call failed with (nil if a response
// arrived); for Fn, which cannot get it from Wait.
func (c *Call) Err() error { return c.err }

// Close breaks the session with err (ErrClosed-like) and waits for its
// goroutines.
func (s *Session) Close(err error) {
	s.fail(err)
	select {
	case <-s.closed:
	default:
		close(s.closed)
	}
	s.w.Close()
	s.wg.Wait()
}

func (s *Session) readLoop() {
	defer s.wg.Done()
	// The reader waits in poll(2) (while Lone says so): a response wakes
	// this thread directly and completes its call with no scheduler hop
	// (see sockio). Except right after it woke a caller blocked in Wait,
	// which would find this thread's P held (sockio.Reader.Handed;
	// docs/decisions.md, 13).
	var rd io.Reader = s.nc
	if s.fast != nil {
		s.fast.DirectIf(s.opt.Busy)
		rd = s.fast
	}
	cr := &capReader{r: rd}
	r := bufio.NewReaderSize(cr, s.opt.ReadBuf)
	for {
		h, err := s.proto.ReadHeader(r)
		if err != nil {
			s.fail(fmt.Errorf("reading response: %w", err))
			return
		}
		s.progress.Add(1)
		c := s.calls.Take(h.Tag)
		if c == nil {
			s.fail(fmt.Errorf("response for unknown tag %#x", h.Tag))
			return
		}
		if !c.state.CompareAndSwap(stPending, stReceiving) {
			// Abandoned by its caller: drop the payload, in fills as
			// large as the buffer (not capped after a direct payload).
			cr.limit = 0
			if _, err := r.Discard(h.PayloadLen); err != nil {
				s.fail(fmt.Errorf("reading response: %w", err))
				return
			}
			s.put(c)
			continue
		}
		c.Status, c.N = h.Status, h.PayloadLen
		if err := readPayload(r, cr, c, h.PayloadLen); err != nil {
			c.err = fmt.Errorf("reading response: %w", err)
			s.complete(c)
			s.fail(c.err)
			return
		}
		if s.complete(c) && s.fast != nil {
			s.fast.Handed()
		}
	}
}

// directPayload is the destination size from which a payload is read
// from the connection straight into its destination, past r's buffer:
// through the buffer every byte of a stream's 256 KiB runs was copied
// twice (docs/decisions.md, 22).
const directPayload = 64 << 10

// afterDirect bounds the read that follows a direct payload: enough for
// the next response's header, so that a large payload behind it is not
// taken into r's buffer by the fill that reads the header.
const afterDirect = 64

// capReader is the connection beneath a session's bufio.Reader: with
// limit set, a fill reads no more than limit bytes.
type capReader struct {
	r     io.Reader
	limit int
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.limit > 0 && len(p) > c.limit {
		p = p[:c.limit]
	}
	return c.r.Read(p)
}

// readPayload reads the n-byte payload of c's response from r; a large
// destination takes what r holds of it and the rest from the connection
// (cr.r) directly.
func readPayload(r *bufio.Reader, cr *capReader, c *Call, n int) error {
	h := min(n, c.HeadLen)
	if _, err := io.ReadFull(r, c.Head[:h]); err != nil {
		return err
	}
	n -= h
	d := min(n, len(c.Dst))
	if d >= directPayload {
		from := min(d, r.Buffered())
		if _, err := io.ReadFull(r, c.Dst[:from]); err != nil {
			return err
		}
		if _, err := io.ReadFull(cr.r, c.Dst[from:d]); err != nil {
			return err
		}
		cr.limit = afterDirect // large payloads come in runs
	} else {
		cr.limit = 0
		if _, err := io.ReadFull(r, c.Dst[:d]); err != nil {
			return err
		}
	}
	n -= d
	if n == 0 {
		return nil
	}
	if c.KeepExtra {
		c.Extra = make([]byte, n)
		_, err := io.ReadFull(r, c.Extra)
		return err
	}
	_, err := r.Discard(n)
	return err
}

func (s *Session) watchdog() {
	defer s.wg.Done()
	// Silence is timed from the first tick that saw the count where it
	// stopped, up to a period after the last response: a short period
	// keeps a timeout within 1.125 × OpTimeout of it.
	period := max(s.opt.OpTimeout/8, time.Millisecond)
	t := time.NewTicker(period)
	defer t.Stop()
	last, quiet := s.progress.Load(), time.Now()
	for {
		select {
		case <-s.closed:
			return
		case now := <-t.C:
			pending, broken := s.calls.Pending(), s.calls.Err() != nil
			if broken {
				return
			}
			if p := s.progress.Load(); p != last || pending == 0 {
				last, quiet = p, now
				continue
			}
			if now.Sub(quiet) >= s.opt.OpTimeout {
				s.fail(fmt.Errorf("%w (%v, %d requests outstanding)", ErrTimeout, s.opt.OpTimeout, pending))
				return
			}
		}
	}
}

// Wait blocks until c completes or ctx ends, then recycles c. On success the
// response fields (Status, N, Head, Dst, Extra) were read before recycling
// by the done callback; use WaitFn to inspect them.
func (c *Call) Wait(ctx context.Context) error {
	return c.WaitFn(ctx, nil)
}

// WaitFn is Wait with a callback that sees the completed call before it is
// recycled; its return value becomes Wait's when the transport succeeded.
func (c *Call) WaitFn(ctx context.Context, fn func(*Call) error) error {
	s := c.s
	if c.signal.Load() != sigDone && c.signal.CompareAndSwap(sigNone, sigParked) {
		select {
		case <-c.done:
		case <-ctx.Done():
			if c.state.CompareAndSwap(stPending, stAbandoned) {
				return ctx.Err()
			}
			<-c.done // the session is completing it and will send
		}
	}
	err := c.err
	if err == nil && fn != nil {
		err = fn(c)
	}
	s.put(c)
	return err
}
