package memnode

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/pageid"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// Token is sent in HELLO.
	Token string
	// TLS, if set, makes the connection start with a TLS handshake (the
	// node must serve TLS: Server.TLS); Certificates in it make the link
	// mutual. An empty ServerName is taken from the address's host
	// ("localhost" for a unix socket). nil speaks in clear.
	TLS *tls.Config
	// DialTimeout bounds connecting and the HELLO exchange (default 5s).
	DialTimeout time.Duration
	// OpTimeout: a connection with requests outstanding and no response for
	// this long is declared dead and its requests fail (default 30s).
	OpTimeout time.Duration
	// MaxInFlight bounds outstanding requests (default 16384).
	MaxInFlight int
	// Stages, if set, is stamped as a READ with a completion function is
	// issued (the miss-path breakdown); nil in production.
	Stages *stages.Recorder
	// Busy, if set, is the host's front ends' count of requests in
	// service: while it is lone (one request at most) and has a poll
	// place free, the reader waits for responses in poll(2), otherwise in
	// the network poller (pipeline.Options.Busy). nil always waits in
	// poll(2).
	Busy *sockio.Busy
	// Cork, if set, is the host's: while a front end holds it, requests
	// wait for its release and leave with the others for this node
	// (pipeline.Cork).
	Cork *pipeline.Cork
}

// Client talks to one memory node. It is safe for concurrent use: requests
// from all goroutines are pipelined on one connection. When the connection
// breaks, requests in flight fail with pageid.ErrUnavailable and the next request
// redials.
type Client struct {
	addr string
	opt  ClientOptions

	mu     sync.Mutex // guards sess and closed; held while redialling
	sess   *session
	closed bool

	fences *fences
}

// fences are the fencing tokens a client presents, per volume, in the
// windows it binds (Client.Fence); shared by its sessions, so a redial
// presents them again.
type fences struct {
	mu sync.Mutex
	m  map[uint16]uint64
}

func (f *fences) get(vol uint16) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[vol]
}

func (f *fences) set(vol uint16, token uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[uint16]uint64)
	}
	f.m[vol] = token
}

// session is one connection and the memory windows bound on it: one
// whole-volume window per volume the client has touched, bound by the first
// request for that volume. Windows die with their connection, so a redial
// starts with none.
type session struct {
	*pipeline.Session
	groups [256]atomic.Pointer[[256]atomic.Uint32] // volume id → window key
	next   atomic.Uint32
	fences *fences
}

// window returns the key of the session's window on volume vol, binding
// one first if there is none. The BIND is queued and not waited for: the
// node executes a connection's requests in order, and the key is published
// only once the BIND is queued, so every request that uses it follows it.
func (s *session) window(vol uint16) uint32 {
	slot := s.slot(vol)
	if k := slot.Load(); k != 0 {
		return k
	}
	k := s.next.Add(1)
	pc := s.Get()
	// A failed BIND needs no answer of its own: the requests that use
	// the window fail with the node's reason.
	pc.Fn = func(*pipeline.Call) {}
	if s.bind(pc, vol, k) != nil {
		return k // the session is broken; the request fails with it
	}
	if !slot.CompareAndSwap(0, k) {
		// Another request bound the volume first; its window serves.
		return slot.Load()
	}
	return k
}

func (s *session) slot(vol uint16) *atomic.Uint32 {
	gp := &s.groups[vol>>8]
	g := gp.Load()
	if g == nil {
		gp.CompareAndSwap(nil, new([256]atomic.Uint32))
		g = gp.Load()
	}
	return &g[vol&0xff]
}

// bind sends, as call pc, a BIND of window k over all of volume vol, with
// the client's fencing token for it.
func (s *session) bind(pc *pipeline.Call, vol uint16, k uint32) error {
	var hdr [ReqHeaderSize]byte
	(&ReqHeader{Op: OpBind, Volume: vol, Window: k, PayloadLen: bindPayloadSize}).Encode(hdr[:])
	var p [bindPayloadSize]byte
	binary.LittleEndian.PutUint32(p[8:], AccessAll)
	binary.LittleEndian.PutUint64(p[16:], s.fences.get(vol))
	return s.Send(pc, hdr[:], p[:])
}

