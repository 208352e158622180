package pageproto

import (
	"bytes"
	"testing"

	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

func FuzzHeader(f *testing.F) {
	var b [HeaderSize]byte
	(&Header{Op: OpGet, Tag: 3, ID: pageid.MakeKey(1, 2)}).EncodeRequest(b[:])
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
	(&Header{Op: OpGet, ID: pageid.MakeKey(1, 2)}).EncodeRequest(g[:])
	(&Header{Op: OpPut, ID: pageid.MakeKey(1, 3)}).EncodeRequest(p[:])
	f.Add(g[:])
	f.Add(append(p[:], make([]byte, pageid.Size)...))
	f.Add(append(g[:], 0x50, 3))
	rem := pagestore.NewMemRemote()
	st, err := pagestore.New(rem, pagestore.Options{CacheBytes: 8 * pageid.Size})
	if err != nil {
		f.Fatal(err)
	}
	st.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: 64 * pageid.Size})
	// Once the server hung up it has finished with the input's requests;
	// whatever they did must leave the store whole.
	testnet.FuzzServer(f, &Server{Backend: st, Workers: 2}, st.Check)
}

// FuzzVolumes: any VOLUMES data decodes or fails cleanly; what decodes
// encodes back to the same list.
func FuzzVolumes(f *testing.F) {
	page := make([]byte, pageid.Size)
	EncodeVolumes(page, []pageid.VolumeInfo{{ID: 1, Size: 1 << 30, Name: "disk0"}, {ID: 2, Size: 4096, Name: ""}})
	f.Add(page[:64])
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		vs, _, err := DecodeVolumes(in)
		if err != nil {
			return
		}
		out := make([]byte, pageid.Size)
		if !EncodeVolumes(out, vs) {
			return // more than a page: the input was not a page
		}
		again, more, err := DecodeVolumes(out)
		if err != nil || more || len(again) != len(vs) {
			t.Fatalf("round trip of %d volumes: %d, more %v, %v", len(vs), len(again), more, err)
		}
		for i := range vs {
			if vs[i] != again[i] {
				t.Fatalf("volume %d: %+v → %+v", i, vs[i], again[i])
			}
		}
	})
}
