package pageid

import "fmt"

// Failures gathers the failed pages of a batch into one error: how many
// failed, the range of their keys and the first cause. Sixty-four pages
// refused for one reason are one line in a log, not sixty-four.
type Failures struct {
	n           int
	first, last Key
	err         error
}

// Add records that page k failed with err.
func (f *Failures) Add(k Key, err error) {
	if f.n == 0 {
		f.first, f.last, f.err = k, k, err
	}
	f.first, f.last = min(f.first, k), max(f.last, k)
	f.n++
}

// Err is nil when nothing failed, else one error wrapping the first cause;
// what names the operation ("writing"), of is the batch's size.
func (f *Failures) Err(what string, of int) error {
	switch f.n {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%s page %v: %w", what, f.first, f.err)
	}
	return fmt.Errorf("%s %d of %d pages failed (%v to %v), the first: %w", what, f.n, of, f.first, f.last, f.err)
}
