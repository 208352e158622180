package pageproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// Backend is what the server executes requests against; *pagestore.Store
// implements it.
type Backend interface {
	Get(ctx context.Context, k pageid.Key, dst []byte) error
	Put(ctx context.Context, k pageid.Key, src []byte) error
	Flush(ctx context.Context) error
}

// VolumeLister is a Backend that can list its volumes. Without it
// VOLUMES is answered with StatusUnknownOp, and clients' errors name no
// volumes.
type VolumeLister interface {
	Volumes() []pageid.VolumeInfo
}

var (
	_ Backend      = (*pagestore.Store)(nil)
	_ VolumeLister = (*pagestore.Store)(nil)
)

// Server serves the page protocol. Requests from all connections wait in
// one queue for a fixed pool of workers; each worker runs one request at a
// time and blocks on its own cache misses, like the application threads of
// the PD3 page server. One reader and one writer goroutine own each
// connection; replies leave in completion order.
type Server struct {
	Backend Backend
	// Workers is the size of the worker pool (default: one per CPU).
	Workers int
	// MaxInFlight bounds requests queued or running per connection
	// (default 256); the reader stops reading while it is reached.
	MaxInFlight int
	Log         *slog.Logger
	// Mirror, if set, is shown every connection's request bytes as they
	// are read (the DPU agent's tap).
	Mirror mirror.Mirror
	// Busy, if set, counts this server's requests from being read to
	// their reply being queued, for the process's other readers that wait
	// in poll(2) only while it serves one request (sockio.Reader.DirectIf).
	Busy *sockio.Busy
	// Procs, if set, is told of every request (procgov.Governor.Other):
	// a page request needs every P back. Absent, nothing changes.
	Procs *procgov.Governor

	queue   chan *request
	startMu sync.Once
	ctx     context.Context
	cancel  context.CancelFunc

	group netsrv.Group
	wwg   sync.WaitGroup // workers

	// Latency, if set, receives each request's time from its header being
	// read to its reply being queued (metrics). It runs on a worker: it
	// must be quick and must not block.
	Latency func(Op, time.Duration)

	// Counters.
	Requests, Errors atomic.Uint64
}

type request struct {
	hdr   Header
	c     *conn
	start time.Time // header read (only with Server.Latency)
	data  [pageid.Size]byte
}

type conn struct {
	nc   net.Conn
	rd   io.Reader     // nc, or nc tapped by the mirror
	free chan *request // requests not in flight
	bw   *pipeline.BatchWriter
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func (s *Server) start() {
	s.startMu.Do(func() {
		if s.Workers <= 0 {
			s.Workers = runtime.NumCPU()
		}
		if s.MaxInFlight <= 0 {
			s.MaxInFlight = 256
		}
		s.ctx, s.cancel = context.WithCancel(context.Background())
		s.queue = make(chan *request, 4096)
		for i := 0; i < s.Workers; i++ {
			s.wwg.Add(1)
			go s.worker()
		}
	})
}

// Serve accepts connections on ln until ctx ends or Close is called.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.start()
	return s.group.Serve(ctx, ln, s.serveConn)
}

// Close stops listeners, connections and workers.
func (s *Server) Close() error {
	s.start()
	s.cancel() // requests still running fail fast instead of holding Close
	s.group.Close()
	close(s.queue)
	s.wwg.Wait()
	return nil
}

