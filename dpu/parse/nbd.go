package parse

import (
	"encoding/binary"

	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pageid"
)

// NBDParser follows the client side of an NBD connection: the handshake
// (client flags, then options until EXPORT_NAME, or GO followed by the
// first request) to learn which export — hence which volume — the
// connection uses, then the transmission phase. READ and CACHE are reads,
// a WRITE is a write of each whole page it covers and a read of a
// partially covered one (read-modify-write); WRITE payloads are skipped.
// TRIM and WRITE_ZEROES produce nothing: the host discards those pages
// and its eviction notices keep Host View right. A request touches at most
// MaxPages pages' worth of accesses (the rest is not prefetched).
type NBDParser struct {
	// Resolve maps an export name ("" = the default) to its volume.
	Resolve func(name string) (uint16, bool)
	// MaxPages bounds the accesses emitted per request (default 1024).
	MaxPages int

	state  int
	buf    [28]byte
	have   int
	need   int    // bytes wanted in buf for the current item
	skip   uint64 // payload bytes to skip
	optBuf []byte // option data being collected (EXPORT_NAME, GO)
	optLen uint32
	opt    nbdproto.Opt
	vol    uint16
	goSent bool
	done   bool // DISC seen: any further byte is a lost stream
	dead   bool
}

const (
	npClientFlags = iota
	npOptionHeader
	npOptionData
	npRequest
)

// maxOptCollect bounds the option data the parser keeps (an export name).
const maxOptCollect = 4096 + 8

var _ Parser = (*NBDParser)(nil)

// Feed implements Parser.
func (p *NBDParser) Feed(b []byte, out []Access) ([]Access, error) {
	if p.dead {
		return out, ErrLostSync
	}
	if p.MaxPages <= 0 {
		p.MaxPages = 1024
	}
	for len(b) > 0 {
		if p.done { // bytes after DISC
			p.dead = true
			return out, ErrLostSync
		}
		if p.skip > 0 {
			n := min(p.skip, uint64(len(b)))
			if p.state == npOptionData && len(p.optBuf) < maxOptCollect {
				take := min(int(n), maxOptCollect-len(p.optBuf))
				p.optBuf = append(p.optBuf, b[:take]...)
			}
			p.skip -= n
			b = b[n:]
			if p.skip == 0 && p.state == npOptionData {
				if !p.optionDone() {
					return p.fail(out)
				}
			}
			continue
		}
		need := p.want()
		n := copy(p.buf[p.have:need], b)
		p.have += n
		b = b[n:]
		if p.have < need {
			break
		}
		p.have = 0
		var ok bool
		out, ok = p.item(out)
		if !ok {
			return p.fail(out)
		}
	}
	return out, nil
}

func (p *NBDParser) fail(out []Access) ([]Access, error) {
	p.dead = true
	return out, ErrLostSync
}

func (p *NBDParser) want() int {
	switch p.state {
	case npClientFlags:
		return 4
	case npOptionHeader:
		if p.goSent {
			return 4 // after GO: a request or another option, by magic
		}
		return nbdproto.OptionHeaderLen
	}
	return nbdproto.RequestHeaderLen
}

// item handles a complete fixed-size item in p.buf.
func (p *NBDParser) item(out []Access) ([]Access, bool) {
	switch p.state {
	case npClientFlags:
		p.state = npOptionHeader
		return out, true
	case npOptionHeader:
		if p.goSent {
			// Decide by magic, then re-read the whole item.
			p.goSent = false
			if binary.BigEndian.Uint32(p.buf[:4]) == nbdproto.MagicRequest {
				p.state = npRequest
			}
			p.have = 4
			return out, true
		}
		if binary.BigEndian.Uint64(p.buf[:8]) != nbdproto.MagicOption {
			return out, false
		}
		p.opt = nbdproto.Opt(binary.BigEndian.Uint32(p.buf[8:]))
		p.optLen = binary.BigEndian.Uint32(p.buf[12:])
		p.optBuf = p.optBuf[:0]
		if p.optLen == 0 {
			return out, p.optionDone()
		}
		p.state = npOptionData
		p.skip = uint64(p.optLen)
		return out, true
	}
	// A transmission request.
	var r nbdproto.Request
	if r.Decode(p.buf[:nbdproto.RequestHeaderLen]) != nil {
		return out, false
	}
	off, n := r.Offset, uint64(r.Length)
	switch r.Cmd {
	case nbdproto.CmdRead, nbdproto.CmdCache:
		out = p.pages(out, off, n, Read, Read)
	case nbdproto.CmdWrite:
		out = p.pages(out, off, n, Write, Read)
		p.skip = n
	case nbdproto.CmdDisc:
		p.done = true // nothing may follow
	}
	return out, true
}

// optionDone finishes an option whose data is in optBuf.
func (p *NBDParser) optionDone() bool {
	p.state = npOptionHeader
	var name string
	switch p.opt {
	case nbdproto.OptExportName:
		name = string(p.optBuf)
	case nbdproto.OptGo:
		if len(p.optBuf) < 4 {
			return false
		}
		l := int(binary.BigEndian.Uint32(p.optBuf))
		if 4+l > len(p.optBuf) {
			return false
		}
		name = string(p.optBuf[4 : 4+l])
	default:
		return true
	}
	vol, ok := p.Resolve(name)
	if !ok {
		// The server refuses an unknown export: GO may be retried, and an
		// EXPORT_NAME for it ends the connection.
		return p.opt == nbdproto.OptGo
	}
	p.vol = vol
	if p.opt == nbdproto.OptExportName {
		p.state = npRequest
	} else {
		p.goSent = true
	}
	return true
}

// pages appends one access per page of [off, off+n): whole for pages the
// range covers entirely, partial for the edges.
func (p *NBDParser) pages(out []Access, off, n uint64, whole, partial Kind) []Access {
	if n == 0 {
		return out
	}
	end := off + n
	for pg, i := off/pageid.Size, 0; pg*pageid.Size < end && i < p.MaxPages; pg, i = pg+1, i+1 {
		start := pg * pageid.Size
		k := whole
		if start < off || start+pageid.Size > end {
			k = partial
		}
		out = append(out, Access{pageid.MakeKey(p.vol, pg), k})
	}
	return out
}
