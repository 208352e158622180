package pipeline

import "sync"

// Table is the in-flight table of a request/response transport: it hands
// out tags, finds the call a response's tag names, and fails every call at
// once when the transport breaks. The memory-node and page-protocol
// sessions use it over TCP, and the DPU agent's Link over shared-memory
// rings.
//
// A tag is a slot index (low 16 bits) and the slot's generation (high 16):
// a response for a call that was abandoned and whose slot was reused
// carries the old generation and finds nothing.
type Table[C any] struct {
	mu      sync.Mutex
	cond    sync.Cond
	slots   []*C
	gens    []uint16
	free    []uint32
	pending int
	err     error // set once; every later Register fails with it
	// awaits, if set, is told under the table's lock when the table
	// starts (true) and stops (false) having calls in flight.
	awaits func(bool)
}

// OnAwait sets f to be told, in order, whenever the table starts (true) and
// stops (false) having calls in flight. Set it before the first Register.
func (t *Table[C]) OnAwait(f func(bool)) { t.awaits = f }

// NewTable returns a table of n slots (at most MaxInFlight).
func NewTable[C any](n int) *Table[C] {
	n = min(max(n, 1), MaxInFlight)
	t := &Table[C]{slots: make([]*C, n), gens: make([]uint16, n), free: make([]uint32, n)}
	for i := range t.free {
		t.free[i] = uint32(n - 1 - i)
	}
	t.cond.L = &t.mu
	return t
}

// Register puts c in the table, waiting while every slot is taken; it
// returns c's tag and the calls in flight, c included. After Fail it
// returns the failure.
func (t *Table[C]) Register(c *C) (tag uint32, inFlight int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.free) == 0 && t.err == nil {
		t.cond.Wait()
	}
	if t.err != nil {
		return 0, 0, t.err
	}
	idx := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	t.slots[idx] = c
	t.pending++
	if t.pending == 1 && t.awaits != nil {
		t.awaits(true)
	}
	return uint32(t.gens[idx])<<idxBits | idx, t.pending, nil
}

// Take removes the call with tag from the table; nil if there is none
// (never registered, already taken, or failed).
func (t *Table[C]) Take(tag uint32) *C {
	idx := tag & (1<<idxBits - 1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if int(idx) >= len(t.slots) || t.slots[idx] == nil || uint32(t.gens[idx]) != tag>>idxBits {
		return nil
	}
	c := t.slots[idx]
	t.slots[idx] = nil
	t.gens[idx]++
	t.free = append(t.free, idx)
	t.pending--
	if t.pending == 0 && t.awaits != nil {
		t.awaits(false)
	}
	t.cond.Signal()
	return c
}

// Fail marks the table broken with err and removes every call in flight,
// which it returns for the caller to complete with err. Only the first
// Fail does anything (first reports it); later ones return no calls.
func (t *Table[C]) Fail(err error) (calls []*C, first bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return nil, false
	}
	t.err = err
	for i, c := range t.slots {
		if c != nil {
			calls = append(calls, c)
			t.slots[i] = nil
		}
	}
	if t.pending > 0 && t.awaits != nil {
		t.awaits(false)
	}
	t.pending = 0
	t.cond.Broadcast()
	return calls, true
}

// Err is the error the table failed with, nil while it is healthy.
func (t *Table[C]) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Pending is the number of calls in flight.
func (t *Table[C]) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending
}
