package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore"
)

// Backend is what exports are served from; *pagestore.Store implements it.
type Backend interface {
	ReadRange(ctx context.Context, vol uint16, off uint64, p []byte) error
	WriteRange(ctx context.Context, vol uint16, off uint64, p []byte) error
	ZeroRange(ctx context.Context, vol uint16, off, n uint64, keep bool) error
	Flush(ctx context.Context) error
}

var _ Backend = (*pagestore.Store)(nil)

// PageReader is implemented by backends that can serve a one-page read
// without blocking (*pagestore.Store): a hit is copied at once, a miss
// finishes with done on the remote's reader goroutine. The connection
// reader then runs such reads to completion itself, with no worker
// hand-off; ErrWouldBlock sends a read to the workers instead.
type PageReader interface {
	GetAsync(k memnode.Key, dst []byte, done func(error)) (finished bool, err error)
}

var _ PageReader = (*pagestore.Store)(nil)

// Export is one volume served over NBD.
type Export struct {
	Name        string
	Description string
	Volume      uint16
	Size        uint64
	ReadOnly    bool
}

// Server is an NBD server. The first export is the default one (the empty
// name). Requests of one connection run concurrently and are answered as
// they finish; the cache behind every connection is shared, so FLUSH on any
// connection covers writes completed on all of them (CAN_MULTI_CONN).
type Server struct {
	Backend Backend
	Exports []Export
	// Mirror, if set, is shown every connection's bytes as they are read
	// (the DPU agent's tap).
	Mirror mirror.Mirror
	// MaxRequest bounds READ and WRITE lengths (default 32 MiB); larger
	// ones get EOVERFLOW.
	MaxRequest uint32
	// Workers is how many requests of one connection run at once
	// (default 16).
	Workers int
	// HandshakeTimeout bounds the whole negotiation (default 10s), so idle
	// and half-open clients cannot hold a connection.
	HandshakeTimeout time.Duration
	Log              *slog.Logger
	// Stages, if set, is stamped as requests pass (the miss-path
	// breakdown); nil in production.
	Stages *stages.Recorder

	group  netsrv.Group
	bufs   bufPool
	reqs   sync.Pool // *request
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	// Counters.
	Connections, Requests, Errors, ProtocolViolations atomic.Uint64
}

const (
	defaultMaxRequest = 32 << 20
	maxOptionLen      = 64 << 10
	maxDiscard        = 64 << 20 // payload of a refused WRITE we still skip
)

func (s *Server) init() {
	s.once.Do(func() {
		if s.MaxRequest == 0 {
			s.MaxRequest = defaultMaxRequest
		}
		if s.Workers <= 0 {
			s.Workers = 16
		}
		if s.HandshakeTimeout <= 0 {
			s.HandshakeTimeout = 10 * time.Second
		}
		if s.Log == nil {
			s.Log = slog.New(slog.DiscardHandler)
		}
		s.ctx, s.cancel = context.WithCancel(context.Background())
	})
}

// Serve accepts connections on ln until ctx ends or Close is called.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.init()
	return s.group.Serve(ctx, ln, s.serveConn)
}

// Close stops accepting, ends every connection and waits for them.
func (s *Server) Close() error {
	s.init()
	s.cancel()
	s.group.Close()
	return nil
}

func (s *Server) export(name string) (Export, bool) {
	if name == "" && len(s.Exports) > 0 {
		return s.Exports[0], true
	}
	for _, e := range s.Exports {
		if e.Name == name {
			return e, true
		}
	}
	return Export{}, false
}

// noExport is the message for an export name that is not served: it
// names the ones that are, so the user can correct the URI.
func (s *Server) noExport(name string) string {
	names := make([]string, len(s.Exports))
	for i, e := range s.Exports {
		names[i] = strconv.Quote(e.Name)
	}
	return fmt.Sprintf("no export %q; this server exports %s", name, strings.Join(names, ", "))
}

// errProtocol marks a violation that ends the connection.
var errProtocol = errors.New("nbd: protocol violation")