// Fence makes token the fencing token this client writes volume vol with,
// and presents it to the node before it returns: from then on the node
// refuses writes to vol from any holder of an older token. Tokens must
// grow with each new holder of the volume (the lease's epoch). It fails
// with pageid.ErrFenced if a newer token was presented already.
func (c *Client) Fence(ctx context.Context, vol uint16, token uint64) error {
	c.fences.set(vol, token)
	s, err := c.session(ctx)
	if err != nil {
		return fmt.Errorf("memnode %v: %w", OpBind, err)
	}
	k := s.next.Add(1)
	pc := s.Get()
	if err := s.bind(pc, vol, k); err != nil {
		return wrapErr(OpBind, err)
	}
	if err := pc.WaitFn(ctx, statusCheck); err != nil {
		return wrapErr(OpBind, err)
	}
	// Later requests use the window that carries the token. The one it
	// replaces stays bound until the connection ends; Fence is rare.
	s.slot(vol).Store(k)
	return nil
}

// stamp puts in a data op's header the key of the session's window on the
// volume it touches; other ops name no window.
func (s *session) stamp(h *ReqHeader) {
	switch h.Op {
	case OpRead, OpWrite, OpTrim, OpCAS, OpFAA, OpMap, OpXor:
		h.Window = s.window(h.Volume)
	case OpPrefetch:
		h.Window = s.window(pageid.Key(h.Offset).Volume())
	}
}

// wireProto adapts the memnode response format to the pipeline.
type wireProto struct{}

func (wireProto) PutTag(hdr []byte, tag uint32) { binary.LittleEndian.PutUint64(hdr[8:], uint64(tag)) }

func (wireProto) ReadHeader(r *bufio.Reader) (pipeline.Header, error) {
	b, err := r.Peek(RespHeaderSize)
	if err != nil {
		return pipeline.Header{}, err
	}
	var h RespHeader
	if err := h.Decode(b); err != nil {
		return pipeline.Header{}, err
	}
	r.Discard(RespHeaderSize)
	if h.Tag > 0xffffffff {
		return pipeline.Header{}, fmt.Errorf("%w: tag %#x", ErrProtocol, h.Tag)
	}
	return pipeline.Header{Tag: uint32(h.Tag), Status: uint16(h.Status), PayloadLen: int(h.PayloadLen)}, nil
}

// Dial connects to the node at addr ("host:port", or "unix:/path") and
// performs HELLO.
func Dial(ctx context.Context, addr string, opt ClientOptions) (*Client, error) {
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = 5 * time.Second
	}
	if opt.MaxInFlight <= 0 {
		opt.MaxInFlight = 16384
	}
	c := &Client{addr: addr, opt: opt, fences: new(fences)}
	s, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.sess = s
	return c, nil
}

// Cork returns the cork the client's requests share (ClientOptions.Cork;
// nil if none): a caller that sends a batch of requests and then waits for
// them holds it over the sending.
func (c *Client) Cork() *pipeline.Cork { return c.opt.Cork }

// RequestWrites counts the write system calls that carried requests on
// the client's current connection (0 before one is made): requests sent
// over it divided by this is the batching achieved.
func (c *Client) RequestWrites() uint64 {
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s == nil {
		return 0
	}
	return s.Writer().Writes.Load()
}

// Addr returns the node's address.
func (c *Client) Addr() string { return c.addr }

func splitAddr(addr string) (network, a string) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return "unix", p
	}
	return "tcp", addr
}

