package memnode

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/pageid"
)

// Server serves a Store over the memnode protocol. One goroutine owns each
// connection: it plays the NIC, executing requests in arrival order and
// batching responses into as few writes as the input allows.
type Server struct {
	Store *Store
	// Token is the access token HELLO must carry for access to every
	// volume. Empty with no Grants accepts any token; empty with Grants
	// accepts only the grants' tokens.
	Token string
	// Grants are further tokens, each limited to some volumes.
	Grants []Grant
	// Log receives one line per rejected connection; nil discards.
	Log *slog.Logger
	// TLS, if set, makes every connection begin with a TLS handshake: the
	// protocol has no clear phase to upgrade from. ClientAuth set to
	// tls.RequireAndVerifyClientCert makes it mutual TLS. A client that
	// sends HELLO in clear is answered StatusTLSRequired. nil serves in
	// clear, and a TLS client is told so by the answer it cannot parse.
	TLS *tls.Config
	// HandshakeTimeout bounds the wait for HELLO (default 10s).
	HandshakeTimeout time.Duration
	// PollFor is how long a connection whose input ran dry keeps polling
	// for the next request before it sleeps in poll(2) (sockio.Reader.Spin;
	// DefaultPollFor is what pd3 runs with); 0 sleeps at once. A
	// connection that goes quiet polls once, for PollFor, then sleeps,
	// and only one connection of the server polls at a time, none while
	// it serves more than one (busy).
	PollFor time.Duration
	// Stages, if set, is stamped as requests pass (the miss-path
	// breakdown); nil in production.
	Stages *stages.Recorder

	group netsrv.Group
	// spinners: one connection at a time polls (PollFor); the others
	// sleep at once.
	spinners sockio.Spinners
	// busy counts the connections served. With more than one, none
	// waits in poll(2) or polls for its next request: each blocked
	// thread would keep a P the other connections' requests need, for
	// the runtime's monitor to take back every 20 µs (docs/decisions.md,
	// 4 and 45).
	busy  sockio.Busy
	stats serverStats
}

// DefaultPollFor is the polling window pd3's memory nodes run with: long
// enough that a host at queue depth 1 finds the node awake, for about 20 µs
// of node CPU per lone read (docs/decisions.md, 20 and 9).
const DefaultPollFor = 50 * time.Microsecond

const (
	readBufSize = 256 << 10
	// writeBufSize bounds queued responses; the serving goroutine stops
	// executing requests while this much waits for the network. 256 KiB
	// measured best (128 KiB: memnode/raw 0.52; 256 KiB: 0.60–0.69; 512 KiB:
	// 0.63–0.66; larger batches spill out of L2 before the kernel copies them).
	writeBufSize = 256 << 10
)

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// Serve accepts connections on ln until ctx is done or Close is called.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	err := s.group.Serve(ctx, ln, func(nc net.Conn) {
		netsrv.LogEnd(s.log(), "memnode", nc, s.serveConn(nc))
	})
	if errors.Is(err, netsrv.ErrClosed) {
		return pageid.ErrClosed
	}
	return err
}

// Close stops all listeners and connections and waits for their goroutines.
func (s *Server) Close() error {
	s.group.Close()
	return nil
}

// conn is the per-connection state; buffers are allocated once. The
// serving goroutine reads and executes; responses go through a BatchWriter
// so that responses produced during one write syscall share the next.
type conn struct {
	s   *Server
	nc  net.Conn
	r   *bufio.Reader
	bw  *pipeline.BatchWriter
	tmp []byte // payloads that do not fit in r's buffer

	// scoped connections reach only volumes matching patterns (Grant).
	scoped   bool
	patterns []string
	// windows are the memory windows bound on this connection; last is
	// the one the previous data op used (most requests repeat it).
	windows map[uint32]*window
	last    *window
	lastKey uint32
	// counts are the connection's requests (Server.Stats).
	counts *connStats
}

