package parse

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func frame(op pageproto.Op, id pageid.Key) []byte {
	var h [pageproto.HeaderSize]byte
	(&pageproto.Header{Op: op, ID: id, Tag: 9}).EncodeRequest(h[:])
	return append(h[:], make([]byte, op.PayloadLen())...)
}

func session() ([]byte, []Access) {
	var stream []byte
	var want []Access
	for i := 0; i < 50; i++ {
		k := pageid.MakeKey(1, uint64(i))
		switch i % 4 {
		case 0, 1:
			stream = append(stream, frame(pageproto.OpGet, k)...)
			want = append(want, Access{k, Read})
		case 2:
			stream = append(stream, frame(pageproto.OpPut, k)...)
			want = append(want, Access{k, Write})
		case 3:
			stream = append(stream, frame(pageproto.OpSync, 0)...)
		}
	}
	return stream, want
}

// TestPageParserAnySplit: every way of cutting the stream yields the same
// accesses in order.
func TestPageParserAnySplit(t *testing.T) {
	stream, want := session()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		var p PageParser
		var got []Access
		b := stream
		for len(b) > 0 {
			n := 1 + rng.IntN(min(len(b), 5000))
			var err error
			got, err = p.Feed(b[:n], got)
			require.NoError(t, err)
			b = b[n:]
		}
		require.Equal(t, want, got)
	}
	// Byte by byte.
	var p PageParser
	var got []Access
	for i := range stream {
		got, _ = p.Feed(stream[i:i+1], got)
	}
	assert.Equal(t, want, got)
}

func TestPageParserLosesSyncOnGarbage(t *testing.T) {
	var p PageParser
	out, err := p.Feed(append(frame(pageproto.OpGet, 5), 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), nil)
	assert.ErrorIs(t, err, ErrLostSync)
	assert.Equal(t, []Access{{5, Read}}, out, "accesses before the garbage are kept")
	_, err = p.Feed(frame(pageproto.OpGet, 6), nil)
	assert.ErrorIs(t, err, ErrLostSync, "a dead parser stays dead")
}

func FuzzPageParser(f *testing.F) {
	s, _ := session()
	f.Add(s, uint16(7))
	f.Add([]byte{0x50, 2, 0, 0}, uint16(1))
	f.Fuzz(func(t *testing.T, in []byte, cut uint16) {
		// Split at cut and compare with the unsplit parse.
		var a, b PageParser
		whole, errA := a.Feed(in, nil)
		c := int(cut) % (len(in) + 1)
		parts, errB := b.Feed(in[:c], nil)
		if errB == nil {
			parts, errB = b.Feed(in[c:], parts)
		}
		if (errA == nil) != (errB == nil) {
			t.Fatalf("split at %d changed the outcome: %v vs %v", c, errA, errB)
		}
		if !slices.Equal(whole, parts) {
			t.Fatalf("split at %d changed the accesses: %v vs %v", c, whole, parts)
		}
		for _, a := range whole {
			if a.Kind < Read || a.Kind > Delete {
				t.Fatalf("access %v of kind %d", a.Key, a.Kind)
			}
		}
	})
}
