// Package loadingzone is the ring of prefetched pages in host memory that
// the DPU agent's transfer engine fills and the host's miss path drains with
// CheckAndReturn (PD3 §7).
//
// PD3's ring is scanned from Head to Tail, fine for 32-byte records, not for
// thousands of 4 KiB pages; pd3 keeps its ideas — one producer, many
// consumers, a per-record state word, CAS on consume, producer-side
// cleaning — and adds a key index the producer publishes before advancing
// Tail, so a lookup touches at most two index words and two records. The
// state word carries a generation, so a consumer that copied a record that
// was reclaimed and reused meanwhile fails its CAS instead of returning
// the wrong bytes (seqlock/ABA). With the index there is no shared Head:
// consumers never write anything but the state word of the record they take.
//
// When the ring is full the producer reclaims the oldest record whatever its
// state; an unconsumed one is counted as dropped and reported through
// OnDrop so Host View forgets it.
//
// The zone lives in a shared region (internal/shm): anonymous for an agent
// inside the host process, /dev/shm for an agent process. Its epoch names
// the producer incarnation; a host must ignore a zone whose epoch is not the
// one it attached to.
package loadingzone