type conn struct {
	s          *Server
	nc         net.Conn
	r          *bufio.Reader
	w          *bufio.Writer // handshake only
	structured bool
	noZeroes   bool
	metaExport string // export base:allocation was selected for
	metaOK     bool
	exp        Export

	bw      *pipeline.BatchWriter // replies (transmission phase)
	pr      PageReader            // nil: every request goes to a worker
	pending sync.WaitGroup        // reads started with PageReader
	nasync  atomic.Int32          // reads started with PageReader, in flight
	// inflight counts requests read and not yet answered: a reply with
	// no other request in flight is written at once on the goroutine
	// that made it; others are queued for the writer, which batches.
	inflight atomic.Int32
}

// maxConnAsync bounds one connection's reads in flight on the reader's
// path, as Workers bounds the others.
const maxConnAsync = 256

func (s *Server) serveConn(nc net.Conn) {
	s.Connections.Add(1)
	var rd io.Reader = nc
	fast := sockio.NewReader(nc)
	if fast != nil {
		rd = fast
	}
	if s.Mirror != nil {
		st := s.Mirror.NewStream()
		defer st.Close()
		rd = mirror.Conn{Conn: nc, S: st, R: rd}
	}
	c := &conn{s: s, nc: nc, r: bufio.NewReaderSize(rd, 256<<10), w: bufio.NewWriter(nc)}
	nc.SetDeadline(time.Now().Add(s.HandshakeTimeout))
	ok, err := c.handshake()
	if err != nil || !ok {
		netsrv.LogEnd(s.Log, "nbd", nc, err, "phase", "handshake")
		return
	}
	nc.SetDeadline(time.Time{})
	if fast != nil {
		// The reader waits for requests in poll(2): a request wakes this
		// thread directly, and a hit is answered with no scheduler hop.
		fast.Direct()
	}
	netsrv.LogEnd(s.Log, "nbd", nc, c.transmit(), "export", c.exp.Name)
}

