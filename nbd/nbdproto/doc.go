// Package nbdproto is the NBD protocol's vocabulary as pd3 speaks it:
// magics, sizes, typed options, replies, commands, flags and errnos with
// their names, and the transmission request header. The server (nbd),
// the DPU agent's request parser (dpu) and the Go client
// (internal/nbdclient) share it, so a value means one thing everywhere
// and prints by its name in logs and errors.
//
// Protocol flow (fixed newstyle only), big-endian throughout:
//
//	S: MagicInit MagicOption u16 HandshakeFlags (FIXED_NEWSTYLE|NO_ZEROES)
//	C: u32 ClientFlags
//	C: options, each MagicOption u32 Opt u32 length data; S answers each
//	   with MagicOptReply u32 Opt u32 Rep u32 length data — except
//	   EXPORT_NAME, answered by u64 size, u16 TFlags (and 124 zero bytes
//	   unless NO_ZEROES) and ending the haggling
//	C: requests (Request, 28 bytes, + payload for WRITE); S: replies,
//	   simple (16 bytes + READ data) or structured chunks (20-byte
//	   headers), in any order, matched by the request's cookie.
//
// Request header:
//
//	off  size  field
//	0    4     MagicRequest 0x25609513
//	4    2     CmdFlags
//	6    2     Cmd
//	8    8     cookie (echoed in the reply)
//	16   8     offset (bytes)
//	24   4     length (bytes; WRITE data follows the header)
package nbdproto
