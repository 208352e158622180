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
