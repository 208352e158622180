package pagestore

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// ErrInjected is returned by a Faults remote while Fail is set.
var ErrInjected = errors.New("pagestore: injected remote failure")

// Faults wraps a Remote to inject failures and delays, for tests of what
// the Store does when its Remote errs or is slow. It offers Remote,
// PagesReader and Trimmer whatever it wraps: when the wrapped Remote
// lacks a capability, Faults does what the Store would do without it (a
// ReadPage per page, zero pages written), so a test sees the same
// results. It never offers AsyncReader.
type Faults struct {
	R Remote
	// Fail, while set, makes every operation return ErrInjected.
	Fail atomic.Bool
	// FailWrites, while set, makes writes and trims return ErrInjected
	// and reads succeed: a memory node whose disk is full.
	FailWrites atomic.Bool
	// Delay, if non-zero, is slept before every operation (nanoseconds).
	Delay atomic.Int64
}

// NewFaults wraps r, injecting nothing until Fail or Delay are set.
func NewFaults(r Remote) *Faults { return &Faults{R: r} }

var (
	_ PagesReader = (*Faults)(nil)
	_ Trimmer     = (*Faults)(nil)
	_ Mapper      = (*Faults)(nil)
)

func (f *Faults) fault(ctx context.Context) error {
	if d := f.Delay.Load(); d > 0 {
		t := time.NewTimer(time.Duration(d))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if f.Fail.Load() {
		return ErrInjected
	}
	return nil
}

func (f *Faults) writeFault(ctx context.Context) error {
	if err := f.fault(ctx); err != nil {
		return err
	}
	if f.FailWrites.Load() {
		return ErrInjected
	}
	return nil
}

// ReadPage implements Remote.
func (f *Faults) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	if err := f.fault(ctx); err != nil {
		return err
	}
	return f.R.ReadPage(ctx, k, dst)
}

// WritePages implements Remote.
func (f *Faults) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	if err := f.writeFault(ctx); err != nil {
		return err
	}
	return f.R.WritePages(ctx, keys, pages)
}

// ReadPages implements PagesReader.
func (f *Faults) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	if err := f.fault(ctx); err != nil {
		return err
	}
	if pr, ok := f.R.(PagesReader); ok {
		return pr.ReadPages(ctx, first, p)
	}
	for i := range len(p) / pageid.Size {
		if err := f.R.ReadPage(ctx, pageid.MakeKey(first.Volume(), first.Page()+uint64(i)), p[i*pageid.Size:(i+1)*pageid.Size]); err != nil {
			return err
		}
	}
	return nil
}

// Map implements Mapper: every run is data unless the wrapped Remote maps.
func (f *Faults) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	if err := f.fault(ctx); err != nil {
		return err
	}
	if m, ok := f.R.(Mapper); ok {
		return m.Map(ctx, vol, off, n, fn)
	}
	fn(off, n, false)
	return nil
}

// Trim implements Trimmer.
func (f *Faults) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	if err := f.writeFault(ctx); err != nil {
		return err
	}
	if tr, ok := f.R.(Trimmer); ok {
		return tr.Trim(ctx, vol, off, n)
	}
	var zero [pageid.Size]byte
	for p := off / pageid.Size; p < (off+n)/pageid.Size; p++ {
		if err := f.R.WritePages(ctx, []pageid.Key{pageid.MakeKey(vol, p)}, [][]byte{zero[:]}); err != nil {
			return err
		}
	}
	return nil
}
