package nbdproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Sizes and magics. The basic values come from go-nbd's protocol package;
// the rest of what pd3 speaks (structured replies, meta contexts, the
// newer commands and flags) is defined here from the protocol document
// (NetworkBlockDevice/nbd doc/proto.md).
const (
	MagicInit            = uint64(protocol.NEGOTIATION_MAGIC_OLDSTYLE) // "NBDMAGIC"
	MagicOption          = uint64(protocol.NEGOTIATION_MAGIC_OPTION)   // "IHAVEOPT"
	MagicOptReply        = uint64(protocol.NEGOTIATION_MAGIC_REPLY)
	MagicRequest         = uint32(protocol.TRANSMISSION_MAGIC_REQUEST)
	MagicSimpleReply     = uint32(protocol.TRANSMISSION_MAGIC_REPLY)
	MagicStructuredReply = uint32(0x668e33ef)

	GreetingLen        = 18 // MagicInit, MagicOption, HandshakeFlags
	OptionHeaderLen    = 16 // MagicOption, Opt, data length
	OptReplyHeaderLen  = 20 // MagicOptReply, Opt, Rep, data length
	RequestHeaderLen   = 28
	SimpleReplyLen     = 16 // magic, Errno, cookie
	StructuredReplyLen = 20 // magic, chunk flags, Chunk, cookie, length
)

// HandshakeFlags are the server's flags in the greeting.
type HandshakeFlags uint16

const (
	FlagFixedNewstyle = HandshakeFlags(protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE)
	FlagNoZeroes      = HandshakeFlags(1 << 1)
)

// ClientFlags are the client's answer to the greeting.
type ClientFlags uint32

const (
	ClientFixedNewstyle = ClientFlags(1 << 0)
	ClientNoZeroes      = ClientFlags(1 << 1)
)

// Opt is a negotiation option.
type Opt uint32

const (
	OptExportName      = Opt(1)
	OptAbort           = Opt(protocol.NEGOTIATION_ID_OPTION_ABORT)
	OptList            = Opt(protocol.NEGOTIATION_ID_OPTION_LIST)
	OptStartTLS        = Opt(5)
	OptInfo            = Opt(protocol.NEGOTIATION_ID_OPTION_INFO)
	OptGo              = Opt(protocol.NEGOTIATION_ID_OPTION_GO)
	OptStructuredReply = Opt(8)
	OptListMetaContext = Opt(9)
	OptSetMetaContext  = Opt(10)
)

var optNames = map[Opt]string{
	OptExportName: "EXPORT_NAME", OptAbort: "ABORT", OptList: "LIST", OptStartTLS: "STARTTLS",
	OptInfo: "INFO", OptGo: "GO", OptStructuredReply: "STRUCTURED_REPLY",
	OptListMetaContext: "LIST_META_CONTEXT", OptSetMetaContext: "SET_META_CONTEXT",
}

func (o Opt) String() string { return name(optNames, o, "option") }

// Rep is an option reply type; the high bit marks errors.
type Rep uint32

const (
	RepAck         = Rep(protocol.NEGOTIATION_TYPE_REPLY_ACK)
	RepServer      = Rep(protocol.NEGOTIATION_TYPE_REPLY_SERVER)
	RepInfo        = Rep(protocol.NEGOTIATION_TYPE_REPLY_INFO)
	RepMetaContext = Rep(4)

	RepErrUnsup   = Rep(protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED)
	RepErrPolicy  = Rep(2 | 1<<31)
	RepErrInvalid = Rep(3 | 1<<31)
	RepErrUnknown = Rep(protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN)
	RepErrTLSReqd = Rep(5 | 1<<31)
	RepErrTooBig  = Rep(9 | 1<<31)
)

var repNames = map[Rep]string{
	RepAck: "ACK", RepServer: "SERVER", RepInfo: "INFO", RepMetaContext: "META_CONTEXT",
	RepErrUnsup: "ERR_UNSUP", RepErrPolicy: "ERR_POLICY", RepErrInvalid: "ERR_INVALID",
	RepErrUnknown: "ERR_UNKNOWN", RepErrTLSReqd: "ERR_TLS_REQD", RepErrTooBig: "ERR_TOO_BIG",
}

