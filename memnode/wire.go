package memnode

// Wire format of the memory-node protocol. Everything is little-endian and
// fixed-size so that a decoder never allocates and a batch of requests can be
// parsed straight out of a read buffer.
//
// Request frame: a 32-byte header followed by PayloadLen bytes.
//
//	off size field
//	0   1    magic       0xD3
//	1   1    op          Op
//	2   2    volume      volume id (0 for volume-management ops)
//	4   4    payloadLen  bytes that follow the header
//	8   8    tag         chosen by the client, echoed in the response
//	16  8    offset      byte offset; PREFETCH: page key; CREATE, RESIZE:
//	                     volume size; DELETE: fencing token (0: none)
//	24  4    count       READ/PREFETCH/TRIM: bytes concerned
//	28  4    window      data ops: the key of the memory window that grants
//	                     the access; BIND and UNBIND: the window's key
//
// Response frame: a 16-byte header followed by PayloadLen bytes.
//
//	off size field
//	0   1    magic       0x3D
//	1   1    op          Op of the request
//	2   1    status      Status
//	3   1    reserved
//	4   4    payloadLen  bytes that follow the header
//	8   8    tag         the request's tag
//
// Protocol flow: the client sends HELLO (payload: u32 version, then the access
// token) and waits for its response; any other request before a successful
// HELLO is refused with StatusUnauthorised and the connection is closed. After
// that the client pipelines requests freely. The server executes the requests
// of one connection in order and answers them in order, so a WRITE followed by
// a READ of the same bytes on one connection always sees the write.
//
// Framing errors (bad magic, payload larger than MaxPayload) close the
// connection after a best-effort error response; every other error is per
// request and the connection goes on.
//
// Memory windows (protocol version 2; OneSidedMW's type-2 windows): a data
// op (READ, WRITE, PREFETCH, CAS, FAA, TRIM) names in its window field a
// window that the same connection bound with BIND — a byte range of one
// volume and the access allowed (read, write). The node keeps each
// connection's windows to itself, so a window key seen on one connection
// grants nothing on another, and a connection reaches only what its HELLO
// token was granted (Server.Grants). BIND payload: u64 length (0: to the end
// of the volume), u32 access (AccessRead|AccessWrite), u32 zero, u64
// fencing token (below); offset is
// the window's first byte, window its key (non-zero, chosen by the client,
// unique on the connection). BIND does not look the volume up: every access
// resolves the window's volume id to the volume that has it now and checks
// the connection's grant against that volume's name, so a client can bind
// before a volume exists, and a window outlives no volume it named (a
// volume deleted and re-created under the same id is checked again). As
// requests of a connection execute in order, a client sends BIND and the
// requests that use it back to back without waiting.
//
// Fencing (protocol version 3): BIND's payload ends with a u64 fencing
// token, 0 for none. Each volume keeps the newest token presented with a
// write window (saved with the volume table on a persistent node). A BIND
// whose token is newer raises it; older, and the BIND answers FENCED but
// the window is kept, so the writes that use it fail as FENCED too. A write
// (WRITE, TRIM, CAS, FAA) through a window whose token is older than the
// volume's — or 0 once the volume has one — is refused with FENCED; reads
// are never fenced. A host that took over a volume's lease presents its
// token before it serves, so the write-backs still in flight from the host
// it superseded cannot land over the new owner's data. A DELETE that
// carries a token older than the volume's is refused with FENCED too (a
// superseded filesystem mount freeing a file the new one kept); one with
// token 0 is an operator's and is not fenced.

import (
	"encoding/binary"
	"fmt"

	"github.com/pd3-go/pd3/pageid"
)

const (
	// Version is the protocol version exchanged in HELLO (2: memory
	// windows; 3: fencing tokens in BIND).
	Version = 3
	// ChunkSize is the allocation unit of volume memory: chunks are allocated
	// on first write and freed when a TRIM covers them entirely.
	ChunkSize = 1 << 20
	// MaxIO is the largest READ, WRITE or PREFETCH a single request may move.
	MaxIO = ChunkSize
	// MaxPayload bounds the payload of any request; larger is a framing error.
	MaxPayload = MaxIO
	// MaxNameLen bounds volume names.
	MaxNameLen = 255

	reqMagic  = 0xD3
	respMagic = 0x3D

	// ReqHeaderSize and RespHeaderSize are the fixed header lengths.
	ReqHeaderSize  = 32
	RespHeaderSize = 16
)

