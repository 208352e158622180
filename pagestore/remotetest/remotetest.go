package remotetest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Capabilities names the optional interfaces a Remote offers, and
// whether it knows its volumes.
type Capabilities struct {
	PagesReader, StreamReader, AsyncReader, AsyncPagesReader, Trimmer, Mapper bool
	// Bounded is a promise, not an interface: the Remote knows the
	// volumes it serves and their sizes (every Remote over memory nodes;
	// not MemRemote, which holds any key). A read or write of a volume it
	// does not serve fails with pageid.ErrNoVolume, one past the end of
	// its volume with pageid.ErrOutOfRange, and a call whose context is
	// done fails rather than waits.
	Bounded bool
}

// Of reports the capabilities r offers.
func Of(r pagestore.Remote) Capabilities {
	_, pr := r.(pagestore.PagesReader)
	_, sr := r.(pagestore.StreamReader)
	_, ar := r.(pagestore.AsyncReader)
	_, apr := r.(pagestore.AsyncPagesReader)
	_, tr := r.(pagestore.Trimmer)
	_, mp := r.(pagestore.Mapper)
	return Capabilities{PagesReader: pr, StreamReader: sr, AsyncReader: ar, AsyncPagesReader: apr, Trimmer: tr, Mapper: mp}
}

// Pages is the volume size Run needs, in pages.
const Pages = 256

// Run checks r, which must serve volume vol (at least Pages pages, never
// written before). want is the capabilities r must offer: a wrapper that
// loses one (or gains one it cannot honour) fails here.
func Run(t *testing.T, r pagestore.Remote, vol uint16, want Capabilities) {
	t.Helper()
	offered := want
	offered.Bounded = false // not an interface: checked below
	require.Equal(t, offered, Of(r), "capabilities offered")
	c := &checker{r: r, vol: vol}
	t.Run("UnwrittenReadsZero", c.unwrittenReadsZero)
	t.Run("WriteThenRead", c.writeThenRead)
	t.Run("LastWriteWins", c.lastWriteWins)
	t.Run("LargeBatch", c.largeBatch)
	t.Run("ConcurrentOwners", c.concurrentOwners)
	if want.PagesReader {
		t.Run("ReadPagesEqualsReadPage", c.readPages)
	}
	if want.StreamReader {
		t.Run("ReadStreamPagesEqualsReadPage", c.readStreamPages)
	}
	if want.AsyncReader {
		t.Run("ReadPageAsyncOnce", c.readPageAsync)
	}
	if want.AsyncPagesReader {
		t.Run("ReadPagesAsyncEqualsReadPage", c.readPagesAsync)
	}
	if want.Trimmer {
		t.Run("TrimZeroesOnlyItsRange", c.trim)
	}
	if want.Bounded {
		t.Run("UnknownVolumeFails", c.unknownVolume)
		t.Run("PastTheEndFails", c.pastTheEnd)
		t.Run("DoneContextFails", c.doneContext)
	}
	if want.Mapper && want.Trimmer {
		// Last: it maps what trim left.
		t.Run("MapCoversTheRangeAndKnowsData", c.mapRuns)
	}
}

type checker struct {
	r   pagestore.Remote
	vol uint16
}

// Page ranges, disjoint so the subtests do not see each other's writes.
const (
	zeroBase  = 0   // never written
	wrBase    = 16  // WriteThenRead, LastWriteWins
	batchBase = 32  // LargeBatch: 96 pages
	ownBase   = 128 // ConcurrentOwners: 64 pages
	runBase   = 192 // ReadPages: 32 pages, some written
	asyncBase = 224 // ReadPageAsync: 16 pages
	trimBase  = 240 // Trim: 16 pages
)

func (c *checker) key(p uint64) pageid.Key { return pageid.MakeKey(c.vol, p) }