// handshake runs fixed-newstyle negotiation; it reports whether the
// transmission phase should start.
func (c *conn) handshake() (bool, error) {
	var b [18]byte
	binary.BigEndian.PutUint64(b[0:], magicInit)
	binary.BigEndian.PutUint64(b[8:], magicOption)
	binary.BigEndian.PutUint16(b[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.nc.Write(b[:]); err != nil {
		return false, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.r, cf[:]); err != nil {
		return false, err
	}
	flags := binary.BigEndian.Uint32(cf[:])
	if flags&^(clientFixedNewstyle|clientNoZeroes) != 0 {
		c.s.ProtocolViolations.Add(1)
		return false, fmt.Errorf("%w: unknown client flags %#x", errProtocol, flags)
	}
	c.noZeroes = flags&clientNoZeroes != 0
	for {
		var h [16]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			return false, err
		}
		if binary.BigEndian.Uint64(h[0:]) != magicOption {
			c.s.ProtocolViolations.Add(1)
			return false, fmt.Errorf("%w: bad option magic", errProtocol)
		}
		opt := binary.BigEndian.Uint32(h[8:])
		n := binary.BigEndian.Uint32(h[12:])
		if n > maxOptionLen {
			c.s.ProtocolViolations.Add(1)
			return false, fmt.Errorf("%w: option %d of %d bytes", errProtocol, opt, n)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(c.r, data); err != nil {
			return false, err
		}
		done, err := c.option(opt, data)
		if err != nil || done {
			return err == nil, err
		}
	}
}

func (c *conn) reply(opt, typ uint32, data []byte) error {
	var h [20]byte
	binary.BigEndian.PutUint64(h[0:], magicReply)
	binary.BigEndian.PutUint32(h[8:], opt)
	binary.BigEndian.PutUint32(h[12:], typ)
	binary.BigEndian.PutUint32(h[16:], uint32(len(data)))
	c.w.Write(h[:])
	c.w.Write(data)
	return c.w.Flush()
}

func (c *conn) replyErr(opt, typ uint32, msg string) error { return c.reply(opt, typ, []byte(msg)) }

// option handles one option; done means the transmission phase starts (or,
// with ABORT, the connection ends cleanly).
func (c *conn) option(opt uint32, data []byte) (done bool, err error) {
	switch opt {
	case optExportName:
		e, ok := c.s.export(string(data))
		if !ok {
			// No way to report an error to EXPORT_NAME: the spec says hang up.
			return true, errors.New(c.s.noExport(string(data)))
		}
		c.exp = e
		var b [10 + 124]byte
		binary.BigEndian.PutUint64(b[0:], e.Size)
		binary.BigEndian.PutUint16(b[8:], c.flags())
		out := b[:]
		if c.noZeroes {
			out = b[:10]
		}
		c.w.Write(out)
		return true, c.w.Flush()
	case optAbort:
		c.reply(opt, repAck, nil)
		return true, io.EOF
	case optList:
		if len(data) != 0 {
			return false, c.replyErr(opt, repErrInvalid, "LIST takes no data")
		}
		for _, e := range c.s.Exports {
			d := binary.BigEndian.AppendUint32(nil, uint32(len(e.Name)))
			d = append(d, e.Name...)
			d = append(d, e.Description...)
			if err := c.reply(opt, repServer, d); err != nil {
				return false, err
			}
		}
		return false, c.reply(opt, repAck, nil)
	case optStartTLS:
		return false, c.replyErr(opt, repErrUnsup, "TLS is not supported")
	case optStructuredReply:
		if len(data) != 0 {
			return false, c.replyErr(opt, repErrInvalid, "STRUCTURED_REPLY takes no data")
		}
		c.structured = true
		return false, c.reply(opt, repAck, nil)
	case optInfo, optGo:
		return c.infoGo(opt, data)
	case optListMetaContext, optSetMetaContext:
		return false, c.metaContext(opt, data)
	}
	return false, c.replyErr(opt, repErrUnsup, fmt.Sprintf("option %d is not supported", opt))
}

func (c *conn) flags() uint16 {
	f := tfHasFlags | tfSendFlush | tfCanMultiConn | tfSendCache
	if c.exp.ReadOnly {
		f |= tfReadOnly
	} else {
		f |= tfSendFUA | tfSendTrim | tfSendWriteZeros | tfSendFastZero
	}
	if c.structured {
		f |= tfSendDF
	}
	return f
}

func (c *conn) infoGo(opt uint32, data []byte) (bool, error) {
	if len(data) < 6 {
		return false, c.replyErr(opt, repErrInvalid, "short INFO/GO request")
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n)+6 > uint64(len(data)) {
		return false, c.replyErr(opt, repErrInvalid, "export name overruns the request")
	}
	name := string(data[4 : 4+n])
	rest := data[4+n:]
	nreq := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+2*nreq {
		return false, c.replyErr(opt, repErrInvalid, "bad information request list")
	}
	e, ok := c.s.export(name)
	if !ok {
		return false, c.replyErr(opt, repErrUnknown, c.s.noExport(name))
	}
	prev := c.exp
	c.exp = e
	var b []byte
	b = binary.BigEndian.AppendUint16(b[:0], infoExport)
	b = binary.BigEndian.AppendUint64(b, e.Size)
	b = binary.BigEndian.AppendUint16(b, c.flags())
	if err := c.reply(opt, repInfo, b); err != nil {
		return false, err
	}
	for i := 0; i < nreq; i++ {
		switch binary.BigEndian.Uint16(rest[2+2*i:]) {
		case infoName:
			b = binary.BigEndian.AppendUint16(b[:0], infoName)
			if err := c.reply(opt, repInfo, append(b, e.Name...)); err != nil {
				return false, err
			}
		case infoDescription:
			b = binary.BigEndian.AppendUint16(b[:0], infoDescription)
			if err := c.reply(opt, repInfo, append(b, e.Description...)); err != nil {
				return false, err
			}
		}
	}
	// Block sizes are always sent: any alignment works (partial pages are
	// read-modify-written), 4 KiB is best, MaxRequest is the limit.
	b = binary.BigEndian.AppendUint16(b[:0], infoBlockSize)
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint32(b, memnode.PageSize)
	b = binary.BigEndian.AppendUint32(b, c.s.MaxRequest)
	if err := c.reply(opt, repInfo, b); err != nil {
		return false, err
	}
	if err := c.reply(opt, repAck, nil); err != nil {
		return false, err
	}
	if opt == optInfo {
		c.exp = prev
		return false, nil
	}
	if c.metaOK && c.metaExport != e.Name {
		c.metaOK = false // contexts were selected for another export
	}
	return true, nil
}

func (c *conn) metaContext(opt uint32, data []byte) error {
	if !c.structured {
		return c.replyErr(opt, repErrInvalid, "negotiate structured replies first")
	}
	if len(data) < 8 {
		return c.replyErr(opt, repErrInvalid, "short meta context request")
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n)+8 > uint64(len(data)) {
		return c.replyErr(opt, repErrInvalid, "export name overruns the request")
	}
	name := string(data[4 : 4+n])
	rest := data[4+n:]
	nq := binary.BigEndian.Uint32(rest)
	rest = rest[4:]
	var queries []string
	for i := uint32(0); i < nq; i++ {
		if len(rest) < 4 {
			return c.replyErr(opt, repErrInvalid, "truncated query list")
		}
		ql := binary.BigEndian.Uint32(rest)
		if uint64(ql) > uint64(len(rest)-4) {
			return c.replyErr(opt, repErrInvalid, "query overruns the request")
		}
		queries = append(queries, string(rest[4:4+ql]))
		rest = rest[4+ql:]
	}
	if len(rest) != 0 {
		return c.replyErr(opt, repErrInvalid, "trailing bytes after the queries")
	}
	e, ok := c.s.export(name)
	if !ok {
		return c.replyErr(opt, repErrUnknown, c.s.noExport(name))
	}
	match := false
	if len(queries) == 0 {
		match = opt == optListMetaContext
	}
	for _, q := range queries {
		if q == metaBaseAllocation || (opt == optListMetaContext && q == "base:") {
			match = true
		}
	}
	if opt == optSetMetaContext {
		c.metaOK, c.metaExport = match, e.Name
	}
	if match {
		d := binary.BigEndian.AppendUint32(nil, metaBaseAllocationID)
		if opt == optListMetaContext {
			d = binary.BigEndian.AppendUint32(nil, 0) // ids are reserved in LIST
		}
		if err := c.reply(opt, repMetaContext, append(d, metaBaseAllocation...)); err != nil {
			return err
		}
	}
	return c.reply(opt, repAck, nil)
}

// request is one transmission-phase request in flight. Requests are
// pooled; answer recycles them.
type request struct {
	typ, flags uint16
	cookie     uint64
	off        uint64
	length     uint32
	buf        []byte // WRITE payload or READ destination
	errno      uint32 // set by validation: answer without executing

	c    *conn
	done func(error) // r.pageRead, bound once per pooled request
	// page holds READ and WRITE data of up to a page, so the common
	// request needs no buffer from bufs.
	page [memnode.PageSize]byte
}

// data returns a buffer of n bytes for r.
func (c *conn) data(r *request, n int) []byte {
	if n <= len(r.page) {
		return r.page[:n]
	}
	return c.s.bufs.get(n)
}

func (s *Server) newRequest(c *conn) *request {
	r, _ := s.reqs.Get().(*request)
	if r == nil {
		r = &request{}
		r.done = r.pageRead
	}
	r.c = c
	return r
}

// transmit runs the transmission phase: this goroutine reads and validates
// requests; Workers goroutines execute them; replies go through one
// BatchWriter in completion order.
func (c *conn) transmit() error {
	s := c.s
	bw := pipeline.NewBatchWriter(c.nc, 4<<20, func(error) { sockio.Close(c.nc) })
	c.bw = bw
	c.pr, _ = s.Backend.(PageReader)
	work := make(chan *request, s.Workers*2)
	var wg sync.WaitGroup
	for i := 0; i < s.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				c.execute(r)
			}
		}()
	}
	err := c.readRequests(work)
	close(work)
	wg.Wait() // every request gets its reply before the connection closes
	c.pending.Wait()
	bw.Close()
	return err
}