func (r Rep) String() string { return name(repNames, r, "reply") }

// IsError reports whether r refuses the option.
func (r Rep) IsError() bool { return r&(1<<31) != 0 }

// Info is an NBD_REP_INFO item.
type Info uint16

const (
	InfoExport      = Info(protocol.NEGOTIATION_TYPE_INFO_EXPORT)
	InfoName        = Info(protocol.NEGOTIATION_TYPE_INFO_NAME)
	InfoDescription = Info(protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION)
	InfoBlockSize   = Info(protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE)
)

// TFlags are an export's transmission flags.
type TFlags uint16

const (
	TFHasFlags       = TFlags(protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS)
	TFReadOnly       = TFlags(1 << 1)
	TFSendFlush      = TFlags(1 << 2)
	TFSendFUA        = TFlags(1 << 3)
	TFSendTrim       = TFlags(1 << 5)
	TFSendWriteZeros = TFlags(1 << 6)
	TFSendDF         = TFlags(1 << 7)
	TFCanMultiConn   = TFlags(protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN)
	TFSendCache      = TFlags(1 << 10)
	TFSendFastZero   = TFlags(1 << 11)
)

var tflagNames = []string{0: "HAS_FLAGS", 1: "READ_ONLY", 2: "SEND_FLUSH", 3: "SEND_FUA", 4: "ROTATIONAL",
	5: "SEND_TRIM", 6: "SEND_WRITE_ZEROES", 7: "SEND_DF", 8: "CAN_MULTI_CONN", 9: "SEND_RESIZE",
	10: "SEND_CACHE", 11: "SEND_FAST_ZERO"}

func (f TFlags) String() string { return flagString(uint64(f), tflagNames) }

// Cmd is a transmission request type.
type Cmd uint16

const (
	CmdRead        = Cmd(protocol.TRANSMISSION_TYPE_REQUEST_READ)
	CmdWrite       = Cmd(protocol.TRANSMISSION_TYPE_REQUEST_WRITE)
	CmdDisc        = Cmd(protocol.TRANSMISSION_TYPE_REQUEST_DISC)
	CmdFlush       = Cmd(3)
	CmdTrim        = Cmd(4)
	CmdCache       = Cmd(5)
	CmdWriteZeroes = Cmd(6)
	CmdBlockStatus = Cmd(7)
)

var cmdNames = map[Cmd]string{
	CmdRead: "READ", CmdWrite: "WRITE", CmdDisc: "DISC", CmdFlush: "FLUSH", CmdTrim: "TRIM",
	CmdCache: "CACHE", CmdWriteZeroes: "WRITE_ZEROES", CmdBlockStatus: "BLOCK_STATUS",
}

func (c Cmd) String() string { return name(cmdNames, c, "command") }

// CmdFlags are a request's flags.
type CmdFlags uint16

const (
	CmdFlagFUA      = CmdFlags(1 << 0)
	CmdFlagNoHole   = CmdFlags(1 << 1)
	CmdFlagDF       = CmdFlags(1 << 2)
	CmdFlagReqOne   = CmdFlags(1 << 3)
	CmdFlagFastZero = CmdFlags(1 << 4)
)

var cmdFlagNames = []string{"FUA", "NO_HOLE", "DF", "REQ_ONE", "FAST_ZERO", "PAYLOAD_LEN"}

func (f CmdFlags) String() string { return flagString(uint64(f), cmdFlagNames) }

// Chunk is a structured reply chunk type; ChunkFlagDone ends a reply.
type Chunk uint16

const (
	ChunkFlagDone    = uint16(1 << 0)
	ChunkNone        = Chunk(0)
	ChunkOffsetData  = Chunk(1)
	ChunkBlockStatus = Chunk(5)
	ChunkError       = Chunk(1<<15 | 1)
)

// Errno is an error on the wire (Linux values, as the protocol defines).
type Errno uint32

const (
	EPERM     = Errno(protocol.TRANSMISSION_ERROR_EPERM)
	EIO       = Errno(5)
	ENOMEM    = Errno(12)
	EINVAL    = Errno(protocol.TRANSMISSION_ERROR_EINVAL)
	ENOSPC    = Errno(28)
	EOVERFLOW = Errno(75)
	ENOTSUP   = Errno(95)
	ESHUTDOWN = Errno(108)
)

