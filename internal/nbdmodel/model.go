// Package nbdmodel checks an NBD server against a model of one export,
// for tests: batches of random requests — READ, WRITE (+FUA), WRITE_ZEROES
// (+NO_HOLE, +FAST_ZERO), TRIM, CACHE, FLUSH, aligned or not, 1 byte to
// 512 KiB, now and then past the end — up to 16 in flight on ranges that
// do not overlap, so that the replies, in whatever order they come, have
// one meaning; every reply is checked against the model as it arrives.
//
// The model holds pd3 to more than the protocol asks in one place: a
// trimmed range reads as zeroes (pd3 trims as WRITE_ZEROES without
// NO_HOLE does), so a trim that let older bytes show through would be
// caught as the stale read it is.
package nbdmodel

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/nbd/nbdproto"
)

// request is one request of a batch and what the model expects of it.
type request struct {
	cmd    nbdproto.Cmd
	flags  nbdproto.CmdFlags
	off    uint64
	length uint32
	data   []byte // a WRITE's payload
	// past is set for a request that reaches past the end of the export:
	// it must fail and change nothing.
	past bool
	ok   bool // it succeeded: the model applies it after its batch
}

func (q *request) String() string {
	return fmt.Sprintf("%v %v off %d len %d", q.cmd, q.flags, q.off, q.length)
}

// Model is the expected content of an export.
type Model struct {
	t     testing.TB
	rng   *rand.Rand
	bytes []byte
	log   []string
}

func (m *Model) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
	if len(m.log) > 60 {
		m.log = m.log[1:]
	}
}

func (m *Model) fail(format string, args ...any) {
	m.t.Helper()
	var b bytes.Buffer
	for _, l := range m.log {
		b.WriteString("  " + l + "\n")
	}
	m.t.Fatalf("%s\nlast requests (a batch's in the order sent):\n%s", fmt.Sprintf(format, args...), b.String())
}

// hot is the head of the export that half of the requests fall in, so
// that reads, prefetches, writes, trims and write-backs of the same pages
// meet (over the whole export they rarely would).
const hot = 256 << 10

// span picks a range biased to the hot head, page boundaries, small
// unaligned pieces and now and then a large one.
func (m *Model) span() (uint64, uint32) {
	size := uint64(len(m.bytes))
	off := m.rng.Uint64N(size)
	if m.rng.IntN(2) == 0 {
		off = m.rng.Uint64N(min(hot, size))
	}
	if m.rng.IntN(2) == 0 {
		off &^= 4095
	}
	n := 1 + m.rng.Uint32N(64<<10)
	switch m.rng.IntN(4) {
	case 0:
		n = 1 + m.rng.Uint32N(64)
	case 1:
		n = (n + 4095) &^ 4095
	case 2:
		if m.rng.IntN(8) == 0 {
			n = 1 + m.rng.Uint32N(512<<10)
		}
	}
	return off, uint32(min(uint64(n), size-off))
}

// random makes a random request on a range no other request of its
// batch touches (so the batch's replies, in any order, have one meaning).
func (m *Model) random(taken [][2]uint64) *request {
	size := uint64(len(m.bytes))
	for {
		q := &request{}
		q.off, q.length = m.span()
		switch r := m.rng.IntN(100); {
		case r < 40:
			q.cmd = nbdproto.CmdRead
		case r < 70:
			q.cmd = nbdproto.CmdWrite
			if m.rng.IntN(4) == 0 {
				q.flags = nbdproto.CmdFlagFUA
			}
		case r < 82:
			q.cmd = nbdproto.CmdWriteZeroes
			if m.rng.IntN(2) == 0 {
				q.flags |= nbdproto.CmdFlagNoHole
			}
			if m.rng.IntN(4) == 0 {
				q.flags |= nbdproto.CmdFlagFastZero
			}
		case r < 90:
			q.cmd = nbdproto.CmdTrim
		case r < 95:
			q.cmd = nbdproto.CmdCache
		default:
			q.cmd = nbdproto.CmdFlush
			q.off, q.length = 0, 0
		}
		if q.cmd != nbdproto.CmdFlush && m.rng.IntN(50) == 0 {
			// Past the end: from within the last page, or from the end.
			q.off = size - uint64(m.rng.IntN(4096))
			q.length = 4097 + m.rng.Uint32N(8192)
			q.past = true
		}
		lo, hi := q.off, q.off+uint64(q.length)
		clash := false
		for _, r := range taken {
			if lo < r[1] && r[0] < hi {
				clash = true
			}
		}
		if clash {
			continue
		}
		if q.cmd == nbdproto.CmdWrite {
			q.data = make([]byte, q.length)
			for i := range q.data {
				q.data[i] = byte(m.rng.Uint32())
			}
		}
		return q
	}
}