// Op is a memory-node operation code.
type Op uint8

// Operations. READ/WRITE/CAS/FAA play the part of one-sided RDMA verbs on a
// volume; PREFETCH reads a page by key (the node maps key → address itself, as
// PD3 §6.2 asks of the memory server).
const (
	OpHello    Op = 1
	OpRead     Op = 2
	OpWrite    Op = 3
	OpPrefetch Op = 4
	OpCAS      Op = 5
	OpFAA      Op = 6
	OpTrim     Op = 7
	OpCreate   Op = 8
	OpOpen     Op = 9
	OpList     Op = 10
	OpDelete   Op = 11
	OpBind     Op = 12
	OpUnbind   Op = 13
	OpResize   Op = 14
	// OpMap asks which chunks of a byte range hold memory (Count bytes
	// at Offset, at most MaxMap); the answer is a bitmap, one bit per
	// chunk from the one holding Offset, lowest bit first.
	OpMap Op = 15
	// OpXor adds its payload to the bytes at Offset by exclusive or (a
	// parity shard taking the change of one data shard: docs/decisions.md,
	// 28). It is not idempotent: a client that cannot tell whether one
	// took effect must stop reading what it changed.
	OpXor Op = 16
)

// MaxMap is the most bytes one MAP request asks about (a 256-byte answer).
const MaxMap = 1 << 31

// Access rights of a memory window (BIND).
const (
	AccessRead  uint32 = 1
	AccessWrite uint32 = 2
	AccessAll          = AccessRead | AccessWrite
)

// bindPayloadSize is the length of a BIND payload.
const bindPayloadSize = 24

var opNames = [...]string{
	OpHello: "HELLO", OpRead: "READ", OpWrite: "WRITE", OpPrefetch: "PREFETCH",
	OpCAS: "CAS", OpFAA: "FAA", OpTrim: "TRIM", OpCreate: "CREATE",
	OpOpen: "OPEN", OpList: "LIST", OpDelete: "DELETE", OpBind: "BIND", OpUnbind: "UNBIND",
	OpResize: "RESIZE", OpMap: "MAP", OpXor: "XOR",
}

func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Status is the per-request result code carried in a response.
type Status uint8

// Status codes; each maps to one error sentinel (see errors.go).
const (
	StatusOK           Status = 0
	StatusOutOfRange   Status = 1
	StatusNoVolume     Status = 2
	StatusUnauthorised Status = 3
	StatusNoMemory     Status = 4
	StatusUnknownOp    Status = 5
	StatusBadRequest   Status = 6
	StatusTooLarge     Status = 7
	StatusExists       Status = 8
	StatusVersion      Status = 9
	StatusMisaligned   Status = 10
	StatusNoWindow     Status = 11
	StatusTLSRequired  Status = 12
	StatusFenced       Status = 13
	StatusNoSpace      Status = 14
	StatusCorrupt      Status = 15
)

// ReqHeader is a decoded request header.
type ReqHeader struct {
	Op         Op
	Volume     uint16
	PayloadLen uint32
	Tag        uint64
	Offset     uint64
	Count      uint32
	Window     uint32
}

// RespHeader is a decoded response header.
type RespHeader struct {
	Op         Op
	Status     Status
	PayloadLen uint32
	Tag        uint64
}

// Encode writes h into b, which must hold ReqHeaderSize bytes.
func (h *ReqHeader) Encode(b []byte) {
	_ = b[ReqHeaderSize-1]
	b[0] = reqMagic
	b[1] = byte(h.Op)
	binary.LittleEndian.PutUint16(b[2:], h.Volume)
	binary.LittleEndian.PutUint32(b[4:], h.PayloadLen)
	binary.LittleEndian.PutUint64(b[8:], h.Tag)
	binary.LittleEndian.PutUint64(b[16:], h.Offset)
	binary.LittleEndian.PutUint32(b[24:], h.Count)
	binary.LittleEndian.PutUint32(b[28:], h.Window)
}