func (c *conn) readRequests(work chan<- *request) error {
	s := c.s
	var h [requestHeaderLen]byte
	for {
		c.need(requestHeaderLen)
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				s.ProtocolViolations.Add(1)
				return fmt.Errorf("%w: connection closed inside a request header", errProtocol)
			}
			return err
		}
		s.Stages.Stamp(stages.HostRequestRead)
		if m := binary.BigEndian.Uint32(h[0:]); m != magicRequest {
			s.ProtocolViolations.Add(1)
			return fmt.Errorf("%w: bad request magic %#x", errProtocol, m)
		}
		r := s.newRequest(c)
		r.flags = binary.BigEndian.Uint16(h[4:])
		r.typ = binary.BigEndian.Uint16(h[6:])
		r.cookie = binary.BigEndian.Uint64(h[8:])
		r.off = binary.BigEndian.Uint64(h[16:])
		r.length = binary.BigEndian.Uint32(h[24:])
		s.Requests.Add(1)
		if r.typ == cmdDisc {
			s.reqs.Put(r)
			return nil // outstanding requests finish in transmit
		}
		c.inflight.Add(1)
		if r.typ == cmdWrite {
			if r.length > s.MaxRequest {
				// Refuse it, but keep the stream in step if we can.
				r.errno = errOverflow
				if n := r.length; n > maxDiscard {
					c.answer(r, false) // recycles r
					s.ProtocolViolations.Add(1)
					return fmt.Errorf("%w: WRITE of %d bytes", errProtocol, n)
				}
				c.need(int(r.length))
				if _, err := c.r.Discard(int(r.length)); err != nil {
					return err
				}
			} else {
				r.buf = c.data(r, int(r.length))
				c.need(len(r.buf))
				if _, err := io.ReadFull(c.r, r.buf); err != nil {
					c.recycle(r)
					return err
				}
			}
		}
		if r.errno == 0 {
			r.errno = c.validate(r)
		}
		if r.errno != 0 {
			c.answer(r, true)
			continue
		}
		if r.typ == cmdRead {
			r.buf = c.data(r, int(r.length))
			if c.readPage(r) {
				continue
			}
		}
		work <- r
	}
}