func (s *Server) serveConn(nc net.Conn) error {
	st := s.stats.start()
	served := false
	defer func() { s.stats.end(st, !served) }()
	var rd io.Reader = nc
	fast := sockio.NewReader(nc)
	if fast != nil {
		rd = fast
	}
	if s.TLS != nil {
		tc, err := s.startTLS(nc, rd)
		if err != nil {
			return err
		}
		// The poll(2) reader cannot see through TLS records.
		nc, rd, fast = tc, tc, nil
	}
	c := &conn{
		s:      s,
		nc:     nc,
		r:      bufio.NewReaderSize(rd, readBufSize),
		bw:     pipeline.NewBatchWriter(nc, writeBufSize, nil),
		counts: st,
	}
	// With persistence, write acknowledgements leave only once their log
	// entries are on stable storage; the connection keeps executing.
	c.bw.SetGate(s.Store.Durable)
	defer c.bw.Close()
	if err := c.handshake(); err != nil {
		return err
	}
	served = true
	s.busy.AddConn(1)
	defer s.busy.AddConn(-1)
	if fast != nil {
		// This goroutine plays the NIC: while it serves the node's only
		// connection it waits for requests in poll(2) and answers them
		// with no scheduler hop (see sockio).
		fast.DirectIf(&s.busy)
		fast.Spin(s.PollFor, &s.spinners)
	}
	var h ReqHeader
	for {
		c.need(ReqHeaderSize)
		hb, err := c.r.Peek(ReqHeaderSize)
		if err != nil {
			return err
		}
		if err := h.Decode(hb); err != nil {
			c.respondErr(&h, err)
			return err
		}
		s.Stages.Stamp(stages.NodeRequestRead)
		c.counts.request(h.Op)
		if _, err := c.r.Discard(ReqHeaderSize); err != nil {
			return err
		}
		if err := c.execute(&h); err != nil {
			return err
		}
		s.Stages.Stamp(stages.NodeServed)
	}
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout == 0 {
		return 10 * time.Second
	}
	return s.HandshakeTimeout
}

// startTLS runs the server side of the TLS handshake on nc, read through
// rd. A client speaking the protocol in clear gets an answer to its HELLO
// that it understands (StatusTLSRequired) rather than a cut connection.
func (s *Server) startTLS(nc net.Conn, rd io.Reader) (*tls.Conn, error) {
	nc.SetDeadline(time.Now().Add(s.handshakeTimeout()))
	defer nc.SetDeadline(time.Time{})
	br := bufio.NewReaderSize(rd, ReqHeaderSize)
	first, err := br.Peek(1)
	if err != nil {
		return nil, fmt.Errorf("waiting for the TLS handshake: %w", err)
	}
	if first[0] == reqMagic {
		var h ReqHeader
		if hb, err := br.Peek(ReqHeaderSize); err == nil && h.Decode(hb) == nil {
			nc.Write(appendResp(nil, &h, StatusTLSRequired, nil))
		}
		return nil, fmt.Errorf("%w: the client spoke in clear", ErrTLSRequired)
	}
	tc := tls.Server(netsrv.ReaderConn{Conn: nc, R: br}, s.TLS)
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc, nil
}

// tlsRecordHandshake is the first byte a TLS client sends.
const tlsRecordHandshake = 0x16

func (c *conn) handshake() error {
	c.nc.SetReadDeadline(time.Now().Add(c.s.handshakeTimeout()))
	defer c.nc.SetReadDeadline(time.Time{})
	var h ReqHeader
	hb, err := c.r.Peek(ReqHeaderSize)
	if err != nil {
		return fmt.Errorf("reading HELLO: %w", err)
	}
	if err := h.Decode(hb); err != nil {
		c.respondErr(&h, err)
		if hb[0] == tlsRecordHandshake {
			return fmt.Errorf("%w: the client speaks TLS and this node serves in clear", err)
		}
		return err
	}
	c.r.Discard(ReqHeaderSize)
	c.counts.request(h.Op)
	if h.Op != OpHello {
		c.respond(&h, StatusUnauthorised, nil)
		return fmt.Errorf("%w: %v before HELLO", ErrUnauthorised, h.Op)
	}
	p, err := c.payload(h.PayloadLen)
	if err != nil {
		return err
	}
	if len(p) < 4 {
		c.respond(&h, StatusBadRequest, nil)
		return fmt.Errorf("%w: HELLO payload of %d bytes", ErrBadRequest, len(p))
	}
	if v := binary.LittleEndian.Uint32(p); v != Version {
		c.respond(&h, StatusVersion, nil)
		return fmt.Errorf("%w: client speaks %d", ErrVersion, v)
	}
	patterns, ok := c.s.scope(p[4:])
	if !ok {
		c.respond(&h, StatusUnauthorised, nil)
		return fmt.Errorf("%w: wrong token", ErrUnauthorised)
	}
	c.scoped, c.patterns = patterns != nil, patterns
	var info [8]byte
	binary.LittleEndian.PutUint32(info[0:], Version)
	binary.LittleEndian.PutUint32(info[4:], MaxIO)
	return c.respond(&h, StatusOK, info[:])
}

