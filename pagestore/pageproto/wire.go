package pageproto

// Wire format of the page-server protocol: fixed 16-byte little-endian
// headers, so a parser following a byte stream (the DPU agent's) knows every
// frame's length from its first two bytes.
//
// Request:
//
//	off size field
//	0   1    magic   0x50
//	1   1    op      GET=1, PUT=2, SYNC=3; any other value is a header-only
//	                 frame answered with StatusUnknownOp
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
//	16  4096 data    GET with StatusOK only
//
// Protocol flow: no handshake; the client pipelines requests and the server
// answers each exactly once, in any order (match by tag). SYNC returns once
// every PUT acknowledged before the SYNC was sent is at the memory node.
// A bad magic or non-zero flags is a framing violation: the server closes
// that connection and no other.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/pd3-go/pd3/memnode"
)

// Sizes.
const (
	HeaderSize = 16
	PageSize   = memnode.PageSize

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
)

func (o Op) String() string {
	switch o {
	case OpGet:
		return "GET"
	case OpPut:
		return "PUT"
	case OpSync:
		return "SYNC"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// PayloadLen is the request payload that follows a header with op o.
func (o Op) PayloadLen() int {
	if o == OpPut {
		return PageSize
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
	ErrNoVolume   = errors.New("pageproto: no such volume")
	ErrOutOfRange = errors.New("pageproto: page out of range")
	ErrIO         = errors.New("pageproto: I/O error at the server")
	ErrUnknownOp  = errors.New("pageproto: unknown operation")
	ErrInternal   = errors.New("pageproto: internal server error")
	// ErrFraming is a byte stream that is not a sequence of frames.
	ErrFraming = errors.New("pageproto: framing violation")
)

// Err returns the error for s, nil for StatusOK.
func (s Status) Err() error {
	switch s {
	case StatusOK:
		return nil
	case StatusNoVolume:
		return ErrNoVolume
	case StatusOutOfRange:
		return ErrOutOfRange
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
	ID     memnode.Key
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
	h.ID = memnode.Key(binary.LittleEndian.Uint64(b[8:]))
	return nil
}

// DecodeResponse parses a response header; an error is a framing violation.
func (h *Header) DecodeResponse(b []byte) error {
	if len(b) < HeaderSize {
		return fmt.Errorf("%w: short header (%d bytes)", ErrFraming, len(b))
	}
	if b[0] != RespMagic {
		return fmt.Errorf("%w: bad magic %#x", ErrFraming, b[0])
	}
	h.Op = Op(b[1])
	h.Status = Status(binary.LittleEndian.Uint16(b[2:]))
	h.Tag = binary.LittleEndian.Uint32(b[4:])
	h.ID = memnode.Key(binary.LittleEndian.Uint64(b[8:]))
	return nil
}

// ResponsePayloadLen is the payload following a response header.
func (h *Header) ResponsePayloadLen() int {
	if h.Op == OpGet && h.Status == StatusOK {
		return PageSize
	}
	return 0
}
