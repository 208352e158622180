package pageproto

import (
	"bytes"
	"context"
	"net"
	"testing"

	"github.com/pd3-go/pd3/internal/testnet"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore"
)

func FuzzHeader(f *testing.F) {
	var b [HeaderSize]byte
	(&Header{Op: OpGet, Tag: 3, ID: memnode.MakeKey(1, 2)}).EncodeRequest(b[:])
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, in []byte) {
		var h Header
		if h.DecodeRequest(in) != nil {
			return
		}
		var out [HeaderSize]byte
		h.EncodeRequest(out[:])
		if !bytes.Equal(out[:], in[:HeaderSize]) {
			t.Fatalf("round trip %x → %x", in[:HeaderSize], out)
		}
	})
}

// FuzzServerStream: any byte stream gets answers or a hang-up, never a crash
// or a stall, and the store stays consistent.
func FuzzServerStream(f *testing.F) {
	var g, p [HeaderSize]byte
	(&Header{Op: OpGet, ID: memnode.MakeKey(1, 2)}).EncodeRequest(g[:])
	(&Header{Op: OpPut, ID: memnode.MakeKey(1, 3)}).EncodeRequest(p[:])
	f.Add(g[:])
	f.Add(append(p[:], make([]byte, PageSize)...))
	f.Add(append(g[:], 0x50, 3))
	rem := pagestore.NewMemRemote()
	st, err := pagestore.New(rem, pagestore.Options{CacheBytes: 8 * PageSize})
	if err != nil {
		f.Fatal(err)
	}
	st.AddVolume(memnode.VolumeInfo{ID: 1, Name: "v", Size: 64 * PageSize})
	srv := &Server{Backend: st, Workers: 2}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	go srv.Serve(context.Background(), ln)
	f.Cleanup(func() { srv.Close() })
	f.Fuzz(func(t *testing.T, in []byte) {
		testnet.Exchange(t, ln.Addr().String(), in)
	})
}
