package nbd

// Wire constants of the NBD protocol (big-endian throughout). The basic
// ones come from go-nbd's protocol package; the rest of what pd3 speaks —
// structured replies, meta contexts, the newer commands and flags — is
// defined here from the protocol document (NetworkBlockDevice/nbd
// doc/proto.md).
//
// Protocol flow (fixed newstyle only):
//
//	S: "NBDMAGIC" "IHAVEOPT" u16 handshake flags (FIXED_NEWSTYLE|NO_ZEROES)
//	C: u32 client flags
//	C: options, each "IHAVEOPT" u32 option u32 length data; S answers each
//	   with u64 reply magic, u32 option, u32 reply type, u32 length, data —
//	   except EXPORT_NAME, answered by u64 size, u16 transmission flags
//	   (and 124 zero bytes unless NO_ZEROES) and ending the haggling
//	C: requests, 28-byte headers (+ payload for WRITE); S: replies, simple
//	   (16 bytes + READ data) or structured chunks (20-byte headers), in
//	   any order, matched by the request's cookie.

import (
	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Handshake.
const (
	magicInit   = protocol.NEGOTIATION_MAGIC_OLDSTYLE // "NBDMAGIC"
	magicOption = protocol.NEGOTIATION_MAGIC_OPTION   // "IHAVEOPT"
	magicReply  = protocol.NEGOTIATION_MAGIC_REPLY

	flagFixedNewstyle = protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE
	flagNoZeroes      = uint16(1 << 1)

	clientFixedNewstyle = uint32(1 << 0)
	clientNoZeroes      = uint32(1 << 1)
)

// Options.
const (
	optExportName      = uint32(1)
	optAbort           = protocol.NEGOTIATION_ID_OPTION_ABORT
	optList            = protocol.NEGOTIATION_ID_OPTION_LIST
	optStartTLS        = uint32(5)
	optInfo            = protocol.NEGOTIATION_ID_OPTION_INFO
	optGo              = protocol.NEGOTIATION_ID_OPTION_GO
	optStructuredReply = uint32(8)
	optListMetaContext = uint32(9)
	optSetMetaContext  = uint32(10)
)

// Option replies.
const (
	repAck         = protocol.NEGOTIATION_TYPE_REPLY_ACK
	repServer      = protocol.NEGOTIATION_TYPE_REPLY_SERVER
	repInfo        = protocol.NEGOTIATION_TYPE_REPLY_INFO
	repMetaContext = uint32(4)

	repErrUnsup   = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED
	repErrPolicy  = uint32(2 | 1<<31)
	repErrInvalid = uint32(3 | 1<<31)
	repErrUnknown = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN
	repErrTooBig  = uint32(9 | 1<<31)

	infoExport      = protocol.NEGOTIATION_TYPE_INFO_EXPORT
	infoName        = protocol.NEGOTIATION_TYPE_INFO_NAME
	infoDescription = protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION
	infoBlockSize   = protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE
)

// Transmission flags.
const (
	tfHasFlags       = protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS
	tfReadOnly       = uint16(1 << 1)
	tfSendFlush      = uint16(1 << 2)
	tfSendFUA        = uint16(1 << 3)
	tfSendTrim       = uint16(1 << 5)
	tfSendWriteZeros = uint16(1 << 6)
	tfSendDF         = uint16(1 << 7)
	tfCanMultiConn   = protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN
	tfSendCache      = uint16(1 << 10)
	tfSendFastZero   = uint16(1 << 11)
)

// Requests.
const (
	magicRequest     = protocol.TRANSMISSION_MAGIC_REQUEST
	magicSimple      = protocol.TRANSMISSION_MAGIC_REPLY
	magicStructured  = uint32(0x668e33ef)
	requestHeaderLen = 28

	cmdRead        = protocol.TRANSMISSION_TYPE_REQUEST_READ
	cmdWrite       = protocol.TRANSMISSION_TYPE_REQUEST_WRITE
	cmdDisc        = protocol.TRANSMISSION_TYPE_REQUEST_DISC
	cmdFlush       = uint16(3)
	cmdTrim        = uint16(4)
	cmdCache       = uint16(5)
	cmdWriteZeroes = uint16(6)
	cmdBlockStatus = uint16(7)

	cmdFlagFUA      = uint16(1 << 0)
	cmdFlagNoHole   = uint16(1 << 1)
	cmdFlagDF       = uint16(1 << 2)
	cmdFlagReqOne   = uint16(1 << 3)
	cmdFlagFastZero = uint16(1 << 4)
)

// Structured reply chunks.
const (
	chunkFlagDone    = uint16(1 << 0)
	chunkNone        = uint16(0)
	chunkOffsetData  = uint16(1)
	chunkBlockStatus = uint16(5)
	chunkError       = uint16(1<<15 | 1)
)

// Errors on the wire.
const (
	errPerm     = protocol.TRANSMISSION_ERROR_EPERM
	errIO       = uint32(5)
	errNoMem    = uint32(12)
	errInval    = protocol.TRANSMISSION_ERROR_EINVAL
	errNoSpc    = uint32(28)
	errOverflow = uint32(75)
	errNotSup   = uint32(95)
	errShutdown = uint32(108)
)

// metaBaseAllocation is the one metadata context pd3 serves, with id 1.
const (
	metaBaseAllocation   = "base:allocation"
	metaBaseAllocationID = uint32(1)
)

func cmdName(t uint16) string {
	switch t {
	case cmdRead:
		return "READ"
	case cmdWrite:
		return "WRITE"
	case cmdDisc:
		return "DISC"
	case cmdFlush:
		return "FLUSH"
	case cmdTrim:
		return "TRIM"
	case cmdCache:
		return "CACHE"
	case cmdWriteZeroes:
		return "WRITE_ZEROES"
	case cmdBlockStatus:
		return "BLOCK_STATUS"
	}
	return "unknown"
}