var errnoNames = map[Errno]string{
	0: "OK", EPERM: "EPERM", EIO: "EIO", ENOMEM: "ENOMEM", EINVAL: "EINVAL", ENOSPC: "ENOSPC",
	EOVERFLOW: "EOVERFLOW", ENOTSUP: "ENOTSUP", ESHUTDOWN: "ESHUTDOWN",
}

func (e Errno) String() string { return name(errnoNames, e, "errno") }

// MetaBaseAllocation is the one metadata context pd3 serves, with id
// MetaBaseAllocationID.
const (
	MetaBaseAllocation   = "base:allocation"
	MetaBaseAllocationID = uint32(1)
)

// The flags of a base:allocation extent: a hole holds no storage, and
// zero reads as zeroes. 0 is data.
const (
	StateHole = uint32(1)
	StateZero = uint32(2)
)

// Request is a transmission request header.
type Request struct {
	Flags  CmdFlags
	Cmd    Cmd
	Cookie uint64
	Offset uint64
	Length uint32
}

// ErrBadMagic is returned for a request header without MagicRequest.
var ErrBadMagic = errors.New("nbd: bad request magic")

// Decode reads a header from b (at least RequestHeaderLen bytes).
func (r *Request) Decode(b []byte) error {
	if len(b) < RequestHeaderLen {
		return fmt.Errorf("nbd: request header of %d bytes", len(b))
	}
	if m := binary.BigEndian.Uint32(b); m != MagicRequest {
		return fmt.Errorf("%w %#x", ErrBadMagic, m)
	}
	r.Flags = CmdFlags(binary.BigEndian.Uint16(b[4:]))
	r.Cmd = Cmd(binary.BigEndian.Uint16(b[6:]))
	r.Cookie = binary.BigEndian.Uint64(b[8:])
	r.Offset = binary.BigEndian.Uint64(b[16:])
	r.Length = binary.BigEndian.Uint32(b[24:])
	return nil
}

// Encode writes the header into b (at least RequestHeaderLen bytes).
func (r *Request) Encode(b []byte) {
	_ = b[RequestHeaderLen-1]
	binary.BigEndian.PutUint32(b, MagicRequest)
	binary.BigEndian.PutUint16(b[4:], uint16(r.Flags))
	binary.BigEndian.PutUint16(b[6:], uint16(r.Cmd))
	binary.BigEndian.PutUint64(b[8:], r.Cookie)
	binary.BigEndian.PutUint64(b[16:], r.Offset)
	binary.BigEndian.PutUint32(b[24:], r.Length)
}

// Append appends the encoded header to b.
func (r *Request) Append(b []byte) []byte {
	var h [RequestHeaderLen]byte
	r.Encode(h[:])
	return append(b, h[:]...)
}

func (r Request) String() string {
	s := fmt.Sprintf("%v cookie %d offset %d length %d", r.Cmd, r.Cookie, r.Offset, r.Length)
	if r.Flags != 0 {
		s += " flags " + r.Flags.String()
	}
	return s
}

func name[K ~uint16 | ~uint32](names map[K]string, k K, what string) string {
	if n, ok := names[k]; ok {
		return n
	}
	return fmt.Sprintf("%s(%d)", what, uint64(k))
}

// flagString names the set bits of f, "|"-separated; unnamed bits as hex.
func flagString(f uint64, names []string) string {
	if f == 0 {
		return "0"
	}
	var parts []string
	for i := 0; f != 0; i++ {
		if f&1 != 0 {
			if i < len(names) && names[i] != "" {
				parts = append(parts, names[i])
			} else {
				parts = append(parts, fmt.Sprintf("%#x", uint64(1)<<i))
			}
		}
		f >>= 1
	}
	return strings.Join(parts, "|")
}

// AppendOption appends a client's option (header and data) to b.
func AppendOption(b []byte, opt Opt, data []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, MagicOption)
	b = binary.BigEndian.AppendUint32(b, uint32(opt))
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}
