package parse

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func nbdRequest(typ nbdproto.Cmd, off uint64, n uint32) []byte {
	b := (&nbdproto.Request{Cmd: typ, Cookie: 99, Offset: off, Length: n}).Append(nil)
	if typ == nbdproto.CmdWrite {
		b = append(b, make([]byte, n)...)
	}
	return b
}

func goData(name string) []byte {
	d := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	return binary.BigEndian.AppendUint16(append(d, name...), 0)
}

// nbdSession is what a client like nbdinfo or fio sends: flags, structured
// replies, a GO for an unknown export, a GO for disk0, then requests.
func nbdSession() ([]byte, []Access) {
	var s []byte
	s = binary.BigEndian.AppendUint32(s, 3)
	s = append(s, nbdproto.AppendOption(nil, 8, nil)...)
	s = append(s, nbdproto.AppendOption(nil, nbdproto.OptGo, goData("nope"))...)
	s = append(s, nbdproto.AppendOption(nil, nbdproto.OptGo, goData("disk0"))...)
	s = append(s, nbdRequest(nbdproto.CmdRead, 4096, 8192)...)
	s = append(s, nbdRequest(nbdproto.CmdWrite, 100, 5000)...)
	s = append(s, nbdRequest(4, 0, 1<<20)...) // TRIM: nothing
	s = append(s, nbdRequest(nbdproto.CmdWrite, 8192, 4096)...)
	s = append(s, nbdRequest(nbdproto.CmdCache, 40960, 10)...)
	k := func(p uint64) pageid.Key { return pageid.MakeKey(7, p) }
	want := []Access{{k(1), Read}, {k(2), Read}, {k(0), Read}, {k(1), Read}, {k(2), Write}, {k(10), Read}}
	return s, want
}

func resolve(name string) (uint16, bool) {
	if name == "disk0" || name == "" {
		return 7, true
	}
	return 0, false
}

func TestNBDParserAnySplit(t *testing.T) {
	stream, want := nbdSession()
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 300; trial++ {
		p := &NBDParser{Resolve: resolve}
		var got []Access
		for b := stream; len(b) > 0; {
			n := 1 + rng.IntN(min(len(b), 64))
			var err error
			got, err = p.Feed(b[:n], got)
			require.NoError(t, err)
			b = b[n:]
		}
		require.Equal(t, want, got)
	}
}

func TestNBDParserExportName(t *testing.T) {
	var s []byte
	s = binary.BigEndian.AppendUint32(s, 1)
	s = append(s, nbdproto.AppendOption(nil, nbdproto.OptExportName, nil)...) // the default export
	s = append(s, nbdRequest(nbdproto.CmdRead, 0, 3*4096)...)
	s = append(s, nbdRequest(nbdproto.CmdDisc, 0, 0)...)
	p := &NBDParser{Resolve: resolve}
	got, err := p.Feed(s, nil)
	require.NoError(t, err)
	assert.Len(t, got, 3)
	_, err = p.Feed([]byte{1}, nil)
	assert.ErrorIs(t, err, ErrLostSync, "nothing follows DISC")
}

func TestNBDParserGarbage(t *testing.T) {
	p := &NBDParser{Resolve: resolve}
	s := binary.BigEndian.AppendUint32(nil, 1)
	s = append(s, nbdproto.AppendOption(nil, nbdproto.OptGo, goData("disk0"))...)
	s = append(s, 0xde, 0xad, 0xbe, 0xef)
	s = append(s, make([]byte, 24)...)
	_, err := p.Feed(s, nil)
	assert.ErrorIs(t, err, ErrLostSync)
}

func FuzzNBDParser(f *testing.F) {
	s, _ := nbdSession()
	f.Add(s, uint16(33))
	f.Fuzz(func(t *testing.T, in []byte, cut uint16) {
		a := &NBDParser{Resolve: resolve, MaxPages: 16}
		b := &NBDParser{Resolve: resolve, MaxPages: 16}
		whole, errA := a.Feed(in, nil)
		c := int(cut) % (len(in) + 1)
		parts, errB := b.Feed(in[:c], nil)
		if errB == nil {
			parts, errB = b.Feed(in[c:], parts)
		}
		if (errA == nil) != (errB == nil) || !slices.Equal(whole, parts) {
			t.Fatalf("split at %d changed the parse: %v/%v vs %v/%v", c, errA, whole, errB, parts)
		}
		for _, a := range whole {
			// Only the export resolve knows, and NBD has no deletes.
			if a.Key.Volume() != 7 || a.Kind != Read && a.Kind != Write {
				t.Fatalf("access %v of kind %v", a.Key, a.Kind)
			}
		}
	})
}
