package pageid

import (
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