func (c *Client) dial(ctx context.Context) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opt.DialTimeout)
	defer cancel()
	// The caller may hold the cork, and the HELLO below is waited for.
	c.opt.Cork.Suspend()
	defer c.opt.Cork.Resume()
	network, a := splitAddr(c.addr)
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, a)
	if err != nil {
		return nil, fmt.Errorf("dialling memory node %s: %w: %w", c.addr, pageid.ErrUnavailable, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if c.opt.TLS != nil {
		if nc, err = c.startTLS(ctx, nc, network, a); err != nil {
			return nil, err
		}
	}
	s := pipeline.New(nc, wireProto{}, pipeline.Options{OpTimeout: c.opt.OpTimeout, MaxInFlight: c.opt.MaxInFlight, Busy: c.opt.Busy, Cork: c.opt.Cork})
	hello := make([]byte, 4+len(c.opt.Token))
	binary.LittleEndian.PutUint32(hello, Version)
	copy(hello[4:], c.opt.Token)
	call := s.Get()
	call.HeadLen = 8
	var hdr [ReqHeaderSize]byte
	(&ReqHeader{Op: OpHello, PayloadLen: uint32(len(hello))}).Encode(hdr[:])
	if err := s.Send(call, hdr[:], hello); err != nil {
		s.Close(err)
		return nil, fmt.Errorf("HELLO to %s: %w", c.addr, err)
	}
	err = call.WaitFn(ctx, statusCheck)
	if err != nil {
		s.Close(pageid.ErrClosed)
		return nil, fmt.Errorf("HELLO to %s: %w", c.addr, err)
	}
	return &session{Session: s, fences: c.fences}, nil
}

// startTLS runs the client side of the TLS handshake on nc; it closes nc
// when the handshake fails.
func (c *Client) startTLS(ctx context.Context, nc net.Conn, network, addr string) (net.Conn, error) {
	cfg := c.opt.TLS
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = "localhost"
		if host, _, err := net.SplitHostPort(addr); err == nil && network == "tcp" {
			cfg.ServerName = host
		}
	}
	tc := tls.Client(nc, cfg)
	err := tc.HandshakeContext(ctx)
	if err == nil {
		return tc, nil
	}
	nc.Close()
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && rh.RecordHeader[0] == respMagic {
		return nil, fmt.Errorf("TLS handshake with memory node %s: the node answers in clear: it does not serve TLS", c.addr)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
		// Only a transient failure is worth the callers' retries.
		return nil, fmt.Errorf("TLS handshake with memory node %s: %w: %w", c.addr, pageid.ErrUnavailable, err)
	}
	return nil, fmt.Errorf("TLS handshake with memory node %s: %w", c.addr, err)
}

func statusCheck(call *pipeline.Call) error { return Status(call.Status).Err() }

// session returns a healthy session, redialling if the last one broke.
func (c *Client) session(ctx context.Context) (*session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, pageid.ErrClosed
	}
	if c.sess != nil && c.sess.Err() == nil {
		return c.sess, nil
	}
	if c.sess != nil {
		c.sess.Close(pageid.ErrUnavailable)
		c.sess = nil
	}
	s, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.sess = s
	return s, nil
}

// Close closes the connection; requests in flight fail with pageid.ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sess := c.sess
	c.mu.Unlock()
	// Not under c.mu: failing the calls runs their completion functions,
	// which may start requests of their own (they fail with pageid.ErrClosed).
	if sess != nil {
		sess.Close(pageid.ErrClosed)
	}
	return nil
}

// Call is an asynchronous request; Wait must be called exactly once.
type Call struct {
	pc   *pipeline.Call
	err  error
	what Op
}

// DoneCall is a Call that was never sent, finished with err (nil: a
// success). A Remote over other Remotes (replica) returns it for what it
// answers without a request of its own: a refusal, or a read it carried
// out by other means.
func DoneCall(err error) Call { return Call{err: err} }

// Wait blocks for the response and returns the request's error.
func (c Call) Wait(ctx context.Context) error {
	if c.err != nil || c.pc == nil {
		return c.err
	}
	return wrapErr(c.what, c.pc.WaitFn(ctx, statusCheck))
}

// wrapErr names the op and marks transport failures with pageid.ErrUnavailable, so
// callers can tell "the node said no" from "the node could not be reached".
func wrapErr(op Op, err error) error {
	switch {
	case err == nil:
		return nil
	case isNodeErr(err), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, pageid.ErrClosed), errors.Is(err, pageid.ErrUnavailable), errors.Is(err, ErrProtocol):
		return fmt.Errorf("memnode %v: %w", op, err)
	default:
		return fmt.Errorf("memnode %v: %w: %w", op, pageid.ErrUnavailable, err)
	}
}

