package hostview

import "runtime"

// Stage names one rung of the PD3 Fig. 4 optimisation ladder, for
// benchmarking: each rung adds one optimisation to the previous.
type Stage int

// The ladder.
const (
	// Basic looks keys up one at a time, computing both buckets up front
	// and comparing slot by slot.
	Basic Stage = iota
	// Batched looks up 32 keys at a time, touching every first bucket
	// before searching any (still slot by slot, both buckets up front).
	Batched
	// SWAR adds two-fingerprints-per-word compares.
	SWAR
	// Delayed adds delayed hashing and search of the second bucket: the
	// production path, ContainsBatch.
	Delayed
)

func (s Stage) String() string {
	return [...]string{"basic", "batched", "swar", "delayed-2nd-bucket"}[s]
}

// LookupStage is ContainsBatch as it would be at stage st of the ladder.
func (s *Set) LookupStage(st Stage, keys []uint64, out []bool) {
	switch st {
	case Delayed:
		s.ContainsBatch(keys, out)
	case Basic:
		for i, k := range keys {
			sh, b1, fp := s.locate(k)
			sh.mu.Lock()
			b2 := sh.alt(b1, fp)
			out[i] = sh.find(b1, fp) >= 0 || sh.find(b2, fp) >= 0
			sh.mu.Unlock()
		}
	default:
		const chunk = 32
		var b1, b2 [chunk]uint64
		var fps [chunk]uint32
		var shs [chunk]*shard
		for len(keys) > 0 {
			n := min(len(keys), chunk)
			var sink uint64
			for j := 0; j < n; j++ {
				shs[j], b1[j], fps[j] = s.locate(keys[j])
			}
			for si := range s.shards {
				sh := &s.shards[si]
				sh.mu.Lock()
				for j := 0; j < n; j++ {
					if shs[j] == sh {
						b2[j] = sh.alt(b1[j], fps[j])
						sink += sh.words[b1[j]*words] + sh.words[b2[j]*words]
					}
				}
				for j := 0; j < n; j++ {
					if shs[j] != sh {
						continue
					}
					if st == SWAR {
						out[j] = sh.has(b1[j], fps[j]) || sh.has(b2[j], fps[j])
					} else {
						out[j] = sh.find(b1[j], fps[j]) >= 0 || sh.find(b2[j], fps[j]) >= 0
					}
				}
				sh.mu.Unlock()
			}
			runtime.KeepAlive(sink)
			keys, out = keys[n:], out[n:]
		}
	}
}