// need writes the responses held back so far if the next n bytes of input
// are not buffered yet: the read may wait, and nothing may wait behind it.
// Responses are held back while requests are buffered, so a burst of
// requests is answered with one write, and the last response of a burst
// leaves on this goroutine with no hand-off.
func (c *conn) need(n int) {
	if c.r.Buffered() < n {
		if c.s.Stages != nil && c.bw.Queued() > 0 {
			c.s.Stages.Stamp(stages.NodeReplyWritten)
		}
		c.bw.Flush()
	}
}

// payload returns the next n bytes of input, valid until the next read.
// It avoids a copy whenever the payload fits in the read buffer.
func (c *conn) payload(n uint32) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	c.need(int(n))
	if int(n) <= c.r.Size() {
		p, err := c.r.Peek(int(n))
		if err != nil {
			return nil, err
		}
		c.r.Discard(int(n))
		// The bytes stay valid until the next Peek/Read on c.r.
		return p, nil
	}
	if cap(c.tmp) < int(n) {
		c.tmp = make([]byte, MaxPayload)
	}
	p := c.tmp[:n]
	_, err := io.ReadFull(c.r, p)
	return p, err
}

// execute runs one request whose header has been consumed. A returned error
// closes the connection; per-request failures are answered and return nil.
func (c *conn) execute(h *ReqHeader) error {
	p, err := c.payload(h.PayloadLen)
	if err != nil {
		return err
	}
	st := c.s.Store
	switch h.Op {
	case OpRead:
		if h.Count > MaxIO {
			c.respond(h, StatusTooLarge, nil)
			return nil
		}
		if s := c.authorise(h, h.Volume, h.Offset, uint64(h.Count), AccessRead); s != StatusOK {
			return c.respond(h, s, nil)
		}
		return c.respondData(h, 0, int(h.Count), func(p []byte) error { return st.ReadAt(h.Volume, h.Offset, p) })
	case OpPrefetch:
		k := pageid.Key(h.Offset)
		if s := c.authorise(h, k.Volume(), k.Page()*pageid.Size, pageid.Size, AccessRead); s != StatusOK {
			return c.respond(h, s, nil)
		}
		return c.respondData(h, uint64(k), pageid.Size, func(p []byte) error { return st.ReadAt(k.Volume(), k.Page()*pageid.Size, p) })
	case OpWrite, OpXor:
		if s := c.authorise(h, h.Volume, h.Offset, uint64(len(p)), AccessWrite); s != StatusOK {
			return c.respond(h, s, nil)
		}
		change := st.write
		if h.Op == OpXor {
			change = st.xor
		}
		var tok uint64
		err := st.fenced(c.last.v, c.last.fence, func() (err error) {
			tok, err = change(h.Volume, h.Offset, p)
			return err
		})
		if err == nil {
			c.counts.wrBytes.Add(uint64(len(p)))
		}
		return c.respondToken(h, err, tok)
	case OpTrim:
		if s := c.authorise(h, h.Volume, h.Offset, uint64(h.Count), AccessWrite); s != StatusOK {
			return c.respond(h, s, nil)
		}
		var tok uint64
		err := st.fenced(c.last.v, c.last.fence, func() (err error) {
			tok, err = st.trim(h.Volume, h.Offset, uint64(h.Count), true)
			return err
		})
		return c.respondToken(h, err, tok)
	case OpMap:
		if s := c.authorise(h, h.Volume, h.Offset, uint64(h.Count), AccessRead); s != StatusOK {
			return c.respond(h, s, nil)
		}
		var bits [MaxMap / ChunkSize / 8]byte
		b, err := st.Allocated(h.Volume, h.Offset, uint64(h.Count), bits[:0])
		if err != nil {
			return c.respondErr(h, err)
		}
		return c.respond(h, StatusOK, b)
	case OpCAS, OpFAA:
		want := 8
		if h.Op == OpCAS {
			want = 16
		}
		if len(p) != want {
			return c.respond(h, StatusBadRequest, nil)
		}
		if s := c.authorise(h, h.Volume, h.Offset, 8, AccessAll); s != StatusOK {
			return c.respond(h, s, nil)
		}
		var old uint64
		err := st.fenced(c.last.v, c.last.fence, func() (err error) {
			if h.Op == OpCAS {
				old, err = st.CompareAndSwap(h.Volume, h.Offset, binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:]))
			} else {
				old, err = st.FetchAndAdd(h.Volume, h.Offset, binary.LittleEndian.Uint64(p))
			}
			return err
		})
		c.respondWord(h, old, err)
	case OpBind:
		return c.respond(h, c.bind(h, p), nil)
	case OpUnbind:
		return c.respond(h, c.unbind(h), nil)
	case OpCreate:
		if err := c.checkName(string(p)); err != nil {
			return c.respondErr(h, err)
		}
		info, err := st.Create(string(p), h.Offset)
		c.respondInfo(h, info, err)
	case OpResize:
		if err := c.checkName(string(p)); err != nil {
			return c.respondErr(h, err)
		}
		info, err := st.Resize(string(p), h.Offset)
		c.respondInfo(h, info, err)
	case OpOpen:
		if err := c.checkName(string(p)); err != nil {
			return c.respondErr(h, err)
		}
		info, err := st.Open(string(p))
		c.respondInfo(h, info, err)
	case OpList:
		var b []byte
		for _, v := range st.List() {
			if c.allowed(v.Name) {
				b = appendVolumeInfo(b, v)
			}
		}
		c.respond(h, StatusOK, b)
	case OpDelete:
		if err := c.checkName(string(p)); err != nil {
			return c.respondErr(h, err)
		}
		c.respondErr(h, st.DeleteFenced(string(p), h.Offset))
	case OpHello:
		c.respond(h, StatusBadRequest, nil)
	default:
		c.respond(h, StatusUnknownOp, nil)
	}
	return nil
}

