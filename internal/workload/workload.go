// Package workload generates the key streams the benchmarks and tests use
// and the pattern their pages hold (FillPage, CheckPage). Streams:
// uniform, and Zipfian with any skew θ (including θ < 1, which math/rand's
// Zipf cannot do) following Gray et al.'s method as YCSB implements it.
// Zipfian ranks are scrambled with a hash so hot pages are spread over the
// key space rather than packed at its start.
package workload

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/pd3-go/pd3/pageid"
)

// Dist produces page numbers in [0, n).
type Dist interface {
	Next(r *rand.Rand) uint64
	String() string
}

// Parse reads "uniform" or "zipf:THETA".
func Parse(spec string, n uint64) (Dist, error) {
	switch {
	case spec == "" || spec == "uniform":
		return Uniform{N: n}, nil
	case strings.HasPrefix(spec, "zipf:"):
		th, err := strconv.ParseFloat(strings.TrimPrefix(spec, "zipf:"), 64)
		if err != nil || th <= 0 || th == 1 || th >= 10 {
			return nil, fmt.Errorf("workload: bad zipf skew in %q (want 0 < θ < 10, θ ≠ 1)", spec)
		}
		return NewZipf(n, th), nil
	}
	return nil, fmt.Errorf("workload: unknown distribution %q (uniform or zipf:THETA)", spec)
}

// Uniform picks every page with equal probability.
type Uniform struct{ N uint64 }

func (u Uniform) Next(r *rand.Rand) uint64 { return r.Uint64N(u.N) }
func (u Uniform) String() string           { return "uniform" }

// Zipf picks rank i with probability proportional to 1/i^θ.
type Zipf struct {
	n                       uint64
	theta, alpha, zetan, et float64
	half                    float64 // 1 + 0.5^θ
}

// NewZipf precomputes ζ(n, θ); it costs O(n) once.
func NewZipf(n uint64, theta float64) *Zipf {
	var zetan float64
	for i := uint64(1); i <= n; i++ {
		zetan += 1 / math.Pow(float64(i), theta)
	}
	zeta2 := 1 + math.Pow(0.5, theta)
	return &Zipf{
		n: n, theta: theta, zetan: zetan,
		alpha: 1 / (1 - theta),
		et:    (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta2/zetan),
		half:  zeta2,
	}
}

func (z *Zipf) rank(r *rand.Rand) uint64 {
	u := r.Float64()
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < z.half {
		return 1
	}
	v := uint64(float64(z.n) * math.Pow(z.et*u-z.et+1, z.alpha))
	return min(v, z.n-1)
}

// Next returns a scrambled Zipfian page number.
func (z *Zipf) Next(r *rand.Rand) uint64 { return Scramble(z.rank(r), z.n) }

func (z *Zipf) String() string { return fmt.Sprintf("zipf:%g", z.theta) }

// Scramble maps rank to a page in [0, n) by a fixed hash; collisions merely
// merge two ranks, as in YCSB's scrambled Zipfian.
func Scramble(rank, n uint64) uint64 {
	x := rank + 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	x ^= x >> 31
	return x % n
}

// FillPage writes the benchmarks' pattern of page k into p: its key in the
// first 8 bytes, so readers can check they got the right page.
func FillPage(k pageid.Key, p []byte) {
	clear(p)
	binary.LittleEndian.PutUint64(p, uint64(k))
}

// CheckPage reports whether p carries the pattern of page k.
func CheckPage(k pageid.Key, p []byte) bool { return binary.LittleEndian.Uint64(p) == uint64(k) }
