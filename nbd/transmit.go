package nbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync"
	"time"

	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// The transmission phase: reading, validating and executing requests.

// request is one transmission-phase request in flight. Requests are
// pooled; answer recycles them.
type request struct {
	typ    nbdproto.Cmd
	flags  nbdproto.CmdFlags
	cookie uint64
	off    uint64
	length uint32
	buf    []byte         // WRITE payload or READ destination
	errno  nbdproto.Errno // set by validation: answer without executing
	start  time.Time      // header read (only with Server.Latency)

	c    *conn
	done func(error) // r.pageRead, bound once per pooled request
	// extents are a BLOCK_STATUS answer: length and flags, in turn.
	extents []uint32
	// page holds READ and WRITE data of up to a page, so the common
	// request needs no buffer from bufs.
	page [pageid.Size]byte
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
	s.transmittingConns.Add(1)
	defer s.transmittingConns.Add(-1)
	s.Busy.AddConn(1)
	defer s.Busy.AddConn(-1)
	s.Procs.Other() // a second connection needs every P
	bw := pipeline.NewBatchWriter(c.nc, 4<<20, func(error) { sockio.Close(c.raw) })
	c.bw = bw
	c.pr, _ = s.Backend.(PageReader)
	c.pw, _ = s.Backend.(PageWriter)
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
	defer c.release()
	var h [nbdproto.RequestHeaderLen]byte
	for {
		c.need(nbdproto.RequestHeaderLen)
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				s.ProtocolViolations.Add(1)
				return fmt.Errorf("%w: connection closed inside a request header", errProtocol)
			}
			return err
		}
		s.Stages.Stamp(stages.HostRequestRead)
		var hdr nbdproto.Request
		if err := hdr.Decode(h[:]); err != nil {
			s.ProtocolViolations.Add(1)
			return fmt.Errorf("%w: %w", errProtocol, err)
		}
		r := s.newRequest(c)
		r.typ, r.flags, r.cookie, r.off, r.length = hdr.Cmd, hdr.Flags, hdr.Cookie, hdr.Offset, hdr.Length
		if s.Latency != nil {
			r.start = time.Now()
		}
		s.Requests.Add(1)
		if r.typ == nbdproto.CmdDisc {
			s.reqs.Put(r)
			return nil // outstanding requests finish in transmit
		}
		c.inflight.Add(1)
		s.Busy.Add(1)
		if r.typ == nbdproto.CmdWrite {
			if r.length > s.MaxRequest {
				// Refuse it, but keep the stream in step if we can.
				r.errno = nbdproto.EOVERFLOW
				if n := r.length; n > maxDiscard {
					c.release()
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
					c.uncount(r)
					c.recycle(r)
					return err
				}
			}
		}
		if r.errno == 0 {
			r.errno = c.validate(r)
		}
		if r.errno != 0 {
			s.Procs.Other()
			c.release() // answer may wait for the client
			c.answer(r, true)
			continue
		}
		c.hold()
		if r.typ == nbdproto.CmdRead {
			r.buf = c.data(r, int(r.length))
			if c.readPage(r) {
				continue
			}
		}
		s.Procs.Other()
		if r.typ == nbdproto.CmdWrite && c.writePage(r) {
			continue
		}
		select {
		case work <- r:
		default:
			c.release() // the workers may wait for what the cork holds
			work <- r
		}
		if c.fast != nil {
			// The worker is queued on this thread's P: the next wait
			// must not hold it (sockio.Reader.Handed).
			c.fast.Handed()
		}
	}
}

// readPage runs a READ of up to pagestore.MaxAsyncPages whole pages on
// the reader's path if it can: hits are answered now, misses when their
// pages arrive (pageRead). It reports false when a worker must take the
// request: a stream, an unaligned or larger read, or one that would wait.
func (c *conn) readPage(r *request) bool {
	if c.pr == nil || !fewPages(r) || c.streams(r) {
		return false
	}
	if c.nasync.Add(1) > maxConnAsync {
		c.nasync.Add(-1)
		return false
	}
	c.pending.Add(1)
	c.s.Stages.Stamp(stages.HostDispatched)
	finished, err := c.pr.GetAsync(pageid.MakeKey(c.exp.Volume, r.off/pageid.Size), r.buf, r.done)
	if errors.Is(err, pagestore.ErrWouldBlock) {
		c.nasync.Add(-1)
		c.pending.Done()
		return false
	}
	if finished && err == nil && c.s.Busy.Lone() && c.s.transmittingConns.Load() == 1 {
		c.s.Procs.Hit()
	} else {
		c.s.Procs.Other()
	}
	if finished {
		c.pageDone(r, err, true)
	}
	if c.fast != nil && c.s.PollFor > 0 {
		// After a miss the memory node polls for the next one (its
		// PollFor); a host spinning too would take the core it needs.
		c.fast.Cold(!finished)
	}
	return true
}

