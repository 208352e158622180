package nbd

import (
	"encoding/binary"
	"math/bits"
	"sync"
	"time"

	"github.com/pd3-go/pd3/nbd/nbdproto"
)

// Replies: simple and structured, batched through the connection's
// BatchWriter, and the pooled buffers they carry.

// answer sends r's reply and recycles r and its buffer. With later the
// reply waits for the reader's next flush (see need).
func (c *conn) answer(r *request, later bool) {
	buf, err := c.bw.Begin()
	switch {
	case err == nil && !later && r.typ == nbdproto.CmdRead && r.errno == 0:
		// The data leaves from r.buf, beside the header, when it can
		// (pipeline.BatchWriter.EndPayload).
		buf = c.appendReadHeader(r, buf)
		c.bw.EndPayload(buf, r.buf, c.uncount(r))
	case err == nil:
		buf = c.appendReply(r, buf)
		c.end(buf, later, c.uncount(r))
	default:
		c.uncount(r)
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
		buf = c.appendReply(r, buf)
		c.end(buf, later, c.uncount(r))
	} else {
		c.uncount(r)
	}
	c.recycle(r)
	return true
}

// end queues a reply; inFlight is the connection's requests in flight
// with this one.
func (c *conn) end(buf []byte, later bool, inFlight int) {
	if later {
		c.bw.EndLater(buf)
	} else {
		c.bw.EndInFlight(buf, inFlight)
	}
}

// uncount ends r's accounting before its reply can reach the client: a
// client that sends its next request as soon as it has the answer must
// find the process lone again (sockio.Busy), or a hit at queue depth 1
// would count as one among others (procgov). It returns the requests
// that were in flight with r.
func (c *conn) uncount(r *request) int {
	if l := c.s.Latency; l != nil && !r.start.IsZero() {
		l(r.typ, time.Since(r.start))
		r.start = time.Time{}
	}
	c.s.Busy.Add(-1)
	return int(c.inflight.Add(-1)) + 1
}

// recycle returns r and its buffer once its reply is queued (uncount
// first).
func (c *conn) recycle(r *request) {
	if cap(r.buf) > len(r.page) {
		c.s.bufs.put(r.buf)
	}
	r.typ, r.flags, r.cookie, r.off, r.length, r.errno = 0, 0, 0, 0, 0, 0
	r.buf, r.c, r.extents = nil, nil, r.extents[:0]
	c.s.reqs.Put(r)
}

// appendReply appends r's reply to buf.
func (c *conn) appendReply(r *request, buf []byte) []byte {
	structuredReply := c.structured && (r.typ == nbdproto.CmdRead || r.typ == nbdproto.CmdBlockStatus)
	switch {
	case r.typ == nbdproto.CmdRead && r.errno == 0:
		buf = append(c.appendReadHeader(r, buf), r.buf...)
	case !structuredReply:
		buf = binary.BigEndian.AppendUint32(buf, nbdproto.MagicSimpleReply)
		buf = binary.BigEndian.AppendUint32(buf, uint32(r.errno))
		buf = binary.BigEndian.AppendUint64(buf, r.cookie)
	case r.errno != 0:
		msg := "request failed"
		buf = chunkHeader(buf, nbdproto.ChunkFlagDone, nbdproto.ChunkError, r.cookie, uint32(6+len(msg)))
		buf = binary.BigEndian.AppendUint32(buf, uint32(r.errno))
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(msg)))
		buf = append(buf, msg...)
	default: // BLOCK_STATUS: the extents execute found
		buf = chunkHeader(buf, nbdproto.ChunkFlagDone, nbdproto.ChunkBlockStatus, r.cookie, uint32(4+4*len(r.extents)))
		buf = binary.BigEndian.AppendUint32(buf, nbdproto.MetaBaseAllocationID)
		for _, w := range r.extents {
			buf = binary.BigEndian.AppendUint32(buf, w)
		}
	}
	return buf
}

// appendReadHeader appends the header of a successful read's reply, the
// data to follow.
func (c *conn) appendReadHeader(r *request, buf []byte) []byte {
	if !c.structured {
		buf = binary.BigEndian.AppendUint32(buf, nbdproto.MagicSimpleReply)
		buf = binary.BigEndian.AppendUint32(buf, 0)
		return binary.BigEndian.AppendUint64(buf, r.cookie)
	}
	buf = chunkHeader(buf, nbdproto.ChunkFlagDone, nbdproto.ChunkOffsetData, r.cookie, uint32(8+len(r.buf)))
	return binary.BigEndian.AppendUint64(buf, r.off)
}

func chunkHeader(b []byte, flags uint16, typ nbdproto.Chunk, cookie uint64, n uint32) []byte {
	b = binary.BigEndian.AppendUint32(b, nbdproto.MagicStructuredReply)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(typ))
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
