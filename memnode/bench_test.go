package memnode

import (
	"context"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/pd3-go/pd3/pageid"
)

// BenchmarkRead4K keeps 256 4 KiB READs in flight on one connection to an
// in-process node over loopback TCP.
func BenchmarkRead4K(b *testing.B) {
	_, addr := startNode(b, "", 0)
	c := dialT(b, addr, "")
	ctx := context.Background()
	const region = 64 << 20
	v, err := c.Create(ctx, "b", region)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, ChunkSize)
	for off := uint64(0); off < region; off += ChunkSize {
		if err := c.WriteAt(ctx, v.ID, off, chunk); err != nil {
			b.Fatal(err)
		}
	}
	const depth = 256
	bufs := make([][]byte, depth)
	calls := make([]Call, depth)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range bufs {
		bufs[i] = make([]byte, pageid.Size)
		calls[i] = c.ReadAsync(ctx, v.ID, rng.Uint64N(region/pageid.Size)*pageid.Size, bufs[i])
	}
	b.SetBytes(pageid.Size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := i % depth
		if err := calls[s].Wait(ctx); err != nil {
			b.Fatal(err)
		}
		calls[s] = c.ReadAsync(ctx, v.ID, rng.Uint64N(region/pageid.Size)*pageid.Size, bufs[s])
	}
	for i := range calls {
		calls[i].Wait(ctx)
	}
	w := c.sess.Writer()
	b.ReportMetric(float64(w.Bytes.Load())/float64(w.Writes.Load()), "req-bytes/write")
}

// BenchmarkReadLatency is one 4 KiB READ at a time: the round trip a
// blocked worker waits for on a cache miss.
func BenchmarkReadLatency(b *testing.B) {
	_, addr := startNode(b, "", 0)
	c := dialT(b, addr, "")
	ctx := context.Background()
	v, err := c.Create(ctx, "b", ChunkSize)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, pageid.Size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.ReadAt(ctx, v.ID, uint64(i%256)*pageid.Size, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWrite4K keeps 256 4 KiB WRITEs in flight, on a memory-only and
// on a persistent node (acknowledged only once fdatasync'ed).
func BenchmarkWrite4K(b *testing.B) {
	for _, mode := range []string{"memory", "persist"} {
		b.Run(mode, func(b *testing.B) {
			st := NewStore(0)
			if mode == "persist" {
				var err error
				if st, err = OpenPersistent(b.TempDir(), 0); err != nil {
					b.Fatal(err)
				}
				defer crash(st)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := &Server{Store: st}
			go srv.Serve(context.Background(), ln)
			defer srv.Close()
			c := dialT(b, ln.Addr().String(), "")
			ctx := context.Background()
			v, err := c.Create(ctx, "b", 64<<20)
			if err != nil {
				b.Fatal(err)
			}
			const depth = 256
			page := make([]byte, pageid.Size)
			calls := make([]Call, depth)
			for i := range calls {
				calls[i] = c.WriteAsync(ctx, v.ID, uint64(i)*pageid.Size, page)
			}
			b.SetBytes(pageid.Size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s := i % depth
				if err := calls[s].Wait(ctx); err != nil {
					b.Fatal(err)
				}
				calls[s] = c.WriteAsync(ctx, v.ID, uint64(i%16384)*pageid.Size, page)
			}
			for i := range calls {
				calls[i].Wait(ctx)
			}
			if syncs, entries := st.LogStats(); syncs > 0 {
				b.ReportMetric(float64(entries)/float64(syncs), "entries/sync")
			}
		})
	}
}

// BenchmarkTrimSparse is a trim of a 4 TiB volume past a file's first
// MiB, what a filesystem does to a file's volume past its size.
func BenchmarkTrimSparse(b *testing.B) {
	s := NewStore(0)
	v, err := s.Create("sparse", 4<<40)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := s.WriteAt(v.ID, 0, make([]byte, pageid.Size)); err != nil {
			b.Fatal(err)
		}
		for off := uint64(ChunkSize); off < 4<<40; off += MaxTrim {
			if err := s.Trim(v.ID, off, min(MaxTrim, 4<<40-off)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
