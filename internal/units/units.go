// Package units parses and prints byte sizes as the command line spells
// them: 4096, 64MiB, 1GiB, 1GB, 1G, 1g, 512K. Every suffix is a binary
// multiple and case does not matter, so 1GiB, 1GB, 1G and 1g are the same
// size (as in nbdkit and qemu-img, where 1G is 2^30).
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
	{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10},
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
		return 0, fmt.Errorf("bad size %q: want a whole number with an optional K, M, G or T suffix (binary: 1G = 1GB = 1GiB)", s)
	}
	if n > ^uint64(0)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

// ParseMultiple is ParseSize for sizes that must be a whole number of
// units (pages): it refuses the others instead of rounding them.
func ParseMultiple(s string, unit uint64) (uint64, error) {
	n, err := ParseSize(s)
	if err != nil {
		return 0, err
	}
	if n%unit != 0 {
		use := FormatSize((n/unit + 1) * unit)
		if n > unit {
			use = FormatSize(n/unit*unit) + " or " + use
		}
		return 0, fmt.Errorf("size %q (%d bytes) is not a whole number of %s pages: use %s", s, n, FormatSize(unit), use)
	}
	return n, nil
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

// Approx prints n bytes to three significant digits with a binary
// suffix, for people: "0B", "512B", "1.50KiB", "64.1MiB".
func Approx(n uint64) string {
	v, i := float64(n), 0
	names := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	for v >= 1024 && i < len(names)-1 {
		v, i = v/1024, i+1
	}
	switch {
	case i == 0:
		return fmt.Sprintf("%dB", n)
	case v >= 100:
		return fmt.Sprintf("%.0f%s", v, names[i])
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, names[i])
	}
	return fmt.Sprintf("%.2f%s", v, names[i])
}

// Count is "1 node", "3 nodes": n and the noun, plural when n is not 1.
// many is the plural when adding "s" is wrong ("copy", "copies"); empty,
// it is one+"s".
func Count(n int, one, many string) string {
	if many == "" {
		many = one + "s"
	}
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