// Decode parses b (at least ReqHeaderSize bytes). An error means the byte
// stream cannot be trusted any more: it is a framing violation.
func (h *ReqHeader) Decode(b []byte) error {
	if len(b) < ReqHeaderSize {
		return fmt.Errorf("%w: short request header (%d bytes)", ErrFraming, len(b))
	}
	if b[0] != reqMagic {
		return fmt.Errorf("%w: bad request magic %#x", ErrFraming, b[0])
	}
	h.Op = Op(b[1])
	h.Volume = binary.LittleEndian.Uint16(b[2:])
	h.PayloadLen = binary.LittleEndian.Uint32(b[4:])
	h.Tag = binary.LittleEndian.Uint64(b[8:])
	h.Offset = binary.LittleEndian.Uint64(b[16:])
	h.Count = binary.LittleEndian.Uint32(b[24:])
	h.Window = binary.LittleEndian.Uint32(b[28:])
	if h.PayloadLen > MaxPayload {
		return fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrFraming, h.PayloadLen, MaxPayload)
	}
	return nil
}

// Encode writes h into b, which must hold RespHeaderSize bytes.
func (h *RespHeader) Encode(b []byte) {
	_ = b[RespHeaderSize-1]
	b[0] = respMagic
	b[1] = byte(h.Op)
	b[2] = byte(h.Status)
	b[3] = 0
	binary.LittleEndian.PutUint32(b[4:], h.PayloadLen)
	binary.LittleEndian.PutUint64(b[8:], h.Tag)
}

// Decode parses a response header; an error is a framing violation.
func (h *RespHeader) Decode(b []byte) error {
	if len(b) < RespHeaderSize {
		return fmt.Errorf("%w: short response header (%d bytes)", ErrFraming, len(b))
	}
	if b[0] != respMagic {
		return fmt.Errorf("%w: bad response magic %#x", ErrFraming, b[0])
	}
	h.Op = Op(b[1])
	h.Status = Status(b[2])
	h.PayloadLen = binary.LittleEndian.Uint32(b[4:])
	h.Tag = binary.LittleEndian.Uint64(b[8:])
	if h.PayloadLen > MaxPayload+RespHeaderSize {
		return fmt.Errorf("%w: response payload of %d bytes", ErrFraming, h.PayloadLen)
	}
	return nil
}

// A pageid.VolumeInfo on the wire (CREATE/OPEN response payload and each
// LIST entry): u16 id, u16 name length, u32 stored chunks (ChunkSize), u64
// size, name. (The stored chunks were a reserved zero before: an older
// node reports nothing stored.)

const volumeInfoFixed = 16

func appendVolumeInfo(b []byte, v pageid.VolumeInfo) []byte {
	var f [volumeInfoFixed]byte
	binary.LittleEndian.PutUint16(f[0:], v.ID)
	binary.LittleEndian.PutUint16(f[2:], uint16(len(v.Name)))
	binary.LittleEndian.PutUint32(f[4:], uint32(min(v.Stored/ChunkSize, 1<<32-1)))
	binary.LittleEndian.PutUint64(f[8:], v.Size)
	b = append(b, f[:]...)
	return append(b, v.Name...)
}

// decodeVolumeInfo parses one entry and returns the rest of b.
func decodeVolumeInfo(b []byte) (pageid.VolumeInfo, []byte, error) {
	if len(b) < volumeInfoFixed {
		return pageid.VolumeInfo{}, nil, fmt.Errorf("%w: short volume entry", ErrProtocol)
	}
	n := int(binary.LittleEndian.Uint16(b[2:]))
	if len(b) < volumeInfoFixed+n {
		return pageid.VolumeInfo{}, nil, fmt.Errorf("%w: volume name overruns entry", ErrProtocol)
	}
	v := pageid.VolumeInfo{
		ID:     binary.LittleEndian.Uint16(b[0:]),
		Size:   binary.LittleEndian.Uint64(b[8:]),
		Name:   string(b[volumeInfoFixed : volumeInfoFixed+n]),
		Stored: uint64(binary.LittleEndian.Uint32(b[4:])) * ChunkSize,
	}
	return v, b[volumeInfoFixed+n:], nil
}