// readReply reads one reply, simple or structured (all of its chunks),
// and returns its cookie, errno and, for a READ, the data it carried.
// With structured replies negotiated a READ must get a structured reply;
// other requests may get either kind.
func readReply(t testing.TB, nc net.Conn, r *bufio.Reader, structured bool, pending map[uint64]*request) (uint64, nbdproto.Errno, []byte) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	magic, err := r.Peek(4)
	require.NoError(t, err)
	if binary.BigEndian.Uint32(magic) == nbdproto.MagicSimpleReply {
		var h [nbdproto.SimpleReplyLen]byte
		_, err := io.ReadFull(r, h[:])
		require.NoError(t, err)
		errno, cookie := nbdproto.Errno(binary.BigEndian.Uint32(h[4:])), binary.BigEndian.Uint64(h[8:])
		q := pending[cookie]
		require.NotNil(t, q, "a reply to cookie %d, which is not in flight", cookie)
		var data []byte
		if q.cmd == nbdproto.CmdRead {
			require.False(t, structured, "a simple reply to a READ after structured replies were negotiated")
			if errno == 0 {
				data = make([]byte, q.length)
				_, err = io.ReadFull(r, data)
				require.NoError(t, err)
			}
		}
		return cookie, errno, data
	}
	require.True(t, structured, "a structured reply the client did not ask for")
	var cookie uint64
	var errno nbdproto.Errno
	var data []byte
	for first := true; ; first = false {
		var h [20]byte
		_, err := io.ReadFull(r, h[:])
		require.NoError(t, err)
		require.Equal(t, nbdproto.MagicStructuredReply, binary.BigEndian.Uint32(h[0:]))
		flags, typ := binary.BigEndian.Uint16(h[4:]), nbdproto.Chunk(binary.BigEndian.Uint16(h[6:]))
		ck, n := binary.BigEndian.Uint64(h[8:]), binary.BigEndian.Uint32(h[16:])
		if first {
			cookie = ck
		}
		// The protocol lets chunks of different replies interleave; this
		// server sends each reply whole, and the reader relies on it.
		require.Equal(t, cookie, ck, "a reply's chunks interleave with another's")
		q := pending[cookie]
		require.NotNil(t, q, "a reply to cookie %d, which is not in flight", cookie)
		payload := make([]byte, n)
		_, err = io.ReadFull(r, payload)
		require.NoError(t, err)
		switch typ {
		case nbdproto.ChunkNone:
		case nbdproto.ChunkOffsetData:
			require.Equal(t, nbdproto.CmdRead, q.cmd)
			at := binary.BigEndian.Uint64(payload) - q.off
			require.LessOrEqual(t, at+uint64(n-8), uint64(q.length), "a data chunk past its request")
			if data == nil {
				data = make([]byte, q.length)
			}
			copy(data[at:], payload[8:])
		case nbdproto.ChunkError:
			errno = nbdproto.Errno(binary.BigEndian.Uint32(payload))
		default:
			t.Fatalf("chunk type %v in a reply to %v", typ, q)
		}
		if flags&nbdproto.ChunkFlagDone != 0 {
			return cookie, errno, data
		}
	}
}

// check compares a successful READ with the model.
func (m *Model) check(q *request, got []byte) {
	m.t.Helper()
	if len(got) != int(q.length) {
		m.fail("%v: %d bytes read", q, len(got))
	}
	want := m.bytes[q.off : q.off+uint64(q.length)]
	for i := range got {
		if got[i] != want[i] {
			m.fail("%v: byte %d (offset %d) is %#x, want %#x", q, i, q.off+uint64(i), got[i], want[i])
		}
	}
}