func isNodeErr(err error) bool {
	for _, e := range statusErrs {
		if e != nil && errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (c *Client) start(ctx context.Context, h *ReqHeader, payload []byte, setup func(*pipeline.Call)) Call {
	if err := ctx.Err(); err != nil {
		// Nothing is sent for a caller that has given up: a write it
		// cannot wait for would be reported neither way.
		return Call{err: fmt.Errorf("memnode %v: %w", h.Op, err), what: h.Op}
	}
	s, err := c.session(ctx)
	if err != nil {
		return Call{err: fmt.Errorf("memnode %v: %w", h.Op, err), what: h.Op}
	}
	s.stamp(h)
	pc := s.Get()
	if setup != nil {
		setup(pc)
	}
	h.PayloadLen = uint32(len(payload))
	var hdr [ReqHeaderSize]byte
	h.Encode(hdr[:])
	if err := s.Send(pc, hdr[:], payload); err != nil {
		return Call{err: wrapErr(h.Op, err), what: h.Op}
	}
	return Call{pc: pc, what: h.Op}
}

// ReadAsync starts reading len(p) bytes at off of volume vol into p.
func (c *Client) ReadAsync(ctx context.Context, vol uint16, off uint64, p []byte) Call {
	if len(p) > MaxIO {
		return Call{err: fmt.Errorf("memnode READ: %w: %d bytes", ErrTooLarge, len(p)), what: OpRead}
	}
	h := ReqHeader{Op: OpRead, Volume: vol, Offset: off, Count: uint32(len(p))}
	return c.start(ctx, &h, nil, func(pc *pipeline.Call) { pc.Dst = p })
}

// ReadFn starts reading len(p) bytes at off of volume vol into p and calls
// done with the result, once: on the connection's reader goroutine when the
// response arrives, on the caller's if the request cannot be sent. done
// must not block (it holds up every response behind it).
func (c *Client) ReadFn(vol uint16, off uint64, p []byte, done func(error)) {
	if len(p) > MaxIO {
		done(fmt.Errorf("memnode READ: %w: %d bytes", ErrTooLarge, len(p)))
		return
	}
	h := ReqHeader{Op: OpRead, Volume: vol, Offset: off, Count: uint32(len(p))}
	c.opt.Stages.Stamp(stages.HostRemoteSent)
	c.startFn(&h, done, readDone, func(pc *pipeline.Call) { pc.Dst = p })
}

// PrefetchFn is PREFETCH by key with a completion function, as ReadFn.
func (c *Client) PrefetchFn(k pageid.Key, page []byte, done func(error)) {
	h := ReqHeader{Op: OpPrefetch, Offset: uint64(k), Count: pageid.Size}
	c.startFn(&h, done, prefetchDone, func(pc *pipeline.Call) { pc.HeadLen, pc.Dst = 8, page[:pageid.Size] })
}

// Static completion functions: no closure is allocated per request; the
// caller's done travels in the call's Arg.
func readDone(pc *pipeline.Call)     { fnDone(OpRead, pc) }
func prefetchDone(pc *pipeline.Call) { fnDone(OpPrefetch, pc) }

func fnDone(op Op, pc *pipeline.Call) {
	err := pc.Err()
	if err == nil {
		err = statusCheck(pc)
	}
	pc.Arg.(func(error))(wrapErr(op, err))
}

func (c *Client) startFn(h *ReqHeader, done func(error), fn func(*pipeline.Call), setup func(*pipeline.Call)) {
	// No context: a call with a completion function cannot be abandoned;
	// it ends with its response or when the session breaks (OpTimeout).
	s, err := c.session(context.Background())
	if err != nil {
		done(fmt.Errorf("memnode %v: %w", h.Op, err))
		return
	}
	s.stamp(h)
	pc := s.Get()
	setup(pc)
	pc.Fn, pc.Arg = fn, done
	var hdr [ReqHeaderSize]byte
	h.Encode(hdr[:])
	if err := s.Send(pc, hdr[:], nil); err != nil {
		done(wrapErr(h.Op, err))
	}
}

// ReadAt reads len(p) bytes at off of volume vol.
func (c *Client) ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return c.ReadAsync(ctx, vol, off, p).Wait(ctx)
}

// WriteAsync starts writing p at off of volume vol. p is copied before the
// call returns.
func (c *Client) WriteAsync(ctx context.Context, vol uint16, off uint64, p []byte) Call {
	if len(p) > MaxIO {
		return Call{err: fmt.Errorf("memnode WRITE: %w: %d bytes", ErrTooLarge, len(p)), what: OpWrite}
	}
	return c.start(ctx, &ReqHeader{Op: OpWrite, Volume: vol, Offset: off}, p, nil)
}

// XorAsync adds p to the bytes at off of volume vol by exclusive or
// (OpXor), without waiting. An error that leaves unknown whether the node
// took it (a broken connection, a timeout) leaves those bytes unknown.
func (c *Client) XorAsync(ctx context.Context, vol uint16, off uint64, p []byte) Call {
	if len(p) > MaxIO {
		return Call{err: fmt.Errorf("memnode XOR: %w: %d bytes", ErrTooLarge, len(p)), what: OpXor}
	}
	return c.start(ctx, &ReqHeader{Op: OpXor, Volume: vol, Offset: off}, p, nil)
}

// WriteAt writes p at off of volume vol; it returns once the node has applied it.
func (c *Client) WriteAt(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return c.WriteAsync(ctx, vol, off, p).Wait(ctx)
}

// PrefetchAsync starts reading the page with key k into page (pageid.Size bytes).
func (c *Client) PrefetchAsync(ctx context.Context, k pageid.Key, page []byte) Call {
	h := ReqHeader{Op: OpPrefetch, Offset: uint64(k), Count: pageid.Size}
	return c.start(ctx, &h, nil, func(pc *pipeline.Call) { pc.HeadLen, pc.Dst = 8, page[:pageid.Size] })
}

// Prefetch reads the page with key k into page.
func (c *Client) Prefetch(ctx context.Context, k pageid.Key, page []byte) error {
	return c.PrefetchAsync(ctx, k, page).Wait(ctx)
}

// MaxTrim is the most bytes one TRIM request covers: its count is 32
// bits, and a file's volume is terabytes. Longer trims are cut into
// requests of MaxTrim (a whole number of chunks) at most.
const MaxTrim = 1 << 30

// TrimAsync starts zeroing n (at most MaxTrim) bytes at off of volume vol.
func (c *Client) TrimAsync(ctx context.Context, vol uint16, off, n uint64) Call {
	if n > MaxTrim {
		return Call{err: fmt.Errorf("memnode TRIM: %w: %d bytes in one request", ErrTooLarge, n), what: OpTrim}
	}
	return c.start(ctx, &ReqHeader{Op: OpTrim, Volume: vol, Offset: off, Count: uint32(n)}, nil, nil)
}

// Trim zeroes n bytes at off of volume vol, freeing whole chunks.
func (c *Client) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	return c.TrimQueued(ctx, vol, off, n, nil)
}