// fewPages reports whether r covers whole, aligned pages, few enough
// (pagestore.MaxAsyncPages) for the reader to run it.
func fewPages(r *request) bool {
	return r.length%pageid.Size == 0 && r.length <= pagestore.MaxAsyncPages*pageid.Size && r.off%pageid.Size == 0
}

// streams reports whether READ r is served as a stream (StreamFrom).
func (c *conn) streams(r *request) bool {
	if c.s.StreamFrom == 0 || r.length < c.s.StreamFrom {
		return false
	}
	_, ok := c.s.Backend.(StreamReader)
	return ok
}

// writePage runs a WRITE of up to pagestore.MaxAsyncPages whole pages on
// the reader's path when the cache can take the pages without waiting;
// its reply is held back like a hit's. It reports false when a worker
// must take the request: FUA (it waits for a write-back), an unaligned
// or larger write, or a page the cache cannot take at once (the worker
// writes every page again: the request is not answered yet, so no reader
// may count on any of it).
func (c *conn) writePage(r *request) bool {
	if c.pw == nil || !fewPages(r) || r.flags&nbdproto.CmdFlagFUA != 0 {
		return false
	}
	err := c.pw.PutNow(pageid.MakeKey(c.exp.Volume, r.off/pageid.Size), r.buf)
	if errors.Is(err, pagestore.ErrWouldBlock) {
		return false
	}
	if err != nil {
		c.failed(r, err)
	}
	c.answerFromReader(r, true)
	if c.fast != nil && c.s.PollFor > 0 {
		c.fast.Cold(false) // as after a hit: the client has its answer
	}
	return true
}

// answerFromReader queues r's reply from a goroutine that must not wait
// for the network (the connection's reader, or the page store's remote
// reader): if the reply buffer is full (the client is not reading), a
// goroutine answers instead.
func (c *conn) answerFromReader(r *request, later bool) {
	if !c.tryAnswer(r, later) {
		c.pending.Add(1)
		go func() {
			defer c.pending.Done()
			c.answer(r, false)
		}()
	}
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
	c.answerFromReader(r, later)
}

// need writes the replies held back so far, and releases the Cork, if
// the next n bytes of input are not buffered yet: the read may wait, and
// no reply or request may wait behind it. Replies made on the reader are
// held back while requests are buffered, so a burst is answered with one
// write.
func (c *conn) need(n int) {
	if c.r.Buffered() < n {
		c.release()
		if c.s.Stages != nil && c.bw.Queued() > 0 {
			c.s.Stages.Stamp(stages.HostReplyWritten)
		}
		c.bw.Flush()
	}
}

// hold holds the server's Cork while more requests are buffered behind
// the one the reader handles: the requests this burst sends the memory
// nodes leave together once the reader runs dry (need), one write per
// node (docs/decisions.md, 48). A lone request leaves at once as before,
// and so does every request while the server has other connections:
// their readers' holds would hold each other's requests, each until the
// next release of any, and one descheduled in a burst everyone's.
func (c *conn) hold() {
	if !c.corked && c.s.Cork != nil && c.r.Buffered() >= nbdproto.RequestHeaderLen && c.s.transmittingConns.Load() == 1 {
		c.corked = true
		c.s.Cork.Hold()
	}
}

// release lets go of the Cork, writing what it held: before the reader
// does anything that may wait.
func (c *conn) release() {
	if c.corked {
		c.corked = false
		c.s.Cork.Release()
	}
}