// readPage runs a one-page READ on the reader's path if it can: a hit is
// answered now, a miss when the page arrives (pageRead). It reports false
// when a worker must take the request.
func (c *conn) readPage(r *request) bool {
	if c.pr == nil || r.length != memnode.PageSize || r.off%memnode.PageSize != 0 {
		return false
	}
	if c.nasync.Add(1) > maxConnAsync {
		c.nasync.Add(-1)
		return false
	}
	c.pending.Add(1)
	c.s.Stages.Stamp(stages.HostDispatched)
	finished, err := c.pr.GetAsync(memnode.MakeKey(c.exp.Volume, r.off/memnode.PageSize), r.buf, r.done)
	if errors.Is(err, pagestore.ErrWouldBlock) {
		c.nasync.Add(-1)
		c.pending.Done()
		return false
	}
	if finished {
		c.pageDone(r, err, true)
	}
	return true
}

// pageRead completes a READ started by readPage when the page arrives.
func (r *request) pageRead(err error) { r.c.pageDone(r, err, false) }

// pageDone answers a READ started by readPage: on the reader (later: the
// reply waits for the reader's flush) or on the page store's remote reader
// goroutine, which must not wait: if the reply buffer is full (the client
// is not reading), a goroutine answers.
func (c *conn) pageDone(r *request, err error, later bool) {
	if !later {
		c.s.Stages.Stamp(stages.HostRemoteDone)
	}
	if err != nil {
		c.failed(r, err)
	}
	defer c.pending.Done()
	defer c.nasync.Add(-1)
	if !later {
		c.s.Stages.Stamp(stages.HostReplyWritten)
	}
	if !c.tryAnswer(r, later) {
		c.pending.Add(1)
		go func() {
			defer c.pending.Done()
			c.answer(r, false)
		}()
	}
}

