package nbdproto

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		v    interface{ String() string }
		want string
	}{
		{CmdRead, "READ"},
		{CmdBlockStatus, "BLOCK_STATUS"},
		{Cmd(42), "command(42)"},
		{CmdFlagFUA | CmdFlagDF, "FUA|DF"},
		{CmdFlags(1 << 9), "0x200"},
		{CmdFlags(0), "0"},
		{TFHasFlags | TFSendFlush | TFCanMultiConn, "HAS_FLAGS|SEND_FLUSH|CAN_MULTI_CONN"},
		{OptGo, "GO"},
		{Opt(77), "option(77)"},
		{RepErrUnknown, "ERR_UNKNOWN"},
		{EOVERFLOW, "EOVERFLOW"},
		{Errno(0), "OK"},
		{Request{Cmd: CmdWrite, Flags: CmdFlagFUA, Cookie: 7, Offset: 4096, Length: 512}, "WRITE cookie 7 offset 4096 length 512 flags FUA"},
	} {
		assert.Equal(t, tc.want, tc.v.String())
	}
	assert.True(t, RepErrPolicy.IsError())
	assert.False(t, RepAck.IsError())
}

func TestRequestRoundTrip(t *testing.T) {
	r := Request{Flags: CmdFlagFUA, Cmd: CmdWrite, Cookie: 0x0102030405060708, Offset: 1 << 40, Length: 65536}
	b := r.Append(nil)
	require.Len(t, b, RequestHeaderLen)
	assert.Equal(t, []byte{0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1}, b[:8], "magic, flags, command: big-endian")
	var got Request
	require.NoError(t, got.Decode(b))
	assert.Equal(t, r, got)
	b[0] = 0
	assert.ErrorIs(t, got.Decode(b), ErrBadMagic)
	assert.Error(t, got.Decode(b[:10]))
}

// FuzzRequest: any bytes decode or fail cleanly; what decodes encodes back
// to the same bytes.
func FuzzRequest(f *testing.F) {
	f.Add((&Request{Cmd: CmdRead, Cookie: 1, Offset: 4096, Length: 4096}).Append(nil))
	f.Add([]byte{0x25, 0x60, 0x95, 0x13})
	f.Fuzz(func(t *testing.T, in []byte) {
		var r Request
		if r.Decode(in) != nil {
			return
		}
		_ = r.String()
		if out := r.Append(nil); !bytes.Equal(out, in[:RequestHeaderLen]) {
			t.Fatalf("round trip %x → %x", in[:RequestHeaderLen], out)
		}
	})
}