// validate checks a request before any backend sees it (nbdkit's rule).
func (c *conn) validate(r *request) nbdproto.Errno {
	allowed := nbdproto.CmdFlagFUA
	switch r.typ {
	case nbdproto.CmdRead:
		if c.structured {
			allowed |= nbdproto.CmdFlagDF
		}
	case nbdproto.CmdWriteZeroes:
		allowed |= nbdproto.CmdFlagNoHole | nbdproto.CmdFlagFastZero
	case nbdproto.CmdBlockStatus:
		allowed |= nbdproto.CmdFlagReqOne
	case nbdproto.CmdWrite, nbdproto.CmdFlush, nbdproto.CmdTrim, nbdproto.CmdCache:
	default:
		return nbdproto.EINVAL
	}
	if r.flags&^allowed != 0 {
		return nbdproto.EINVAL
	}
	if r.typ == nbdproto.CmdFlush {
		if r.off != 0 || r.length != 0 {
			return nbdproto.EINVAL
		}
		return 0
	}
	if r.length == 0 {
		return nbdproto.EINVAL
	}
	if r.typ == nbdproto.CmdRead && r.length > c.s.MaxRequest {
		return nbdproto.EOVERFLOW
	}
	writes := r.typ == nbdproto.CmdWrite || r.typ == nbdproto.CmdTrim || r.typ == nbdproto.CmdWriteZeroes
	if writes && c.exp.ReadOnly {
		return nbdproto.EPERM
	}
	if end, carry := bits.Add64(r.off, uint64(r.length), 0); carry != 0 || end > c.exp.Size {
		if r.typ == nbdproto.CmdWrite || r.typ == nbdproto.CmdWriteZeroes {
			return nbdproto.ENOSPC // the spec's choice for writes past the end
		}
		return nbdproto.EINVAL
	}
	if r.typ == nbdproto.CmdBlockStatus && !c.metaOK {
		return nbdproto.EINVAL
	}
	if r.typ == nbdproto.CmdWriteZeroes && r.flags&nbdproto.CmdFlagFastZero != 0 && r.flags&nbdproto.CmdFlagNoHole != 0 {
		return nbdproto.ENOTSUP // zeroes that must be allocated are written, not fast
	}
	return 0
}

func (c *conn) execute(r *request) {
	ctx := c.s.ctx
	vol := c.exp.Volume
	var err error
	switch r.typ {
	case nbdproto.CmdRead:
		if c.streams(r) {
			err = c.s.Backend.(StreamReader).ReadStream(ctx, vol, r.off, r.buf)
		} else {
			err = c.s.Backend.ReadRange(ctx, vol, r.off, r.buf)
		}
	case nbdproto.CmdWrite:
		err = c.s.Backend.WriteRange(ctx, vol, r.off, r.buf)
	case nbdproto.CmdFlush:
		err = c.s.Backend.Flush(ctx)
	case nbdproto.CmdTrim:
		err = c.s.Backend.ZeroRange(ctx, vol, r.off, uint64(r.length), false)
	case nbdproto.CmdWriteZeroes:
		err = c.s.Backend.ZeroRange(ctx, vol, r.off, uint64(r.length), r.flags&nbdproto.CmdFlagNoHole != 0)
	case nbdproto.CmdCache:
		err = c.cache(ctx, r)
	case nbdproto.CmdBlockStatus:
		err = c.blockStatus(ctx, r)
	}
	if err == nil && r.flags&nbdproto.CmdFlagFUA != 0 && r.typ != nbdproto.CmdRead && r.typ != nbdproto.CmdCache && r.typ != nbdproto.CmdBlockStatus {
		err = c.s.Backend.Flush(ctx)
	}
	if err != nil {
		c.failed(r, err)
	}
	c.answer(r, false)
}

// maxExtents bounds one BLOCK_STATUS answer (the client asks again
// from where it ends).
const maxExtents = 1 << 14

// blockStatus fills r.extents from the backend's Mapper: every run data
// if it has none. With REQ_ONE, one extent.
func (c *conn) blockStatus(ctx context.Context, r *request) error {
	m, ok := c.s.Backend.(Mapper)
	if !ok {
		r.extents = append(r.extents, r.length, 0)
		return nil
	}
	most := maxExtents
	if r.flags&nbdproto.CmdFlagReqOne != 0 {
		most = 1
	}
	err := m.Map(ctx, c.exp.Volume, r.off, uint64(r.length), func(_, n uint64, hole bool) {
		if len(r.extents) >= 2*most {
			return
		}
		flags := uint32(0)
		if hole {
			flags = nbdproto.StateHole | nbdproto.StateZero
		}
		r.extents = append(r.extents, uint32(n), flags)
	})
	if err == nil && len(r.extents) == 0 {
		r.extents = append(r.extents, r.length, 0)
	}
	return err
}

func (c *conn) failed(r *request, err error) {
	r.errno = errnoOf(err)
	c.s.Errors.Add(1)
	c.s.Log.Warn("nbd: request failed", "cmd", r.typ.String(), "offset", r.off, "length", r.length, "err", err)
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
func errnoOf(err error) nbdproto.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pageid.ErrOutOfRange),
		errors.Is(err, pageid.ErrNoVolume):
		return nbdproto.EINVAL
	case errors.Is(err, pageid.ErrNoMemory), errors.Is(err, pageid.ErrNoSpace):
		return nbdproto.ENOSPC
	case errors.Is(err, context.Canceled):
		return nbdproto.ESHUTDOWN
	}
	return nbdproto.EIO
}
