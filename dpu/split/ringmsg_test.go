package split

import (
	"bytes"
	"context"
	"github.com/pd3-go/pd3/dpu"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// reencode encodes r as the host would have sent it: the bytes its
// decoding read, no more (the header as decoded, whatever the type uses).
func reencode(r ringMsg) []byte {
	var out []byte
	switch r.typ {
	case msgRead, msgInvalidate:
		b := encodeKey(r.msgHeader, r.key)
		out = b[:]
	case msgWrite:
		b := encodeKey(r.msgHeader, r.key)
		out = append(b[:], r.page...)
	case msgTrim:
		b := encodeTrim(r.tag, r.vol, r.off, r.n)
		out = b[:]
	case msgFence:
		b := encodeFence(r.tag, r.vol, r.off)
		out = b[:]
	case msgKernel, msgReadAhead, msgWritten:
		b := encodeRange(r.typ, r.arg, r.key, uint32(r.n), r.off)
		out = b[:]
	case msgEvict, msgResident:
		b := encodeHeader(r.msgHeader)
		out = append(b[:], r.keys...)
	case msgMirror:
		b := encodeHeader(r.msgHeader)
		out = append(b[:], r.data...)
	default:
		b := encodeHeader(r.msgHeader)
		out = b[:]
	}
	r.msgHeader.put(out) // fields a type's encoder leaves zero
	return out
}

// FuzzRingMsg: any bytes in ring A decode or are refused cleanly; what
// decodes encodes back to the bytes it was read from. Replies likewise.
func FuzzRingMsg(f *testing.F) {
	k := pageid.MakeKey(3, 77)
	for _, m := range [][]byte{
		func() []byte { b := encodeKey(msgHeader{typ: msgRead, tag: 9}, k); return b[:] }(),
		func() []byte {
			b := encodeKey(msgHeader{typ: msgWrite, tag: 10}, k)
			return append(b[:], bytes.Repeat([]byte{7}, pageid.Size)...)
		}(),
		func() []byte { b := encodeTrim(11, 3, 4096, 8192); return b[:] }(),
		func() []byte { b := encodeFence(12, 3, 1<<40); return b[:] }(),
		func() []byte { b := encodeRange(msgReadAhead, dpu.SourceFUSE, k, 32, 1000); return b[:] }(),
		func() []byte {
			b := encodeHeader(msgHeader{typ: msgMirror, arg: ProtoNBD, tag: 2})
			return append(b[:], "bytes"...)
		}(),
		func() []byte {
			b := encodeHeader(msgHeader{typ: msgResident})
			return append(b[:], 1, 2, 3, 4, 5, 6, 7, 8, 9)
		}(),
	} {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if tag, st, page, err := decodeReply(in); err == nil {
			assert.Equal(t, tag, uint32(in[4])|uint32(in[5])<<8|uint32(in[6])<<16|uint32(in[7])<<24)
			if page != nil && (st != memnode.StatusOK || len(page) != pageid.Size) {
				t.Fatalf("reply with status %v carries %d bytes", st, len(page))
			}
		}
		r, err := decodeRequest(in)
		if err != nil {
			return
		}
		_ = r.typ.String()
		if r.n > maxRangePages && (r.typ == msgKernel || r.typ == msgReadAhead || r.typ == msgWritten) {
			t.Fatalf("%v names %d pages", r.typ, r.n)
		}
		out := reencode(r)
		if (r.typ == msgKernel || r.typ == msgReadAhead || r.typ == msgWritten) && r.n == maxRangePages {
			return // a larger count was clamped
		}
		want := bytes.Clone(in[:len(out)])
		if r.typ == msgTrim {
			clear(want[8:16]) // unused: the decoder ignores it
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("%v: round trip %x → %x", r.typ, want, out)
		}
	})
}

func TestRingMsgNames(t *testing.T) {
	assert.Equal(t, "READAHEAD", msgReadAhead.String())
	assert.Equal(t, "msgType(0x7a)", msgType('z').String())
	_, err := decodeRequest([]byte{'W', 0, 0, 0, 1, 0, 0, 0, 1, 2})
	assert.ErrorIs(t, err, errShortMsg)
	assert.ErrorContains(t, err, "WRITE of 10 bytes, want 4112")
	_, err = decodeRequest([]byte{'z', 0, 0, 0, 0, 0, 0, 0})
	assert.ErrorContains(t, err, "unknown ring message msgType(0x7a)")
}

// The agent's replies carry the memory node's status, so the host learns
// why a request failed (it still redoes it on its own connection: the
// agent's token may reach less than the host's).
func TestAgentReplyCarriesTheStatus(t *testing.T) {
	r := newSplitRig(t)
	l := OpenLink(r.name, memnode.Remote{C: r.c})
	t.Cleanup(l.Close)
	r.startAgent(t, r.c)
	require.Eventually(t, l.Attached, 5e9, 1e7)
	a := l.cur.Load()
	buf := make([]byte, pageid.Size)

	err := l.call(context.Background(), a, msgRead, pageid.MakeKey(r.vol.ID, 1<<30), buf, nil)
	assert.ErrorIs(t, err, errAgentFailed)
	assert.ErrorIs(t, err, pageid.ErrOutOfRange, "the node's answer survives the ring")
	err = l.call(context.Background(), a, msgRead, pageid.MakeKey(999, 0), buf, nil)
	assert.ErrorIs(t, err, pageid.ErrNoVolume)
	require.NoError(t, l.call(context.Background(), a, msgRead, pageid.MakeKey(r.vol.ID, 1), buf, nil))

	assert.Equal(t, statusUnreachable, replyStatus(context.DeadlineExceeded), "no status names a timeout")
	assert.ErrorIs(t, replyErr(statusUnreachable), errAgentFailed)
	assert.NoError(t, replyErr(memnode.StatusOK))
}
