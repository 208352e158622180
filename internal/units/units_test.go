package units

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"4096": 4096, "64MiB": 64 << 20, "1GiB": 1 << 30, "512k": 512 << 10, "2T": 2 << 40, "7B": 7,
	} {
		got, err := ParseSize(in)
		assert.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "MiB", "-1", "1.5GiB", "99999999999TiB"} {
		_, err := ParseSize(bad)
		assert.Error(t, err, bad)
	}
	assert.Equal(t, "64MiB", FormatSize(64<<20))
	assert.Equal(t, "4097B", FormatSize(4097))
}