// TrimQueued is Trim of any length: its requests (one per MaxTrim) are
// all sent before the first is waited for, then queued (if not nil) is
// called. It returns the first request's error, after waiting for all.
func (c *Client) TrimQueued(ctx context.Context, vol uint16, off, n uint64, queued func()) error {
	var one [1]Call
	calls := one[:0]
	for n > 0 {
		m := min(n, MaxTrim)
		calls = append(calls, c.TrimAsync(ctx, vol, off, m))
		off, n = off+m, n-m
	}
	if queued != nil {
		queued()
	}
	var first error
	for _, call := range calls {
		if err := call.Wait(ctx); first == nil {
			first = err
		}
	}
	return first
}

// Allocated calls fn for each chunk-aligned run of the n bytes at off of
// volume vol, in order, with whether the node holds memory for it (see
// Store.Allocated); the first run starts at off and the last ends at
// off+n. One MAP request asks about MaxMap bytes.
func (c *Client) Allocated(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, held bool)) error {
	runs := pageid.Runs{Emit: func(o, m uint64, hole bool) { fn(o, m, !hole) }}
	for end := off + n; off < end; {
		m := min(end-off, MaxMap-off%ChunkSize)
		b, err := c.control(ctx, &ReqHeader{Op: OpMap, Volume: vol, Offset: off, Count: uint32(m)}, nil)
		if err != nil {
			return fmt.Errorf("volume %d: %w", vol, err)
		}
		first, last := off/ChunkSize, (off+m-1)/ChunkSize
		if uint64(len(b)) != (last-first)/8+1 {
			return fmt.Errorf("memnode MAP: %w: %d bytes of bitmap for %d chunks", ErrFraming, len(b), last-first+1)
		}
		for i := first; i <= last; i++ {
			from, to := max(off, i*ChunkSize), min(off+m, (i+1)*ChunkSize)
			runs.Add(from, to-from, b[(i-first)/8]>>((i-first)%8)&1 == 0)
		}
		off += m
	}
	runs.Flush()
	return nil
}

func (c *Client) word(ctx context.Context, h *ReqHeader, payload []byte) (uint64, error) {
	var w uint64
	call := c.start(ctx, h, payload, func(pc *pipeline.Call) { pc.HeadLen = 8 })
	if call.err != nil {
		return 0, call.err
	}
	err := call.pc.WaitFn(ctx, func(pc *pipeline.Call) error {
		if err := statusCheck(pc); err != nil {
			return err
		}
		if pc.N != 8 {
			return fmt.Errorf("%w: %v response of %d bytes", ErrProtocol, h.Op, pc.N)
		}
		w = binary.LittleEndian.Uint64(pc.Head[:8])
		return nil
	})
	return w, wrapErr(h.Op, err)
}

