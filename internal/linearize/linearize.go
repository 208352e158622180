// Package linearize records concurrent page reads and writes and checks
// them with porcupine against a model where every page is an independent
// register holding the last version written (0 before any write).
package linearize

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Input is one operation's input.
type Input struct {
	Put   bool
	Key   uint64
	Value uint64
}

// Model is the per-page register model, partitioned by page.
var Model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[uint64][]porcupine.Operation{}
		for _, op := range h {
			k := op.Input.(Input).Key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(Input)
		if in.Put {
			return true, in.Value
		}
		return output.(uint64) == state.(uint64), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(Input)
		if in.Put {
			return fmt.Sprintf("put(%d)=%d", in.Key, in.Value)
		}
		return fmt.Sprintf("get(%d)→%v", in.Key, output)
	},
}

// History collects operations from many goroutines.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

// NewHistory starts a history now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the timestamp to use for Call and Return.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Add records a completed operation.
func (h *History) Add(client int, in Input, out uint64, call, ret int64) {
	h.mu.Lock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
	h.mu.Unlock()
}

// Len is the number of operations recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Check reports whether the history is linearizable; when it is not, the
// visualisation is written to a temporary file whose name is returned.
func (h *History) Check(timeout time.Duration) (bool, string) {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	res, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	if res == porcupine.Ok {
		return true, ""
	}
	f, err := os.CreateTemp("", "pd3-linearizability-*.html")
	if err != nil {
		return false, ""
	}
	defer f.Close()
	porcupine.Visualize(Model, info, f)
	return false, f.Name()
}

// Client is what Run drives: whole-page reads and writes by page number,
// and a durability barrier (SYNC, FLUSH).
type Client interface {
	Read(page uint64, buf []byte) error
	Write(page uint64, buf []byte) error
	Sync() error
}

// Run drives c as client id with a random mix — 10% syncs, 30% writes of a
// unique version (id<<32 | n, in the page's first 8 bytes), 60% reads —
// over pages [0, pages), recording every read and write in h, until stop
// is closed or limit operations were recorded (0: no limit). It returns
// the first error a client saw.
func (h *History) Run(id int, c Client, pages int, seed uint64, stop <-chan struct{}, limit int) error {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	buf := make([]byte, 4096)
	for i, done := 0, 0; limit == 0 || done < limit; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		pg := uint64(rng.IntN(pages))
		var in Input
		var out uint64
		var err error
		call := h.Now()
		switch r := rng.IntN(10); {
		case r == 0:
			if err := c.Sync(); err != nil {
				return fmt.Errorf("sync: %w", err)
			}
			continue
		case r < 4:
			v := uint64(id)<<32 | uint64(i+1)
			binary.LittleEndian.PutUint64(buf, v)
			in = Input{Put: true, Key: pg, Value: v}
			err = c.Write(pg, buf)
		default:
			in = Input{Key: pg}
			err = c.Read(pg, buf)
			out = binary.LittleEndian.Uint64(buf)
		}
		if err != nil {
			return fmt.Errorf("page %d: %w", pg, err)
		}
		h.Add(id, in, out, call, h.Now())
		done++
	}
	return nil
}

// Scan drives c as client id with reads of pages 0, 1, ... pages-1 in
// order, over and over, recording each in h, until limit reads were
// recorded: a stream a prefetcher follows, so that its prefetches race
// with the writes of clients driven by Run.
func (h *History) Scan(id int, c Client, pages, limit int) error {
	buf := make([]byte, 4096)
	for i := range limit {
		pg := uint64(i % pages)
		call := h.Now()
		if err := c.Read(pg, buf); err != nil {
			return fmt.Errorf("page %d: %w", pg, err)
		}
		h.Add(id, Input{Key: pg}, binary.LittleEndian.Uint64(buf), call, h.Now())
	}
	return nil
}
