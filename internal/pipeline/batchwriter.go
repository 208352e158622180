package pipeline

import (
	"io"
	"runtime"
	"sync"
	"sync/atomic"
)

// BatchWriter owns the write side of a connection. Producers append frames
// to a shared buffer between Begin and End; one goroutine writes whatever
// has accumulated, so frames produced while a write syscall is under way
// leave together in the next one. Producers never wait for the network
// unless MaxPending bytes are already waiting.
type BatchWriter struct {
	w       io.Writer
	max     int
	onErr   func(error)
	mu      sync.Mutex
	cond    sync.Cond
	buf     []byte
	spare   []byte
	kicked  bool
	err     error
	kick    chan struct{}
	stopped chan struct{}
	done    chan struct{}

	// Writes and Bytes count write syscalls and the bytes they carried:
	// Bytes/Writes is the batching achieved.
	Writes, Bytes atomic.Uint64

	// gate, if set, is waited on before a batch holding a token is
	// written (the memory node's durable acknowledgements).
	gate  func(token uint64) error
	token uint64 // highest token in buf; guarded by mu
}

// SetGate makes the writer call gate(t) before writing any batch that
// holds a frame appended with EndToken(…, t), and fail if it errs. Set it
// before the first write.
func (b *BatchWriter) SetGate(gate func(token uint64) error) { b.gate = gate }

// EndToken is End for a frame that may only leave once gate(token) passed.
func (b *BatchWriter) EndToken(buf []byte, token uint64) {
	if token > b.token {
		b.token = token
	}
	b.End(buf)
}

// NewBatchWriter starts the writer goroutine. onErr (may be nil) is called
// once, from the writer goroutine, if a write fails.
func NewBatchWriter(w io.Writer, maxPending int, onErr func(error)) *BatchWriter {
	b := &BatchWriter{
		w: w, max: maxPending, onErr: onErr,
		buf:     make([]byte, 0, 256<<10),
		spare:   make([]byte, 0, 256<<10),
		kick:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
		done:    make(chan struct{}),
	}
	b.cond.L = &b.mu
	go b.loop()
	return b
}

// Begin locks the buffer, waiting while more than MaxPending bytes are
// queued, and returns it for appending. A nil error means End must follow.
func (b *BatchWriter) Begin() ([]byte, error) {
	b.mu.Lock()
	for len(b.buf) > b.max && b.err == nil {
		b.cond.Wait()
	}
	if b.err != nil {
		err := b.err
		b.mu.Unlock()
		return nil, err
	}
	return b.buf, nil
}

// TryBegin is Begin for a caller that must not wait: ok is false (and
// nothing is locked) while more than MaxPending bytes are queued.
func (b *BatchWriter) TryBegin() (buf []byte, ok bool, err error) {
	b.mu.Lock()
	if b.err != nil {
		err := b.err
		b.mu.Unlock()
		return nil, false, err
	}
	if len(b.buf) > b.max {
		b.mu.Unlock()
		return nil, false, nil
	}
	return b.buf, true, nil
}

// End stores the appended buffer, unlocks and rings the writer.
func (b *BatchWriter) End(buf []byte) {
	b.buf = buf
	ring := !b.kicked && len(buf) > 0
	if ring {
		b.kicked = true
	}
	b.mu.Unlock()
	if ring {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

// Close stops the writer after it has written what is queued (or failed).
func (b *BatchWriter) Close() {
	b.mu.Lock()
	select {
	case <-b.stopped:
	default:
		close(b.stopped)
	}
	b.mu.Unlock()
	<-b.done
}

// Fail makes every later Begin return err (used when the connection dies).
func (b *BatchWriter) Fail(err error) {
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *BatchWriter) loop() {
	defer close(b.done)
	for {
		stopping := false
		select {
		case <-b.kick:
		case <-b.stopped:
			stopping = true
		}
		// Let the goroutines readied with the one that kicked us (a batch
		// of responses completing at once) append first: one bigger write.
		runtime.Gosched()
		b.mu.Lock()
		out := b.buf
		b.buf = b.spare[:0]
		b.kicked = false
		failed := b.err != nil
		token := b.token
		b.token = 0
		b.mu.Unlock()
		if token > 0 && b.gate != nil && !failed {
			if err := b.gate(token); err != nil {
				b.Fail(err)
				if b.onErr != nil {
					b.onErr(err)
				}
				failed = true
			}
		}
		if len(out) > 0 && !failed {
			b.Writes.Add(1)
			b.Bytes.Add(uint64(len(out)))
			_, err := b.w.Write(out)
			if err != nil {
				b.Fail(err)
				if b.onErr != nil {
					b.onErr(err)
				}
			}
		}
		b.mu.Lock()
		b.spare = out[:0]
		b.cond.Broadcast()
		b.mu.Unlock()
		if stopping {
			return
		}
	}
}
