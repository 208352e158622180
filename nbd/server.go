package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pageid"
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

// PageReader is implemented by backends that can serve a read of up to
// pagestore.MaxAsyncPages whole pages without blocking
// (*pagestore.Store): hits are copied at once, misses finish with done on
// the remote's reader goroutine. The connection reader then runs such
// reads to completion itself, with no worker hand-off; ErrWouldBlock
// sends a read to the workers instead.
type PageReader interface {
	GetAsync(k pageid.Key, dst []byte, done func(error)) (finished bool, err error)
}

var _ PageReader = (*pagestore.Store)(nil)

// StreamReader is implemented by backends that can serve a large read
// without caching its pages (*pagestore.Store.ReadStream: cached pages
// are copied from the cache, prefetched ones taken from the Loading Zone,
// the rest read from the remote into the reply).
//
// Absent: every READ goes through Backend.ReadRange, which caches.
type StreamReader interface {
	ReadStream(ctx context.Context, vol uint16, off uint64, p []byte) error
}

var _ StreamReader = (*pagestore.Store)(nil)

// PageWriter is implemented by backends that can take a write of up to
// pagestore.MaxAsyncPages whole pages without blocking
// (*pagestore.Store): the connection reader then writes such pages into
// the cache itself, with no worker hand-off;
// ErrWouldBlock (a page in use, only dirty frames left to evict) sends
// the write to the workers instead.
type PageWriter interface {
	PutNow(k pageid.Key, src []byte) error
}

var _ PageWriter = (*pagestore.Store)(nil)

// Mapper is implemented by backends that know which ranges of a volume
// hold storage (*pagestore.Store.Map): BLOCK_STATUS answers
// base:allocation with holes (hole and zero) and data.
//
// Absent: every range is data.
type Mapper interface {
	Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error
}

