package split

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/pd3-go/pd3/internal/shmring"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// Split mode: the agent is its own process (pd3 dpu) and shares one named
// region with the host (Link, link.go; the agent's loop, splitagent.go):
//
//	0      header (4096 bytes): magic, epoch, heartbeat, ring size, LZ records
//	4096   ring A, host → agent: mirrored bytes, eviction notices, the host's
//	       page reads and write-backs
//	...    ring B, agent → host: replies to reads and write-backs
//	...    the Loading Zone
//
// The agent formats the region with a new epoch each time it starts and
// bumps the heartbeat every few milliseconds. The host attaches to a region
// whose heartbeat moves, and when it stops moving it declares the agent
// dead: calls waiting on it are redone on the host's own memnode
// connection, the Loading Zone is no longer consulted, and the host keeps
// looking for a new epoch to re-attach to. The agent is an accelerator,
// never a dependency.
const (
	// splitMagic names the region and its message format: a host and an
	// agent of different formats never attach to each other.
	splitMagic   = 0x5044335350_4c5403 // "PD3SPLT" v3: FENCE
	offSMagic    = 0
	offSEpoch    = 8
	offSBeat     = 16
	offSRingSize = 24
	offSRecords  = 32
	splitHeader  = 4096

	heartbeatEvery = 5 * time.Millisecond
)

func align4k(n int) int { return (n + 4095) &^ 4095 }

type splitLayout struct{ ringSize, records, ringA, ringB, lz, total int }

func layout(ringSize, records int) splitLayout {
	l := splitLayout{ringSize: ringSize, records: records, ringA: splitHeader}
	l.ringB = l.ringA + align4k(shmring.Bytes(ringSize))
	l.lz = l.ringB + align4k(shmring.Bytes(ringSize))
	l.total = l.lz + align4k(loadingzone.Size(records))
	return l
}

// Ring messages. Every message, in either ring, starts with an 8-byte
// header; integers are little-endian.
//
//	off  size  field
//	0    1     type (msgType)
//	1    1     arg: MIRROR the protocol (ProtoPage, ProtoNBD); KERNEL
//	           kernelAdded or kernelDropped; READAHEAD the source; in a
//	           reply, the memnode.Status (or statusUnreachable)
//	2    2     volume (TRIM, FENCE)
//	4    4     tag (READ, WRITE, TRIM, INVALIDATE, FENCE and their replies) or
//	           connection (MIRROR, CLOSE)
//
// Bodies, after the header:
//
//	READ, INVALIDATE           8 key
//	WRITE                      8 key, 4096 page
//	TRIM                       8 zero, 8 byte offset, 8 byte count
//	FENCE                      8 fencing token
//	EVICT, RESIDENT            8 per key
//	KERNEL, READAHEAD, WRITTEN 8 first key, 4 page count, 8 end page
//	                           (READAHEAD: the file ends before it; 0
//	                           unknown)
//	MIRROR                     the connection's bytes
//	CLOSE                      nothing
//	reply                      READ with status OK: the page; else nothing
//
// Host → agent (ring A): every type but replies. Agent → host (ring B):
// replies, whose type is the request's.
type msgType byte

const (
	msgMirror = msgType('M')
	msgClose  = msgType('C')
	msgEvict  = msgType('E')
	msgRead   = msgType('R')
	msgWrite  = msgType('W')
	msgTrim   = msgType('T')
	// msgInvalidate: the host wrote a page back on its own connection
	// while this agent lived; forget it as a write-back would.
	msgInvalidate = msgType('I')
	// msgResident: pages the host cache holds, sent when an agent
	// attaches so a restarted agent's Host View starts full, not empty.
	msgResident = msgType('H')
	// msgKernel: a range of pages the kernel page cache added or dropped,
	// from the host's page-cache tracker.
	msgKernel = msgType('K')
	// msgReadAhead: a read of a range seen by the host (FUSE READ or the
	// kernel's read events), for the sequential predictor.
	msgReadAhead = msgType('A')
	// msgWritten: a range of pages a write no parser saw (FUSE WRITE) put
	// in the host cache.
	msgWritten = msgType('U')
	// msgFence: the host holds a volume's lease under this fencing token;
	// the agent presents it on its own memory-node connection, whose
	// write-backs the node would refuse otherwise.
	msgFence = msgType('F')
)