// respondData answers with an n-byte payload that fill writes straight
// into the output buffer, so data is copied once. With key != 0 the payload
// starts with the 8-byte key (PREFETCH). If fill fails the reservation is
// replaced by an error response.
func (c *conn) respondData(h *ReqHeader, key uint64, n int, fill func([]byte) error) error {
	buf, err := c.bw.Begin()
	if err != nil {
		return err
	}
	start := len(buf)
	pre := 0
	if key != 0 {
		pre = 8
	}
	buf = slices.Grow(buf, RespHeaderSize+pre+n)[:start+RespHeaderSize+pre+n]
	rh := RespHeader{Op: h.Op, Status: StatusOK, PayloadLen: uint32(pre + n), Tag: h.Tag}
	rh.Encode(buf[start:])
	if pre > 0 {
		binary.LittleEndian.PutUint64(buf[start+RespHeaderSize:], key)
	}
	if err := fill(buf[start+RespHeaderSize+pre:]); err != nil {
		buf = appendResp(buf[:start], h, statusOf(err), nil)
		c.counts.failed.Add(1)
	} else {
		c.counts.readBytes.Add(uint64(n))
	}
	c.bw.EndLater(buf)
	return nil
}

func appendResp(buf []byte, h *ReqHeader, s Status, payload []byte) []byte {
	var hb [RespHeaderSize]byte
	(&RespHeader{Op: h.Op, Status: s, PayloadLen: uint32(len(payload)), Tag: h.Tag}).Encode(hb[:])
	return append(append(buf, hb[:]...), payload...)
}

func (c *conn) respond(h *ReqHeader, s Status, payload []byte) error {
	buf, err := c.bw.Begin()
	if err != nil {
		return err
	}
	if s != StatusOK {
		c.counts.failed.Add(1)
	}
	c.bw.EndLater(appendResp(buf, h, s, payload))
	return nil
}

// respondToken answers a mutation; the answer waits for durability token
// tok at the writer (see BatchWriter.SetGate). Like every answer it is
// held until the input runs dry (need), so a burst of pipelined writes is
// acknowledged with one write(2), not one per page.
func (c *conn) respondToken(h *ReqHeader, err error, tok uint64) error {
	buf, berr := c.bw.Begin()
	if berr != nil {
		return berr
	}
	s := statusOf(err)
	if s != StatusOK {
		c.counts.failed.Add(1)
	}
	c.bw.EndTokenLater(appendResp(buf, h, s, nil), tok)
	return nil
}

func (c *conn) respondErr(h *ReqHeader, err error) error {
	return c.respond(h, statusOf(err), nil)
}

func (c *conn) respondWord(h *ReqHeader, w uint64, err error) error {
	if err != nil {
		return c.respondErr(h, err)
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], w)
	return c.respond(h, StatusOK, b[:])
}

func (c *conn) respondInfo(h *ReqHeader, info pageid.VolumeInfo, err error) error {
	if err != nil {
		return c.respondErr(h, err)
	}
	var b [volumeInfoFixed + MaxNameLen]byte
	return c.respond(h, StatusOK, appendVolumeInfo(b[:0], info))
}