// need writes the replies held back so far if the next n bytes of input
// are not buffered yet: the read may wait, and no reply may wait behind
// it. Replies made on the reader are held back while requests are
// buffered, so a burst is answered with one write.
func (c *conn) need(n int) {
	if c.r.Buffered() < n {
		if c.s.Stages != nil && c.bw.Queued() > 0 {
			c.s.Stages.Stamp(stages.HostReplyWritten)
		}
		c.bw.Flush()
	}
}

// validate checks a request before any backend sees it (nbdkit's rule).
func (c *conn) validate(r *request) uint32 {
	allowed := cmdFlagFUA
	switch r.typ {
	case cmdRead:
		if c.structured {
			allowed |= cmdFlagDF
		}
	case cmdWriteZeroes:
		allowed |= cmdFlagNoHole | cmdFlagFastZero
	case cmdBlockStatus:
		allowed |= cmdFlagReqOne
	case cmdWrite, cmdFlush, cmdTrim, cmdCache:
	default:
		return errInval
	}
	if r.flags&^allowed != 0 {
		return errInval
	}
	if r.typ == cmdFlush {
		if r.off != 0 || r.length != 0 {
			return errInval
		}
		return 0
	}
	if r.length == 0 {
		return errInval
	}
	if r.typ == cmdRead && r.length > c.s.MaxRequest {
		return errOverflow
	}
	writes := r.typ == cmdWrite || r.typ == cmdTrim || r.typ == cmdWriteZeroes
	if writes && c.exp.ReadOnly {
		return errPerm
	}
	if end, carry := bits.Add64(r.off, uint64(r.length), 0); carry != 0 || end > c.exp.Size {
		if r.typ == cmdWrite || r.typ == cmdWriteZeroes {
			return errNoSpc // the spec's choice for writes past the end
		}
		return errInval
	}
	if r.typ == cmdBlockStatus && !c.metaOK {
		return errInval
	}
	if r.typ == cmdWriteZeroes && r.flags&cmdFlagFastZero != 0 && r.flags&cmdFlagNoHole != 0 {
		return errNotSup // zeroes that must be allocated are written, not fast
	}
	return 0
}

func (c *conn) execute(r *request) {
	ctx := c.s.ctx
	vol := c.exp.Volume
	var err error
	switch r.typ {
	case cmdRead:
		err = c.s.Backend.ReadRange(ctx, vol, r.off, r.buf)
	case cmdWrite:
		err = c.s.Backend.WriteRange(ctx, vol, r.off, r.buf)
	case cmdFlush:
		err = c.s.Backend.Flush(ctx)
	case cmdTrim:
		err = c.s.Backend.ZeroRange(ctx, vol, r.off, uint64(r.length), false)
	case cmdWriteZeroes:
		err = c.s.Backend.ZeroRange(ctx, vol, r.off, uint64(r.length), r.flags&cmdFlagNoHole != 0)
	case cmdCache:
		err = c.cache(ctx, r)
	case cmdBlockStatus:
	}
	if err == nil && r.flags&cmdFlagFUA != 0 && r.typ != cmdRead && r.typ != cmdCache && r.typ != cmdBlockStatus {
		err = c.s.Backend.Flush(ctx)
	}
	if err != nil {
		c.failed(r, err)
	}
	c.answer(r, false)
}

func (c *conn) failed(r *request, err error) {
	r.errno = errnoOf(err)
	c.s.Errors.Add(1)
	c.s.Log.Warn("nbd: request failed", "cmd", cmdName(r.typ), "offset", r.off, "length", r.length, "err", err)
}