var msgNames = map[msgType]string{
	msgMirror: "MIRROR", msgClose: "CLOSE", msgEvict: "EVICT", msgRead: "READ", msgWrite: "WRITE",
	msgTrim: "TRIM", msgInvalidate: "INVALIDATE", msgResident: "RESIDENT", msgKernel: "KERNEL",
	msgReadAhead: "READAHEAD", msgWritten: "WRITTEN", msgFence: "FENCE",
}

func (t msgType) String() string {
	if n, ok := msgNames[t]; ok {
		return n
	}
	return fmt.Sprintf("msgType(%#x)", byte(t))
}

// Mirror protocols (the arg of a MIRROR message).
const (
	ProtoPage = 'P'
	ProtoNBD  = 'N'
)

// KERNEL message args.
const (
	kernelAdded   = 1
	kernelDropped = 2
)

// statusUnreachable is a reply's status when the agent's request failed
// without a memory-node status (its connection broke or timed out): the
// host then redoes the request itself.
const statusUnreachable = memnode.Status(0xff)

const (
	msgHeaderLen = 8
	keyMsgLen    = msgHeaderLen + 8      // READ, INVALIDATE
	writeMsgLen  = keyMsgLen + pageBytes // WRITE
	trimMsgLen   = msgHeaderLen + 24
	rangeMsgLen  = msgHeaderLen + 20
	pageBytes    = pageid.Size
	// maxRangePages bounds the pages one range message may name, so a
	// corrupt count cannot make the agent walk billions of keys.
	maxRangePages = 1 << 12
)

type msgHeader struct {
	typ msgType
	arg byte
	vol uint16
	tag uint32 // or the connection, for MIRROR and CLOSE
}

func (h msgHeader) put(b []byte) {
	b[0], b[1] = byte(h.typ), h.arg
	binary.LittleEndian.PutUint16(b[2:], h.vol)
	binary.LittleEndian.PutUint32(b[4:], h.tag)
}

// encodeHeader is a message without a body (CLOSE, a reply) or the header
// sent ahead of a body given as another part (MIRROR, RESIDENT, a READ
// reply's page).
func encodeHeader(h msgHeader) (b [msgHeaderLen]byte) {
	h.put(b[:])
	return b
}

// encodeKey is a READ or INVALIDATE, or a WRITE's header and key (its page
// goes as a second part), or one EVICT.
func encodeKey(h msgHeader, k pageid.Key) (b [keyMsgLen]byte) {
	h.put(b[:])
	binary.LittleEndian.PutUint64(b[8:], uint64(k))
	return b
}

func encodeTrim(tag uint32, vol uint16, off, n uint64) (b [trimMsgLen]byte) {
	msgHeader{typ: msgTrim, vol: vol, tag: tag}.put(b[:])
	binary.LittleEndian.PutUint64(b[16:], off)
	binary.LittleEndian.PutUint64(b[24:], n)
	return b
}

func encodeFence(tag uint32, vol uint16, token uint64) (b [keyMsgLen]byte) {
	msgHeader{typ: msgFence, vol: vol, tag: tag}.put(b[:])
	binary.LittleEndian.PutUint64(b[8:], token)
	return b
}

func encodeRange(t msgType, arg byte, first pageid.Key, n uint32, end uint64) (b [rangeMsgLen]byte) {
	msgHeader{typ: t, arg: arg}.put(b[:])
	binary.LittleEndian.PutUint64(b[8:], uint64(first))
	binary.LittleEndian.PutUint32(b[16:], n)
	binary.LittleEndian.PutUint64(b[20:], end)
	return b
}

// ringMsg is a decoded message. Slices alias the ring: they are valid
// until the message is released.
type ringMsg struct {
	msgHeader
	key    pageid.Key // READ, WRITE, INVALIDATE; the first key of a range
	page   []byte     // WRITE; a READ reply's page
	off, n uint64     // TRIM bytes; a range's page count (n) and end (off); FENCE's token (off)
	keys   []byte     // EVICT, RESIDENT: 8 bytes per key
	data   []byte     // MIRROR
}