// content is page p's bytes at version v: distinct per page and version.
func content(k pageid.Key, v uint64) []byte {
	b := make([]byte, pageid.Size)
	for i := 0; i < len(b); i += 16 {
		binary.LittleEndian.PutUint64(b[i:], uint64(k))
		binary.LittleEndian.PutUint64(b[i+8:], v)
	}
	return b
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func (c *checker) write(t *testing.T, v uint64, pages ...uint64) {
	t.Helper()
	keys := make([]pageid.Key, len(pages))
	data := make([][]byte, len(pages))
	for i, p := range pages {
		keys[i], data[i] = c.key(p), content(c.key(p), v)
	}
	require.NoError(t, c.r.WritePages(ctx(t), keys, data))
}

func (c *checker) expect(t *testing.T, p uint64, want []byte) {
	t.Helper()
	got := bytes.Repeat([]byte{0xAA}, pageid.Size) // not what any page holds
	require.NoError(t, c.r.ReadPage(ctx(t), c.key(p), got))
	if !bytes.Equal(want, got) {
		t.Fatalf("page %v: got version %d of %#x, want version %d of %#x", c.key(p),
			binary.LittleEndian.Uint64(got[8:]), binary.LittleEndian.Uint64(got), binary.LittleEndian.Uint64(want[8:]), binary.LittleEndian.Uint64(want))
	}
}

var zero = make([]byte, pageid.Size)

func (c *checker) unwrittenReadsZero(t *testing.T) {
	for p := uint64(zeroBase); p < zeroBase+4; p++ {
		c.expect(t, p, zero)
	}
}

func (c *checker) writeThenRead(t *testing.T) {
	c.write(t, 1, wrBase, wrBase+1, wrBase+5)
	c.expect(t, wrBase, content(c.key(wrBase), 1))
	c.expect(t, wrBase+1, content(c.key(wrBase+1), 1))
	c.expect(t, wrBase+2, zero)
	c.expect(t, wrBase+5, content(c.key(wrBase+5), 1))
}

func (c *checker) lastWriteWins(t *testing.T) {
	for v := uint64(2); v < 6; v++ {
		c.write(t, v, wrBase+8)
		c.expect(t, wrBase+8, content(c.key(wrBase+8), v))
	}
}

// largeBatch writes more pages in one call than any Remote sends at once.
func (c *checker) largeBatch(t *testing.T) {
	var pages []uint64
	for p := uint64(batchBase); p < batchBase+96; p++ {
		pages = append(pages, p)
	}
	c.write(t, 3, pages...)
	for _, p := range pages {
		c.expect(t, p, content(c.key(p), 3))
	}
}

// concurrentOwners: goroutines each own pages and write and read them at
// once; each must read its own latest write, whatever the others do.
func (c *checker) concurrentOwners(t *testing.T) {
	const owners, each, rounds = 8, 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, owners)
	for o := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, pageid.Size)
			for v := uint64(1); v <= rounds; v++ {
				for i := range each {
					k := c.key(ownBase + uint64(o*each+i))
					if err := c.r.WritePages(context.Background(), []pageid.Key{k}, [][]byte{content(k, v)}); err != nil {
						errs <- err
						return
					}
					if err := c.r.ReadPage(context.Background(), k, buf); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(buf, content(k, v)) {
						errs <- fmt.Errorf("page %v: read version %d right after writing %d", k, binary.LittleEndian.Uint64(buf[8:]), v)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (c *checker) readPages(t *testing.T) {
	pr := c.r.(pagestore.PagesReader)
	c.write(t, 4, runBase+1, runBase+2, runBase+7, runBase+31)
	for _, run := range []struct{ first, n uint64 }{{runBase, 1}, {runBase, 8}, {runBase + 1, 2}, {runBase, 32}, {runBase + 3, 3}} {
		p := bytes.Repeat([]byte{0xAA}, int(run.n)*pageid.Size)
		require.NoError(t, pr.ReadPages(ctx(t), c.key(run.first), p))
		for i := range run.n {
			want := make([]byte, pageid.Size)
			require.NoError(t, c.r.ReadPage(ctx(t), c.key(run.first+i), want))
			assert.True(t, bytes.Equal(want, p[i*pageid.Size:(i+1)*pageid.Size]), "run of %d from %d: page %d differs from ReadPage", run.n, run.first, run.first+i)
		}
	}
}

// onceEach starts n asynchronous calls (start(i, done) each) and requires
// that every done is called exactly once, without an error.
func onceEach(t *testing.T, n int, start func(i int, done func(error))) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	calls := make([]int, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		start(i, func(err error) {
			mu.Lock()
			calls[i]++
			errs[i] = err
			mu.Unlock()
			wg.Done()
		})
	}
	wg.Wait()
	time.Sleep(10 * time.Millisecond) // a second call of done would come now
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		require.Equal(t, 1, calls[i], "done calls for call %d", i)
		require.NoError(t, errs[i], "call %d", i)
	}
}

// readStreamPages reads runs of the pages readPages wrote as a stream
// does, telling the remote of a page taken elsewhere as a stream does:
// each page equals ReadPage's, and a stream's read changes nothing a
// later read sees.
func (c *checker) readStreamPages(t *testing.T) {
	sr := c.r.(pagestore.StreamReader)
	c.write(t, 7, runBase+2, runBase+12)
	for _, run := range []struct{ first, n uint64 }{{runBase, 1}, {runBase, 8}, {runBase + 2, 2}, {runBase, 32}, {runBase + 11, 3}} {
		p := bytes.Repeat([]byte{0xAA}, int(run.n)*pageid.Size)
		require.NoError(t, sr.ReadStreamPages(ctx(t), c.key(run.first), p))
		sr.StreamTook(c.key(run.first + run.n - 1))
		for i := range run.n {
			want := make([]byte, pageid.Size)
			require.NoError(t, c.r.ReadPage(ctx(t), c.key(run.first+i), want))
			assert.True(t, bytes.Equal(want, p[i*pageid.Size:(i+1)*pageid.Size]), "stream of %d from %d: page %d differs from ReadPage", run.n, run.first, run.first+i)
		}
	}
	c.expect(t, runBase+2, content(c.key(runBase+2), 7))
}

// readPagesAsync reads runs of the pages readPages wrote, all at once:
// each done is called once, and each page equals ReadPage's.
func (c *checker) readPagesAsync(t *testing.T) {
	apr := c.r.(pagestore.AsyncPagesReader)
	c.write(t, 6, runBase+1, runBase+9, runBase+16)
	runs := []struct{ first, n uint64 }{{runBase, 1}, {runBase, 2}, {runBase + 1, 8}, {runBase + 8, 16}, {runBase + 15, 3}}
	bufs := make([][]byte, len(runs))
	onceEach(t, len(runs), func(x int, done func(error)) {
		bufs[x] = bytes.Repeat([]byte{0xAA}, int(runs[x].n)*pageid.Size)
		apr.ReadPagesAsync(c.key(runs[x].first), bufs[x], done)
	})
	for x, run := range runs {
		for i := range run.n {
			want := make([]byte, pageid.Size)
			require.NoError(t, c.r.ReadPage(ctx(t), c.key(run.first+i), want))
			assert.True(t, bytes.Equal(want, bufs[x][i*pageid.Size:(i+1)*pageid.Size]), "run of %d from %d: page %d differs from ReadPage", run.n, run.first, run.first+i)
		}
	}
}

func (c *checker) readPageAsync(t *testing.T) {
	ar := c.r.(pagestore.AsyncReader)
	c.write(t, 5, asyncBase, asyncBase+2)
	bufs := make([][]byte, 16)
	onceEach(t, len(bufs), func(i int, done func(error)) {
		bufs[i] = make([]byte, pageid.Size)
		ar.ReadPageAsync(c.key(asyncBase+uint64(i)), bufs[i], done)
	})
	for i := range bufs {
		want := zero
		if i == 0 || i == 2 {
			want = content(c.key(asyncBase+uint64(i)), 5)
		}
		assert.True(t, bytes.Equal(want, bufs[i]), "page %d", asyncBase+i)
	}
}

func (c *checker) trim(t *testing.T) {
	tr := c.r.(pagestore.Trimmer)
	var pages []uint64
	for p := uint64(trimBase); p < trimBase+16; p++ {
		pages = append(pages, p)
	}
	c.write(t, 6, pages...)
	// The Store trims whole pages only.
	require.NoError(t, tr.Trim(ctx(t), c.vol, (trimBase+4)*pageid.Size, 8*pageid.Size))
	for _, p := range pages {
		if p >= trimBase+4 && p < trimBase+12 {
			c.expect(t, p, zero)
		} else {
			c.expect(t, p, content(c.key(p), 6))
		}
	}
	c.write(t, 7, trimBase+5)
	c.expect(t, trimBase+5, content(c.key(trimBase+5), 7))
}

// mapRuns checks that Map's runs cover the range asked for, in order and
// without gaps, and that no page written above is called a hole. A remote
// may call a page never written data (its grain may be coarse), so holes
// are not required. It needs the pages TrimZeroesOnlyItsRange leaves.
func (c *checker) mapRuns(t *testing.T) {
	m := c.r.(pagestore.Mapper)
	written := func(p uint64) bool { // by trim, which runs before
		return p >= trimBase && p < trimBase+16 && (p < trimBase+4 || p >= trimBase+12 || p == trimBase+5)
	}
	for _, span := range []struct{ first, pages uint64 }{{0, Pages}, {trimBase + 3, 3}, {trimBase + 5, 1}, {zeroBase, 1}} {
		off, n := span.first*pageid.Size+100, span.pages*pageid.Size-200 // not page-aligned
		at := off
		var holes [][2]uint64
		require.NoError(t, m.Map(ctx(t), c.vol, off, n, func(o, l uint64, hole bool) {
			assert.Equal(t, at, o, "runs follow each other")
			assert.Positive(t, l, "a run is not empty")
			at = o + l
			if hole {
				holes = append(holes, [2]uint64{o, o + l})
			}
		}))
		assert.Equal(t, off+n, at, "the runs end where the range does (pages %d+%d)", span.first, span.pages)
		for _, h := range holes {
			for p := h[0] / pageid.Size; p*pageid.Size < h[1]; p++ {
				if written(p) {
					t.Errorf("page %d was written and is in a hole [%d, %d)", p, h[0], h[1])
				}
			}
		}
	}
}

// unknownVolume: a volume the Remote does not serve is an error callers
// can tell (a frontend answers it as no such export), for reads and
// writes alike.
func (c *checker) unknownVolume(t *testing.T) {
	k := pageid.MakeKey(c.vol^0x4000, 0)
	dst := make([]byte, pageid.Size)
	err := c.r.ReadPage(ctx(t), k, dst)
	require.ErrorIs(t, err, pageid.ErrNoVolume, "reading %v", k)
	err = c.r.WritePages(ctx(t), []pageid.Key{k}, [][]byte{content(k, 1)})
	require.ErrorIs(t, err, pageid.ErrNoVolume, "writing %v", k)
}

// pastTheEnd: a page far past any volume's end is out of range, for a
// read and a write, and the write lands nowhere.
func (c *checker) pastTheEnd(t *testing.T) {
	k := c.key(1 << 40) // 4 PiB into the volume
	dst := make([]byte, pageid.Size)
	err := c.r.ReadPage(ctx(t), k, dst)
	require.ErrorIs(t, err, pageid.ErrOutOfRange, "reading %v", k)
	err = c.r.WritePages(ctx(t), []pageid.Key{k}, [][]byte{content(k, 1)})
	require.ErrorIs(t, err, pageid.ErrOutOfRange, "writing %v", k)
	c.expect(t, zeroBase, zero)
}

// doneContext: a call whose context is already cancelled returns an
// error; it neither waits nor reports success for a write it may not
// have made.
func (c *checker) doneContext(t *testing.T) {
	cx, cancel := context.WithCancel(context.Background())
	cancel()
	k := c.key(zeroBase + 8)
	done := make(chan error, 1)
	go func() { done <- c.r.WritePages(cx, []pageid.Key{k}, [][]byte{content(k, 9)}) }()
	select {
	case err := <-done:
		require.Error(t, err, "a write with a cancelled context")
	case <-time.After(10 * time.Second):
		t.Fatal("a write with a cancelled context did not return in 10 s")
	}
}