// cache reads the range into the host cache (and, with an agent, its
// parser has already turned the request into prefetches).
func (c *conn) cache(ctx context.Context, r *request) error {
	buf := c.s.bufs.get(1 << 20)
	defer c.s.bufs.put(buf)
	for off, end := r.off, r.off+uint64(r.length); off < end; {
		n := min(uint64(len(buf)), end-off)
		if err := c.s.Backend.ReadRange(ctx, c.exp.Volume, off, buf[:n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// errnoOf is the one place that maps errors to NBD error values.
func errnoOf(err error) uint32 {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pagestore.ErrOutOfRange), errors.Is(err, memnode.ErrOutOfRange),
		errors.Is(err, pagestore.ErrNoVolume), errors.Is(err, memnode.ErrNoVolume):
		return errInval
	case errors.Is(err, memnode.ErrNoMemory):
		return errNoSpc
	case errors.Is(err, context.Canceled):
		return errShutdown
	}
	return errIO
}

// answer sends r's reply and recycles r and its buffer. With later the
// reply waits for the reader's next flush (see need).
func (c *conn) answer(r *request, later bool) {
	buf, err := c.bw.Begin()
	if err == nil {
		c.end(c.appendReply(r, buf), later)
	}
	c.recycle(r)
}

// tryAnswer is answer if the reply buffer has room; false (r untouched)
// if not.
func (c *conn) tryAnswer(r *request, later bool) bool {
	buf, ok, err := c.bw.TryBegin()
	if !ok && err == nil {
		return false
	}
	if ok {
		c.end(c.appendReply(r, buf), later)
	}
	c.recycle(r)
	return true
}

func (c *conn) end(buf []byte, later bool) {
	if later {
		c.bw.EndLater(buf)
	} else {
		c.bw.EndInFlight(buf, int(c.inflight.Load()))
	}
}

func (c *conn) recycle(r *request) {
	c.inflight.Add(-1)
	if cap(r.buf) > len(r.page) {
		c.s.bufs.put(r.buf)
	}
	r.typ, r.flags, r.cookie, r.off, r.length, r.errno = 0, 0, 0, 0, 0, 0
	r.buf, r.c = nil, nil
	c.s.reqs.Put(r)
}

// appendReply appends r's reply to buf.
func (c *conn) appendReply(r *request, buf []byte) []byte {
	structuredReply := c.structured && (r.typ == cmdRead || r.typ == cmdBlockStatus)
	switch {
	case !structuredReply:
		buf = binary.BigEndian.AppendUint32(buf, magicSimple)
		buf = binary.BigEndian.AppendUint32(buf, r.errno)
		buf = binary.BigEndian.AppendUint64(buf, r.cookie)
		if r.typ == cmdRead && r.errno == 0 {
			buf = append(buf, r.buf...)
		}
	case r.errno != 0:
		msg := "request failed"
		buf = chunkHeader(buf, chunkFlagDone, chunkError, r.cookie, uint32(6+len(msg)))
		buf = binary.BigEndian.AppendUint32(buf, r.errno)
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(msg)))
		buf = append(buf, msg...)
	case r.typ == cmdRead:
		buf = chunkHeader(buf, chunkFlagDone, chunkOffsetData, r.cookie, uint32(8+len(r.buf)))
		buf = binary.BigEndian.AppendUint64(buf, r.off)
		buf = append(buf, r.buf...)
	default: // BLOCK_STATUS: everything is allocated data (status 0)
		n := min(uint64(r.length), c.exp.Size-r.off)
		buf = chunkHeader(buf, chunkFlagDone, chunkBlockStatus, r.cookie, 12)
		buf = binary.BigEndian.AppendUint32(buf, metaBaseAllocationID)
		buf = binary.BigEndian.AppendUint32(buf, uint32(n))
		buf = binary.BigEndian.AppendUint32(buf, 0)
	}
	return buf
}

func chunkHeader(b []byte, flags, typ uint16, cookie uint64, n uint32) []byte {
	b = binary.BigEndian.AppendUint32(b, magicStructured)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, cookie)
	return binary.BigEndian.AppendUint32(b, n)
}

// bufPool holds request data buffers by power-of-two size class, so
// steady traffic allocates nothing.
type bufPool [27]sync.Pool // classes 1 B … 64 MiB

func sizeClass(n int) int { return bits.Len(uint(n - 1)) }

func (p *bufPool) get(n int) []byte {
	cl := sizeClass(n)
	if n == 0 || cl >= len(p) {
		return make([]byte, n)
	}
	if b, ok := p[cl].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<cl)
}

func (p *bufPool) put(b []byte) {
	cl := sizeClass(cap(b))
	if cap(b) > 0 && cl < len(p) && cap(b) == 1<<cl {
		p[cl].Put(&b)
	}
}