// errShortMsg is a message shorter than its type needs; the reader skips
// it (the ring's framing is intact, only that message is lost).
var errShortMsg = errors.New("dpu: short ring message")

// decodeRequest decodes a host → agent message.
func decodeRequest(m []byte) (ringMsg, error) {
	var r ringMsg
	if len(m) < msgHeaderLen {
		return r, fmt.Errorf("%w: %d bytes", errShortMsg, len(m))
	}
	r.typ, r.arg = msgType(m[0]), m[1]
	r.vol = binary.LittleEndian.Uint16(m[2:])
	r.tag = binary.LittleEndian.Uint32(m[4:])
	need := msgHeaderLen
	switch r.typ {
	case msgRead, msgInvalidate, msgFence:
		need = keyMsgLen
	case msgWrite:
		need = writeMsgLen
	case msgTrim:
		need = trimMsgLen
	case msgKernel, msgReadAhead, msgWritten:
		need = rangeMsgLen
	case msgMirror, msgClose, msgEvict, msgResident:
	default:
		return r, fmt.Errorf("dpu: unknown ring message %v", r.typ)
	}
	if len(m) < need {
		return r, fmt.Errorf("%w: %v of %d bytes, want %d", errShortMsg, r.typ, len(m), need)
	}
	switch r.typ {
	case msgRead, msgInvalidate:
		r.key = pageid.Key(binary.LittleEndian.Uint64(m[8:]))
	case msgWrite:
		r.key = pageid.Key(binary.LittleEndian.Uint64(m[8:]))
		r.page = m[keyMsgLen:writeMsgLen]
	case msgTrim:
		r.off = binary.LittleEndian.Uint64(m[16:])
		r.n = binary.LittleEndian.Uint64(m[24:])
	case msgFence:
		r.off = binary.LittleEndian.Uint64(m[8:])
	case msgKernel, msgReadAhead, msgWritten:
		r.key = pageid.Key(binary.LittleEndian.Uint64(m[8:]))
		r.n = uint64(min(binary.LittleEndian.Uint32(m[16:]), maxRangePages))
		r.off = binary.LittleEndian.Uint64(m[20:])
	case msgEvict, msgResident:
		r.keys = m[msgHeaderLen : msgHeaderLen+(len(m)-msgHeaderLen)&^7]
	case msgMirror:
		r.data = m[msgHeaderLen:]
	}
	return r, nil
}

// keyAt returns the i-th key of an EVICT or RESIDENT message.
func (r *ringMsg) keyAt(i int) pageid.Key {
	return pageid.Key(binary.LittleEndian.Uint64(r.keys[8*i:]))
}

// decodeReply decodes an agent → host reply: its call's tag, the status,
// and a READ's page.
func decodeReply(m []byte) (tag uint32, st memnode.Status, page []byte, err error) {
	if len(m) < msgHeaderLen {
		return 0, 0, nil, fmt.Errorf("%w: reply of %d bytes", errShortMsg, len(m))
	}
	tag, st = binary.LittleEndian.Uint32(m[4:]), memnode.Status(m[1])
	if msgType(m[0]) == msgRead && st == memnode.StatusOK {
		if len(m) < msgHeaderLen+pageBytes {
			return tag, st, nil, fmt.Errorf("%w: READ reply of %d bytes", errShortMsg, len(m))
		}
		page = m[msgHeaderLen : msgHeaderLen+pageBytes]
	}
	return tag, st, page, nil
}

// replyStatus is the status an agent replies with for err.
func replyStatus(err error) memnode.Status {
	if st, ok := memnode.StatusOf(err); ok {
		return st
	}
	return statusUnreachable
}

// replyErr is the error a reply with status st stands for.
func replyErr(st memnode.Status) error {
	switch st {
	case memnode.StatusOK:
		return nil
	case statusUnreachable:
		return errAgentFailed
	}
	return fmt.Errorf("%w: %w", errAgentFailed, st.Err())
}

// errAgentFailed wraps the error of a request the agent could not carry
// out; the Link redoes such a request on its direct path.
var errAgentFailed = errors.New("dpu: the agent's request failed")
