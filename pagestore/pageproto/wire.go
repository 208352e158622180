package pageproto

// Wire format of the page-server protocol: fixed 16-byte little-endian
// headers, so a parser following a byte stream (the DPU agent's) knows every
// frame's length from its first two bytes.
//
// Request:
//
//	off size field
//	0   1    magic   0x50
//	1   1    op      GET=1, PUT=2, SYNC=3, VOLUMES=4; any other value is a
//	                 header-only frame answered with StatusUnknownOp
//	2   2    flags   must be zero
//	4   4    tag     echoed in the response
//	8   8    id      page id: volume (16 bits) | page number (48 bits)
//	16  4096 data    PUT only
//
// Response:
//
//	off size field
//	0   1    magic   0x51
//	1   1    op      the request's op
//	2   2    status  Status
//	4   4    tag
//	8   8    id
//	16  4096 data    GET and VOLUMES with StatusOK only
//
// VOLUMES data (one page; what the server serves, for error messages and
// tools):
//
//	off size field
//	0   2    n       entries that follow
//	2   1    more    1 if volumes were left out for lack of room
//	3   -    n entries: id u16 | size u64 (bytes) | name length u8 | name
//
// Protocol flow: no handshake; the client pipelines requests and the server
// answers each exactly once, in any order (match by tag). SYNC returns once
// every PUT acknowledged before the SYNC was sent is at the memory node.
// A bad magic or non-zero flags is a framing violation: the server closes
// that connection and no other.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/pd3-go/pd3/pageid"
)

// Sizes.
const (
	HeaderSize = 16

	ReqMagic  = 0x50
	RespMagic = 0x51
)

// Op is a page-protocol operation.
type Op uint8

// Operations.
const (
	OpGet  Op = 1
	OpPut  Op = 2
	OpSync Op = 3
	// OpVolumes lists the served volumes (data: EncodeVolumes).
	OpVolumes Op = 4
)

