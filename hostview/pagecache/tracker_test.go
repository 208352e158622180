package pagecache

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/stretchr/testify/assert"

	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/pageid"
)

type recorder []Event

func (r *recorder) Event(e Event) { *r = append(*r, e) }

func record(kind Kind, ino, first, last uint64) *ringbuf.Record {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint64(b, ino)
	binary.LittleEndian.PutUint64(b[8:], first)
	binary.LittleEndian.PutUint64(b[16:], last)
	binary.LittleEndian.PutUint32(b[24:], uint32(kind))
	return &ringbuf.Record{RawSample: b}
}

// TestRunsOfEventsReachTheSinkAsOne: adds (and deletes) of consecutive
// pages of one file reach the sink as one range, in the kernel's order
// with everything else; reads pass one by one; a run ends at another
// file, a gap, another kind or maxRun pages; Events counts the kernel's
// events.
func TestRunsOfEventsReachTheSinkAsOne(t *testing.T) {
	var tr Tracker
	var got recorder
	for p := uint64(0); p < 10; p++ {
		tr.deliver(record(Added, 5, p, p), &got)
	}
	tr.deliver(record(Added, 5, 10, 13), &got) // a large folio continues it
	tr.deliver(record(Added, 6, 14, 14), &got) // another file
	tr.deliver(record(Deleted, 5, 3, 3), &got)
	tr.deliver(record(Deleted, 5, 4, 4), &got)
	tr.deliver(record(Deleted, 5, 6, 6), &got) // a gap
	tr.deliver(record(Accessed, 5, 0, 0), &got)
	tr.deliver(record(Accessed, 5, 1, 1), &got)
	for p := uint64(100); p < 100+maxRun+1; p++ {
		tr.deliver(record(Added, 5, p, p), &got)
	}
	assert.Len(t, got, 7, "held until the run ends")
	tr.flush(&got)
	assert.Equal(t, recorder{
		{Kind: Added, Ino: 5, First: 0, Last: 13},
		{Kind: Added, Ino: 6, First: 14, Last: 14},
		{Kind: Deleted, Ino: 5, First: 3, Last: 4},
		{Kind: Deleted, Ino: 5, First: 6, Last: 6},
		{Kind: Accessed, Ino: 5, First: 0, Last: 0},
		{Kind: Accessed, Ino: 5, First: 1, Last: 1},
		{Kind: Added, Ino: 5, First: 100, Last: 100 + maxRun - 1},
		{Kind: Added, Ino: 5, First: 100 + maxRun, Last: 100 + maxRun},
	}, got)
	assert.Equal(t, uint64(10+1+1+3+2+maxRun+1), tr.Events.Load())
	tr.flush(&got)
	assert.Len(t, got, 8, "a flush with nothing held gives nothing")
}

// muter is a recorder that mutes the inodes in quiet.
type muter struct {
	recorder
	quiet map[uint64]bool
	asked int
}

func (m *muter) Mute(ino uint64) bool { m.asked++; return m.quiet[ino] }

// TestMutedFilesReachNoSink: a file the sink mutes gets no more events
// (those still in the ring are dropped, and counted as delivered); once
// the sink wants it again, after muteCheck, its events flow.
func TestMutedFilesReachNoSink(t *testing.T) {
	m := &muter{quiet: map[uint64]bool{7: true}}
	tr := Tracker{muted: make(map[uint64]struct{}), muter: m}
	tr.deliver(record(Added, 5, 0, 0), m)
	tr.deliver(record(Added, 7, 0, 0), m)
	tr.deliver(record(Added, 7, 1, 1), m)
	tr.deliver(record(Accessed, 7, 0, 1), m)
	tr.deliver(record(Added, 5, 1, 1), m)
	tr.flush(m)
	assert.Equal(t, recorder{{Kind: Added, Ino: 5, First: 0, Last: 0}, {Kind: Added, Ino: 5, First: 1, Last: 1}}, m.recorder)
	assert.Equal(t, uint64(5), tr.Events.Load())
	assert.Equal(t, uint64(1), tr.Mutes.Load())
	assert.Equal(t, 1, tr.MutedFiles())

	delete(m.quiet, 7)
	tr.recheck() // checked long ago: asks now
	assert.Zero(t, tr.MutedFiles())
	tr.deliver(record(Added, 7, 2, 2), m)
	tr.flush(m)
	assert.Equal(t, Event{Kind: Added, Ino: 7, First: 2, Last: 2}, m.recorder[len(m.recorder)-1])

	m.quiet[7] = true
	tr.deliver(record(Added, 7, 3, 3), m)
	tr.flush(m)
	delete(m.quiet, 7)
	asked := m.asked
	tr.recheck() // within muteCheck of the last: not asked
	assert.Equal(t, asked, m.asked)
	assert.Equal(t, 1, tr.MutedFiles())
}

// TestMutingForgetsTheFilesPages: a view muting a file drops the pages it
// held of it from Host View (and tells OnRange), keeps other files', and
// on its next add after unmuting holds only what it hears then.
func TestMutingForgetsTheFilesPages(t *testing.T) {
	quiet := false
	var dropped [][2]uint64
	v := &View{
		Set:   hostview.New(1<<12, 2),
		KeyOf: func(ino, index uint64) (pageid.Key, bool) { return pageid.MakeKey(uint16(ino), index), true },
		Quiet: func(first pageid.Key) bool { return quiet && first.Volume() == 3 },
		OnRange: func(added bool, first pageid.Key, n int) {
			if !added {
				dropped = append(dropped, [2]uint64{first.Page(), uint64(n)})
			}
		},
	}
	in := func(ino, p uint64) bool { return v.Set.Contains(uint64(pageid.MakeKey(uint16(ino), p))) }
	v.Event(Event{Kind: Added, Ino: 3, First: 10, Last: 19})
	v.Event(Event{Kind: Added, Ino: 3, First: 40, Last: 41})
	v.Event(Event{Kind: Added, Ino: 4, First: 10, Last: 19})
	assert.False(t, v.Mute(3))
	assert.True(t, in(3, 15))

	quiet = true
	assert.True(t, v.Mute(3))
	assert.False(t, v.Mute(4))
	for p := uint64(0); p < 50; p++ {
		assert.False(t, in(3, p), "page %d of the muted file", p)
	}
	assert.True(t, in(4, 15), "another file's pages stay")
	assert.Equal(t, [][2]uint64{{10, 32}}, dropped)
	assert.True(t, v.Mute(3), "still quiet")
	assert.Len(t, dropped, 1, "forgotten once")

	quiet = false
	assert.False(t, v.Mute(3))
	v.Event(Event{Kind: Added, Ino: 3, First: 5, Last: 5})
	assert.True(t, in(3, 5))
	quiet = true
	assert.True(t, v.Mute(3))
	assert.Equal(t, [2]uint64{5, 1}, dropped[len(dropped)-1], "only what was added since")
}
