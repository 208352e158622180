package pagecache

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/stretchr/testify/assert"
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