// apply records what a successful request did.
func (m *Model) apply(q *request) {
	lo, hi := q.off, q.off+uint64(q.length)
	switch q.cmd {
	case nbdproto.CmdWrite:
		copy(m.bytes[lo:hi], q.data)
	case nbdproto.CmdWriteZeroes, nbdproto.CmdTrim:
		// The protocol lets a trimmed range read as anything; pd3 promises
		// zeroes (it trims as WRITE_ZEROES without NO_HOLE does), and a
		// trimmed range that showed older bytes would be a stale read.
		clear(m.bytes[lo:hi])
	}
}

// New is the model of a new export of size bytes (all zeroes), driven by
// a generator seeded with seed.
func New(t testing.TB, size uint64, seed uint64) *Model {
	return &Model{t: t, rng: rand.New(rand.NewPCG(seed, 11)), bytes: make([]byte, size)}
}

// Run sends rounds batches of random requests on c (negotiated with
// structured replies if structured) and checks each reply; it returns how
// many requests of each command succeeded.
func (m *Model) Run(c *nbdclient.Client, structured bool, rounds int) map[nbdproto.Cmd]int {
	m.t.Helper()
	t := m.t
	nc, r := c.Conn()
	size := uint64(len(m.bytes))
	var cookie uint64
	ops := map[nbdproto.Cmd]int{}
	for range rounds {
		var batch []*request
		var taken [][2]uint64
		pending := map[uint64]*request{}
		var wire []byte
		for range 1 + m.rng.IntN(16) {
			q := m.random(taken)
			taken = append(taken, [2]uint64{q.off, q.off + uint64(q.length)})
			batch = append(batch, q)
			cookie++
			pending[cookie] = q
			m.logf("%d: %v", cookie, q)
			req := nbdproto.Request{Cmd: q.cmd, Flags: q.flags, Cookie: cookie, Offset: q.off, Length: q.length}
			wire = append(req.Append(wire), q.data...)
		}
		_, err := nc.Write(wire)
		require.NoError(t, err)
		for len(pending) > 0 {
			ck, errno, data := readReply(t, nc, r, structured, pending)
			q := pending[ck]
			delete(pending, ck)
			switch {
			case q.past:
				if errno == 0 {
					m.fail("%d: %v past the end of a %d-byte export succeeded", ck, q, size)
				}
				continue
			case q.cmd == nbdproto.CmdWriteZeroes && q.flags&nbdproto.CmdFlagFastZero != 0 && errno == nbdproto.ENOTSUP:
				continue // a fast zero may be refused, and then changes nothing
			case errno != 0:
				m.fail("%d: %v failed: %v", ck, q, errno)
			}
			q.ok = true
			ops[q.cmd]++
			if q.cmd == nbdproto.CmdRead {
				m.check(q, data)
			}
		}
		for _, q := range batch {
			if q.ok {
				m.apply(q)
			}
		}
	}
	return ops
}

// CheckAll reads the whole export through c (simple replies, one request
// at a time) and compares it with the model.
func (m *Model) CheckAll(c *nbdclient.Client) {
	m.t.Helper()
	const step = 1 << 20
	for off := uint64(0); off < uint64(len(m.bytes)); off += step {
		q := &request{cmd: nbdproto.CmdRead, off: off, length: uint32(min(step, uint64(len(m.bytes))-off))}
		data := make([]byte, q.length)
		require.NoError(m.t, c.Read(q.off, data))
		m.check(q, data)
	}
}

// Check runs a model of export (size bytes, new) at addr: rounds batches
// on one connection (a quarter of them under -short), midway (if not nil)
// halfway through, then the whole export read back through a second
// connection. The seed comes from testutil.Seed (PD3_SEED replays).
func Check(t testing.TB, addr, export string, size uint64, structured bool, rounds int, midway func()) {
	t.Helper()
	if testing.Short() {
		rounds /= 4
	}
	c, err := nbdclient.DialOptions(addr, export, nbdclient.Options{Structured: structured})
	require.NoError(t, err)
	defer c.Close()
	m := New(t, size, testutil.Seed(t))
	t.Logf("requests that succeeded: %v", m.Run(c, structured, rounds/2))
	if midway != nil {
		midway()
	}
	t.Logf("and after halfway: %v", m.Run(c, structured, rounds-rounds/2))
	c2, err := nbdclient.Dial(addr, export)
	require.NoError(t, err)
	defer c2.Close()
	m.CheckAll(c2)
}