func (s *Server) serveConn(nc net.Conn) {
	// The reader waits in the network poller, never in poll(2) (sockio):
	// it hands every request to a worker, which would find the reader's
	// P held while the reader slept in poll(2) — at queue depth 1 too
	// (docs/decisions.md, 13).
	var rd io.Reader = nc
	if s.Mirror != nil {
		st := s.Mirror.NewStream()
		defer st.Close()
		rd = mirror.Conn{Conn: nc, S: st, R: rd}
	}
	c := &conn{nc: nc, rd: rd, free: make(chan *request, s.MaxInFlight)}
	// Replies are appended by the workers: a lone reply is written by its
	// worker, others by the writer goroutine, which batches them.
	c.bw = pipeline.NewBatchWriter(nc, 512<<10, func(error) { sockio.Close(nc) })
	for i := 0; i < s.MaxInFlight; i++ {
		c.free <- &request{c: c}
	}
	s.Busy.AddConn(1)
	netsrv.LogEnd(s.log(), "pageproto", nc, s.read(c))
	s.Busy.AddConn(-1)
	// Wait for every request to come back, then flush the replies owed.
	for i := 0; i < s.MaxInFlight; i++ {
		<-c.free
	}
	c.bw.Close()
}

func (s *Server) read(c *conn) error {
	r := bufio.NewReaderSize(c.rd, 128<<10)
	var h Header
	for {
		b, err := r.Peek(HeaderSize)
		if err != nil {
			if len(b) > 0 && errors.Is(err, io.EOF) {
				return fmt.Errorf("%w: connection closed inside a header", ErrFraming)
			}
			return err
		}
		if err := h.DecodeRequest(b); err != nil {
			// Replies already owed are still sent; serveConn then closes.
			return err
		}
		r.Discard(HeaderSize)
		req := <-c.free
		s.Busy.Add(1)
		s.Procs.Other()
		req.hdr = h
		if s.Latency != nil {
			req.start = time.Now()
		}
		if n := h.Op.PayloadLen(); n > 0 {
			if _, err := io.ReadFull(r, req.data[:n]); err != nil {
				s.Busy.Add(-1)
				c.free <- req
				return fmt.Errorf("reading %v payload: %w", h.Op, err)
			}
		}
		s.queue <- req
	}
}

func (s *Server) worker() {
	defer s.wwg.Done()
	var hb [HeaderSize]byte
	for req := range s.queue {
		s.execute(req)
		req.hdr.EncodeResponse(hb[:])
		if buf, err := req.c.bw.Begin(); err == nil {
			buf = append(buf, hb[:]...)
			buf = append(buf, req.data[:req.hdr.ResponsePayloadLen()]...)
			req.c.bw.EndInFlight(buf, cap(req.c.free)-len(req.c.free))
		}
		if s.Latency != nil {
			s.Latency(req.hdr.Op, time.Since(req.start))
		}
		s.Busy.Add(-1)
		req.c.free <- req
	}
}

func (s *Server) execute(req *request) {
	s.Requests.Add(1)
	var err error
	switch req.hdr.Op {
	case OpGet:
		err = s.Backend.Get(s.ctx, req.hdr.ID, req.data[:])
	case OpPut:
		err = s.Backend.Put(s.ctx, req.hdr.ID, req.data[:])
	case OpSync:
		err = s.Backend.Flush(s.ctx)
	case OpVolumes:
		err = ErrUnknownOp
		if l, ok := s.Backend.(VolumeLister); ok {
			EncodeVolumes(req.data[:], l.Volumes())
			err = nil
		}
	default:
		err = ErrUnknownOp
	}
	req.hdr.Status = statusOf(err)
	if err != nil {
		s.Errors.Add(1)
		if req.hdr.Status == StatusIO || req.hdr.Status == StatusInternal {
			s.log().Warn("pageproto: request failed", "op", req.hdr.Op.String(), "id", req.hdr.ID.String(), "err", err)
		}
	}
}

// statusOf is the one place that maps errors to page-protocol statuses.
func statusOf(err error) Status {
	switch {
	case err == nil:
		return StatusOK
	case errors.Is(err, pageid.ErrNoVolume):
		return StatusNoVolume
	case errors.Is(err, pageid.ErrOutOfRange):
		return StatusOutOfRange
	case errors.Is(err, ErrUnknownOp):
		return StatusUnknownOp
	case errors.Is(err, pagestore.ErrBadPage):
		return StatusInternal
	}
	return StatusIO
}