// FetchAndAddAsync starts a FetchAndAdd whose previous value is not needed.
func (c *Client) FetchAndAddAsync(ctx context.Context, vol uint16, off, delta uint64) Call {
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], delta)
	return c.start(ctx, &ReqHeader{Op: OpFAA, Volume: vol, Offset: off}, p[:], func(pc *pipeline.Call) { pc.HeadLen = 8 })
}

// CompareAndSwap sets the 8-byte word at off to new if it equals old and
// returns its previous value.
func (c *Client) CompareAndSwap(ctx context.Context, vol uint16, off, old, new uint64) (uint64, error) {
	var p [16]byte
	binary.LittleEndian.PutUint64(p[:], old)
	binary.LittleEndian.PutUint64(p[8:], new)
	return c.word(ctx, &ReqHeader{Op: OpCAS, Volume: vol, Offset: off}, p[:])
}

// FetchAndAdd adds delta to the 8-byte word at off and returns its previous value.
func (c *Client) FetchAndAdd(ctx context.Context, vol uint16, off, delta uint64) (uint64, error) {
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], delta)
	return c.word(ctx, &ReqHeader{Op: OpFAA, Volume: vol, Offset: off}, p[:])
}

func (c *Client) control(ctx context.Context, h *ReqHeader, payload []byte) ([]byte, error) {
	var out []byte
	call := c.start(ctx, h, payload, func(pc *pipeline.Call) { pc.KeepExtra = true })
	if call.err != nil {
		return nil, call.err
	}
	err := call.pc.WaitFn(ctx, func(pc *pipeline.Call) error {
		out = pc.Extra
		if Status(pc.Status) == StatusUnauthorised && len(payload) > 0 {
			// HELLO already succeeded on this session, so a refused named
			// op can only mean the token's grant does not cover the name.
			return fmt.Errorf("%w: outside this connection's grant", ErrUnauthorised)
		}
		return statusCheck(pc)
	})
	return out, wrapErr(h.Op, err)
}

func (c *Client) info(ctx context.Context, op Op, name string, size uint64) (pageid.VolumeInfo, error) {
	if err := validName(name); err != nil {
		return pageid.VolumeInfo{}, err
	}
	b, err := c.control(ctx, &ReqHeader{Op: op, Offset: size}, []byte(name))
	if err != nil {
		return pageid.VolumeInfo{}, fmt.Errorf("volume %q: %w", name, err)
	}
	v, _, err := decodeVolumeInfo(b)
	return v, err
}

// Create makes volume name of size bytes.
func (c *Client) Create(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error) {
	return c.info(ctx, OpCreate, name, size)
}

// Resize grows volume name to size bytes. A node older than RESIZE
// answers ErrUnknownOp.
func (c *Client) Resize(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error) {
	return c.info(ctx, OpResize, name, size)
}

// Open looks up volume name.
func (c *Client) Open(ctx context.Context, name string) (pageid.VolumeInfo, error) {
	return c.info(ctx, OpOpen, name, 0)
}

// OpenOrCreate opens name, creating it with size bytes when missing.
func (c *Client) OpenOrCreate(ctx context.Context, name string, size uint64) (pageid.VolumeInfo, error) {
	v, err := c.Open(ctx, name)
	if errors.Is(err, pageid.ErrNoVolume) {
		v, err = c.Create(ctx, name, size)
		if errors.Is(err, pageid.ErrExists) {
			return c.Open(ctx, name)
		}
	}
	return v, err
}

// List returns all volumes.
func (c *Client) List(ctx context.Context) ([]pageid.VolumeInfo, error) {
	b, err := c.control(ctx, &ReqHeader{Op: OpList}, nil)
	if err != nil {
		return nil, err
	}
	var out []pageid.VolumeInfo
	for len(b) > 0 {
		var v pageid.VolumeInfo
		if v, b, err = decodeVolumeInfo(b); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Delete removes volume name.
func (c *Client) Delete(ctx context.Context, name string) error {
	return c.DeleteFenced(ctx, name, 0)
}

// DeleteFenced removes volume name unless a holder newer than token has
// presented its token for it (pageid.ErrFenced). A node older than fencing of
// DELETE ignores the token.
func (c *Client) DeleteFenced(ctx context.Context, name string, token uint64) error {
	if _, err := c.control(ctx, &ReqHeader{Op: OpDelete, Offset: token}, []byte(name)); err != nil {
		return fmt.Errorf("volume %q: %w", name, err)
	}
	return nil
}

var _ io.Closer = (*Client)(nil)
