package pageid

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestKey(t *testing.T) {
	k := MakeKey(7, 1<<40+3)
	assert.Equal(t, uint16(7), k.Volume())
	assert.Equal(t, uint64(1<<40+3), k.Page())
	assert.Equal(t, "7:1099511627779", k.String())
	assert.Equal(t, uint64(5), MakeKey(1, 1<<48+5).Page(), "page numbers wrap at 48 bits, never into the volume")
	assert.Equal(t, uint16(1), MakeKey(1, 1<<48+5).Volume())
}

func TestFailuresSayOnceWhatFailed(t *testing.T) {
	var f Failures
	assert.NoError(t, f.Err("writing", 64))
	cause := errors.New("no space")
	f.Add(MakeKey(1, 12099), cause)
	assert.EqualError(t, f.Err("writing", 64), "writing page 1:12099: no space")
	for p := uint64(12100); p < 12162; p++ {
		f.Add(MakeKey(1, p), fmt.Errorf("other: %w", cause))
	}
	f.Add(MakeKey(1, 12050), cause)
	err := f.Err("writing", 64)
	assert.EqualError(t, err, "writing 64 of 64 pages failed (1:12050 to 1:12161), the first: no space")
	assert.ErrorIs(t, err, cause)
}

func TestRunsJoinAdjacentRunsOfOneKind(t *testing.T) {
	type run struct {
		off, n uint64
		hole   bool
	}
	var got []run
	r := Runs{Emit: func(off, n uint64, hole bool) { got = append(got, run{off, n, hole}) }}
	r.Add(0, 10, true)
	r.Add(10, 5, true)
	r.Add(15, 5, false)
	r.Add(20, 1, false)
	r.Add(30, 2, false) // not adjacent: a run of its own
	r.Flush()
	r.Flush()
	want := []run{{0, 15, true}, {15, 6, false}, {30, 2, false}}
	if len(got) != len(want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("runs %v, want %v", got, want)
		}
	}
}
