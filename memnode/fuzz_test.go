package memnode

import (
	"bytes"
	"testing"

	"github.com/pd3-go/pd3/internal/testnet"
)

// FuzzReqHeader: decoding arbitrary bytes never panics, and whatever decodes
// re-encodes to the same bytes.
func FuzzReqHeader(f *testing.F) {
	var b [ReqHeaderSize]byte
	(&ReqHeader{Op: OpRead, Volume: 1, Tag: 9, Offset: 4096, Count: 4096}).Encode(b[:])
	f.Add(b[:])
	f.Add(b[:10])
	f.Fuzz(func(t *testing.T, in []byte) {
		var h ReqHeader
		if err := h.Decode(in); err != nil {
			return
		}
		var out [ReqHeaderSize]byte
		h.Encode(out[:])
		if !bytes.Equal(out[:], in[:ReqHeaderSize]) {
			t.Fatalf("round trip changed %x into %x", in[:ReqHeaderSize], out)
		}
	})
}

// FuzzServerStream feeds arbitrary bytes after a valid HELLO to a live
// server: it must answer or hang up, never crash or stall, and keep serving
// a fresh connection afterwards.
func FuzzServerStream(f *testing.F) {
	hello := func() []byte {
		var hdr [ReqHeaderSize]byte
		(&ReqHeader{Op: OpHello, PayloadLen: 4}).Encode(hdr[:])
		return append(hdr[:], Version, 0, 0, 0)
	}()
	var bind [ReqHeaderSize + bindPayloadSize]byte
	(&ReqHeader{Op: OpBind, Volume: 1, Window: 7, PayloadLen: bindPayloadSize}).Encode(bind[:])
	bind[ReqHeaderSize+8] = byte(AccessAll)
	var rd [ReqHeaderSize]byte
	(&ReqHeader{Op: OpRead, Volume: 1, Count: 64, Window: 7}).Encode(rd[:])
	f.Add(rd[:])
	f.Add(append(bind[:], rd[:]...))
	var wr [ReqHeaderSize]byte
	(&ReqHeader{Op: OpWrite, Volume: 1, PayloadLen: 4, Window: 7}).Encode(wr[:])
	f.Add(append(wr[:], 1, 2, 3, 4))
	f.Add(append(append(bind[:], wr[:]...), 1, 2, 3, 4))
	f.Add([]byte{0xd3, 5, 1, 0, 16, 0, 0, 0})

	st := NewStore(64 * ChunkSize)
	st.Create("v", 4*ChunkSize)
	testnet.FuzzServer(f, &Server{Store: st}, st.Check, hello)
}
