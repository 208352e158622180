// Package units parses and prints byte sizes as the command line spells
// them: 4096, 64MiB, 1GiB, 512K (binary multiples either way).
package units

import (
	"fmt"
	"strconv"
	"strings"
)

var suffixes = []struct {
	s string
	m uint64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

// ParseSize parses a byte count with an optional binary suffix.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, suf := range suffixes {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(suf.s)) {
			t = strings.TrimSpace(t[:len(t)-len(suf.s)])
			mult = suf.m
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad size %q: want a number with an optional KiB/MiB/GiB/TiB suffix", s)
	}
	if n > ^uint64(0)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

// FormatSize prints n with the largest binary suffix that divides it.
func FormatSize(n uint64) string {
	for _, suf := range suffixes[:4] {
		if n >= suf.m && n%suf.m == 0 {
			return strconv.FormatUint(n/suf.m, 10) + suf.s
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}