func (o Op) String() string {
	switch o {
	case OpGet:
		return "GET"
	case OpPut:
		return "PUT"
	case OpSync:
		return "SYNC"
	case OpVolumes:
		return "VOLUMES"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// PayloadLen is the request payload that follows a header with op o.
func (o Op) PayloadLen() int {
	if o == OpPut {
		return pageid.Size
	}
	return 0
}

// Status is a per-request result.
type Status uint16

// Status codes.
const (
	StatusOK         Status = 0
	StatusNoVolume   Status = 1
	StatusOutOfRange Status = 2
	StatusIO         Status = 3
	StatusUnknownOp  Status = 4
	StatusInternal   Status = 5
)

// Errors a client sees, one per status.
var (
	ErrIO        = errors.New("pageproto: I/O error at the server")
	ErrUnknownOp = errors.New("pageproto: unknown operation")
	ErrInternal  = errors.New("pageproto: internal server error")
	// ErrFraming is a byte stream that is not a sequence of frames.
	ErrFraming = errors.New("pageproto: framing violation")
)

// Err returns the error for s, nil for StatusOK.
func (s Status) Err() error {
	switch s {
	case StatusOK:
		return nil
	case StatusNoVolume:
		return pageid.ErrNoVolume
	case StatusOutOfRange:
		return pageid.ErrOutOfRange
	case StatusIO:
		return ErrIO
	case StatusUnknownOp:
		return ErrUnknownOp
	}
	return ErrInternal
}

// Header is a decoded request or response header.
type Header struct {
	Op     Op
	Status Status // responses only
	Tag    uint32
	ID     pageid.Key
}

// EncodeRequest writes h as a request header into b[:HeaderSize].
func (h *Header) EncodeRequest(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = ReqMagic
	b[1] = byte(h.Op)
	binary.LittleEndian.PutUint16(b[2:], 0)
	binary.LittleEndian.PutUint32(b[4:], h.Tag)
	binary.LittleEndian.PutUint64(b[8:], uint64(h.ID))
}

// EncodeResponse writes h as a response header into b[:HeaderSize].
func (h *Header) EncodeResponse(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = RespMagic
	b[1] = byte(h.Op)
	binary.LittleEndian.PutUint16(b[2:], uint16(h.Status))
	binary.LittleEndian.PutUint32(b[4:], h.Tag)
	binary.LittleEndian.PutUint64(b[8:], uint64(h.ID))
}

// DecodeRequest parses a request header; an error is a framing violation.
func (h *Header) DecodeRequest(b []byte) error {
	if len(b) < HeaderSize {
		return fmt.Errorf("%w: short header (%d bytes)", ErrFraming, len(b))
	}
	if b[0] != ReqMagic {
		return fmt.Errorf("%w: bad magic %#x", ErrFraming, b[0])
	}
	if f := binary.LittleEndian.Uint16(b[2:]); f != 0 {
		return fmt.Errorf("%w: flags %#x", ErrFraming, f)
	}
	h.Op = Op(b[1])
	h.Status = 0
	h.Tag = binary.LittleEndian.Uint32(b[4:])
	h.ID = pageid.Key(binary.LittleEndian.Uint64(b[8:]))
	return nil
}

// DecodeResponse parses a response header; an error is a framing violation.
func (h *Header) DecodeResponse(b []byte) error {
	if len(b) < HeaderSize {
		return fmt.Errorf("%w: short header (%d bytes)", ErrFraming, len(b))
	}
	if b[0] != RespMagic {
		return fmt.Errorf("%w: bad magic %#x%s", ErrFraming, b[0], peerHint(b))
	}
	h.Op = Op(b[1])
	h.Status = Status(binary.LittleEndian.Uint16(b[2:]))
	h.Tag = binary.LittleEndian.Uint32(b[4:])
	h.ID = pageid.Key(binary.LittleEndian.Uint64(b[8:]))
	return nil
}

// ResponsePayloadLen is the payload following a response header.
func (h *Header) ResponsePayloadLen() int {
	if (h.Op == OpGet || h.Op == OpVolumes) && h.Status == StatusOK {
		return pageid.Size
	}
	return 0
}

// EncodeVolumes writes vs into page (pageid.Size bytes) as VOLUMES data, as
// many as fit; it reports whether all did.
func EncodeVolumes(page []byte, vs []pageid.VolumeInfo) (all bool) {
	_ = page[pageid.Size-1]
	clear(page[:pageid.Size])
	off, n := 3, 0
	for _, v := range vs {
		name := v.Name
		if len(name) > 255 {
			name = name[:255]
		}
		if off+11+len(name) > pageid.Size || n == 0xffff {
			page[2] = 1
			break
		}
		binary.LittleEndian.PutUint16(page[off:], v.ID)
		binary.LittleEndian.PutUint64(page[off+2:], v.Size)
		page[off+10] = byte(len(name))
		copy(page[off+11:], name)
		off += 11 + len(name)
		n++
	}
	binary.LittleEndian.PutUint16(page, uint16(n))
	return page[2] == 0
}

// DecodeVolumes parses VOLUMES data; more reports volumes left out.
func DecodeVolumes(page []byte) (vs []pageid.VolumeInfo, more bool, err error) {
	if len(page) < 3 {
		return nil, false, fmt.Errorf("%w: VOLUMES data of %d bytes", ErrFraming, len(page))
	}
	n := int(binary.LittleEndian.Uint16(page))
	off := 3
	for i := 0; i < n; i++ {
		if off+11 > len(page) || off+11+int(page[off+10]) > len(page) {
			return nil, false, fmt.Errorf("%w: VOLUMES entry %d of %d overruns the page", ErrFraming, i, n)
		}
		l := int(page[off+10])
		vs = append(vs, pageid.VolumeInfo{
			ID:   binary.LittleEndian.Uint16(page[off:]),
			Size: binary.LittleEndian.Uint64(page[off+2:]),
			Name: string(page[off+11 : off+11+l]),
		})
		off += 11 + l
	}
	return vs, page[2] != 0, nil
}

// peerHint names the server a client reached instead of a page server,
// when the first bytes it sent tell: the usual mistake is a wrong port.
func peerHint(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("NBDMAGIC")):
		return ": this looks like an NBD server, not a page server (wrong port? NBD clients use nbd://HOST:PORT/EXPORT)"
	case bytes.HasPrefix(b, []byte("HTTP/")):
		return ": this looks like an HTTP server, not a page server (wrong port?)"
	case b[0] == 0x3D: // memnode's response magic
		return ": this looks like a memory node, not a page server (wrong port? the page server is pd3 up's --page address)"
	}
	return ""
}
