package units

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"4096": 4096, "64MiB": 64 << 20, "1GiB": 1 << 30, "512k": 512 << 10, "2T": 2 << 40, "7B": 7,
		"1GB": 1 << 30, "1G": 1 << 30, "1g": 1 << 30, "1gb": 1 << 30, "1gib": 1 << 30, "16MB": 16 << 20, "4kb": 4 << 10,
	} {
		got, err := ParseSize(in)
		assert.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "MiB", "-1", "1.5GiB", "99999999999TiB", "1GiBB", "1 PB", "G1"} {
		_, err := ParseSize(bad)
		assert.Error(t, err, bad)
	}
	assert.Equal(t, "64MiB", FormatSize(64<<20))
	assert.Equal(t, "4097B", FormatSize(4097))
}

func TestParseMultiple(t *testing.T) {
	n, err := ParseMultiple("64MB", 4096)
	assert.NoError(t, err)
	assert.Equal(t, uint64(64<<20), n)
	_, err = ParseMultiple("1000", 4096)
	assert.ErrorContains(t, err, "not a whole number of 4KiB pages")
	assert.ErrorContains(t, err, "4KiB", "the nearest page multiple above is suggested")
	_, err = ParseMultiple("10000", 4096)
	assert.ErrorContains(t, err, "use 8KiB or 12KiB")
}

func TestCount(t *testing.T) {
	for _, c := range []struct {
		n         int
		one, many string
		want      string
	}{
		{0, "node", "", "0 nodes"},
		{1, "node", "", "1 node"},
		{2, "copy", "copies", "2 copies"},
		{1, "copy", "copies", "1 copy"},
	} {
		if got := Count(c.n, c.one, c.many); got != c.want {
			t.Errorf("Count(%d, %q, %q) = %q, want %q", c.n, c.one, c.many, got, c.want)
		}
	}
}

func TestApprox(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 512: "512B", 1536: "1.50KiB", 67170304: "64.1MiB", 200 << 30: "200GiB"} {
		if got := Approx(n); got != want {
			t.Errorf("Approx(%d) = %q, want %q", n, got, want)
		}
	}
}
