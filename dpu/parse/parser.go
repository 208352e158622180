package parse

import (
	"errors"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
)

// Kind is what a request does to a page (PD3 Table 1).
type Kind uint8

// Access kinds. A read-modify-write counts as Read.
const (
	Read Kind = iota + 1
	Write
	Delete
)

func (k Kind) String() string {
	switch k {
	case Read:
		return "read"
	case Write:
		return "write"
	case Delete:
		return "delete"
	}
	return "?"
}

// Access is one page access parsed from a request stream.
type Access struct {
	Key  pageid.Key
	Kind Kind
}

// ErrLostSync is returned by a parser that can no longer follow its
// stream; the agent stops parsing that connection (the host is unaffected).
var ErrLostSync = errors.New("parse: lost the stream")

// Parser follows the byte stream of one client connection. Feed takes the
// bytes in arrival order, split anywhere, and appends the accesses of every
// request completed so far to out. It never panics on garbage; after an
// error it must not be fed again.
type Parser interface {
	Feed(b []byte, out []Access) ([]Access, error)
}

// PageParser parses the page-server protocol (pagestore/pageproto): GET is
// a Read, PUT a Write (its payload is skipped), SYNC and unknown ops carry
// no access. A bad magic or flags loses sync: the server closes such a
// connection too.
type PageParser struct {
	hdr  [pageproto.HeaderSize]byte
	have int
	skip int
	dead bool
}

var _ Parser = (*PageParser)(nil)

// Feed implements Parser.
func (p *PageParser) Feed(b []byte, out []Access) ([]Access, error) {
	if p.dead {
		return out, ErrLostSync
	}
	for len(b) > 0 {
		if p.skip > 0 {
			n := min(p.skip, len(b))
			p.skip -= n
			b = b[n:]
			continue
		}
		n := copy(p.hdr[p.have:], b)
		p.have += n
		b = b[n:]
		if p.have < pageproto.HeaderSize {
			break
		}
		p.have = 0
		var h pageproto.Header
		if err := h.DecodeRequest(p.hdr[:]); err != nil {
			p.dead = true
			return out, ErrLostSync
		}
		switch h.Op {
		case pageproto.OpGet:
			out = append(out, Access{h.ID, Read})
		case pageproto.OpPut:
			out = append(out, Access{h.ID, Write})
		}
		p.skip = h.Op.PayloadLen()
	}
	return out, nil
}