var _ Mapper = (*pagestore.Store)(nil)

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
	// TLS, if set, offers NBD_OPT_STARTTLS with this configuration (its
	// certificates; ClientCAs and ClientAuth for client certificates).
	// Without it STARTTLS is refused as unsupported.
	TLS *tls.Config
	// TLSRequired refuses every option but STARTTLS and ABORT until TLS
	// is on (the protocol's rule), so no export name or data crosses in
	// clear; an EXPORT_NAME in clear, which cannot be refused with a
	// reply, ends the connection.
	TLSRequired bool
	// Latency, if set, receives each answered request's time from its
	// header being read to its reply being queued (metrics). It runs on
	// the request's path: it must be quick and must not block.
	Latency func(nbdproto.Cmd, time.Duration)
	// PollFor is how long a connection whose requests ran dry keeps
	// polling for the next one before it sleeps in poll(2)
	// (sockio.Reader.Spin); 0 sleeps at once. Only after a read answered
	// from the cache: after a miss the memory node is the one polling, and
	// a host spinning too takes the core it needs. One connection of the
	// server polls at a time.
	PollFor time.Duration
	// Busy, if set, counts this server's requests from being read to
	// being answered, for the readers that wait in poll(2) only while
	// their process serves one request (sockio.Reader.DirectIf).
	Busy *sockio.Busy
	// Procs, if set, is told of every request: a read answered from the
	// cache while it was the only request in flight (Hit), or anything
	// else (Other). Absent, the process keeps its GOMAXPROCS.
	Procs *procgov.Governor
	// StreamFrom: READs of at least this many bytes are served with the
	// backend's StreamReader, whose pages are not cached; 0 caches every
	// read. The client's own page cache holds what it just read, so a
	// second copy in the host's cache only evicts what the client lacks
	// (docs/decisions.md, 1).
	StreamFrom uint32
	// Cork, if set, is the one the backend's memory-node sessions share:
	// a connection holds it while more requests are buffered behind the
	// one it handles, so that a burst's requests for one node leave in
	// one write (docs/decisions.md, 48).
	Cork *pipeline.Cork

	group netsrv.Group
	// spinners: the one place to poll (PollFor).
	spinners sockio.Spinners
	bufs     bufPool
	reqs     sync.Pool // *request
	ctx      context.Context
	cancel   context.CancelFunc
	once     sync.Once
	// transmitting, if set, sees each connection as its transmission
	// phase begins (tests).
	transmitting func(*conn)

	// Counters.
	Connections, Requests, Errors, ProtocolViolations atomic.Uint64
	// transmittingConns counts the connections past their handshake: a
	// hit is lone for Procs only when it is the only one (several
	// connections at one P would each wait for the runtime's monitor to
	// hand the P over: p99 of 30 ms at fio's Q8T8).
	transmittingConns atomic.Int32
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
	s     *Server
	nc    net.Conn  // the connection: raw, or TLS over raw after STARTTLS
	raw   net.Conn  // the socket
	rawRd io.Reader // raw's reader (poll(2)-based when possible)
	// fast is rawRd when it waits in poll(2) (nil otherwise): told
	// whether the last read was a miss, so it spins only after hits.
	fast       *sockio.Reader
	stream     mirror.Stream
	tlsOn      bool
	r          *bufio.Reader
	w          *bufio.Writer // handshake only
	structured bool
	noZeroes   bool
	metaExport string // export base:allocation was selected for
	metaOK     bool
	exp        Export

	bw      *pipeline.BatchWriter // replies (transmission phase)
	pr      PageReader            // nil: every read goes to a worker
	pw      PageWriter            // nil: every write goes to a worker
	pending sync.WaitGroup        // reads started with PageReader
	nasync  atomic.Int32          // reads started with PageReader, in flight
	// inflight counts requests read and not yet answered: a reply with
	// no other request in flight is written at once on the goroutine
	// that made it; others are queued for the writer, which batches.
	inflight atomic.Int32
	// corked: the reader holds the server's Cork (hold); reader only.
	corked bool
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
	c := &conn{s: s, nc: nc, raw: nc, rawRd: rd, fast: fast}
	if s.Mirror != nil {
		c.stream = s.Mirror.NewStream()
		defer c.stream.Close()
	}
	c.setConn(nc, rd)
	nc.SetDeadline(time.Now().Add(s.HandshakeTimeout))
	ok, err := c.handshake()
	if err != nil || !ok {
		netsrv.LogEnd(s.Log, "nbd", nc, err, "phase", "handshake")
		return
	}
	nc.SetDeadline(time.Time{})
	if fast != nil {
		// While the host serves one request at most, the reader waits in
		// poll(2): a request wakes this thread directly, and a hit is
		// answered with no scheduler hop. Under load it waits in the
		// network poller and leaves its P to the requests (sockio), as
		// it does right after handing a request to a worker (Handed).
		fast.DirectIf(s.Busy)
		fast.Spin(s.PollFor, &s.spinners)
	}
	if s.transmitting != nil {
		s.transmitting(c)
	}
	err = c.transmit()
	if tc, ok := c.nc.(*tls.Conn); ok {
		// close_notify, so the client sees a clean end, not a cut.
		tc.SetWriteDeadline(time.Now().Add(time.Second))
		tc.CloseWrite()
	}
	netsrv.LogEnd(s.Log, "nbd", nc, err, "export", c.exp.Name)
}

// setConn makes nc, read through rd, the connection the protocol speaks
// on; the agent's mirror (if any) sees what is read from it in clear.
func (c *conn) setConn(nc net.Conn, rd io.Reader) {
	if c.stream != nil {
		rd = mirror.Conn{Conn: nc, S: c.stream, R: rd}
	}
	c.nc, c.r, c.w = nc, bufio.NewReaderSize(rd, 256<<10), bufio.NewWriter(nc)
}

// startTLS runs the TLS handshake after STARTTLS's ACK; negotiation goes
// on over TLS.
func (c *conn) startTLS() error {
	if c.r.Buffered() > 0 {
		// The client may not send anything between STARTTLS and its
		// TLS hello but the hello itself, which bufio would have eaten.
		c.s.ProtocolViolations.Add(1)
		return fmt.Errorf("%w: data after STARTTLS before the TLS handshake", errProtocol)
	}
	tc := tls.Server(netsrv.ReaderConn{Conn: c.raw, R: c.rawRd}, c.s.TLS)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("nbd: TLS handshake: %w", err)
	}
	c.tlsOn = true
	c.setConn(tc, tc)
	return nil
}
