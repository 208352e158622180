package pipeline

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTable(t *testing.T) {
	type call struct{ n int }
	tb := NewTable[call](2)
	a, b := &call{1}, &call{2}
	ta, n, err := tb.Register(a)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	tb2, n, err := tb.Register(b)
	require.NoError(t, err)
	assert.Equal(t, 2, n)

	// Full: a third Register waits for a slot.
	c := &call{3}
	got := make(chan uint32)
	go func() {
		tag, _, err := tb.Register(c)
		assert.NoError(t, err)
		got <- tag
	}()
	select {
	case <-got:
		t.Fatal("registered into a full table")
	case <-time.After(20 * time.Millisecond):
	}
	assert.Same(t, a, tb.Take(ta))
	tc := <-got
	assert.Nil(t, tb.Take(ta), "a tag is taken once")
	assert.Equal(t, ta&(1<<idxBits-1), tc&(1<<idxBits-1), "c reuses a's slot")
	assert.NotEqual(t, ta, tc, "with a new generation, so a's late response finds nothing")
	assert.Nil(t, tb.Take(1<<20|9999), "no such slot")

	gone := errors.New("gone")
	calls, first := tb.Fail(gone)
	assert.True(t, first)
	assert.ElementsMatch(t, []*call{b, c}, calls)
	_, first = tb.Fail(errors.New("again"))
	assert.False(t, first)
	assert.Nil(t, tb.Take(tb2))
	_, _, err = tb.Register(&call{4})
	assert.ErrorIs(t, err, gone)
	assert.Zero(t, tb.Pending())
}

// OnAwait hears, in order, each time the table starts and stops having
// calls in flight: once per busy period, and once more at Fail.
func TestTableTellsWhenItAwaits(t *testing.T) {
	type call struct{}
	tb := NewTable[call](4)
	var heard []bool
	tb.OnAwait(func(on bool) { heard = append(heard, on) })
	ta, _, _ := tb.Register(&call{})
	tb2, _, _ := tb.Register(&call{})
	tb.Take(ta)
	assert.Equal(t, []bool{true}, heard, "one call still in flight")
	tb.Take(tb2)
	tb.Take(tb2) // taken already: no second false
	assert.Equal(t, []bool{true, false}, heard)
	tb.Register(&call{})
	tb.Fail(errors.New("gone"))
	tb.Fail(errors.New("again"))
	assert.Equal(t, []bool{true, false, true, false}, heard)
	tb.Register(&call{}) // refused: nothing in flight
	assert.Equal(t, []bool{true, false, true, false}, heard)
}
