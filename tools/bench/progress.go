package bench

// Progress is told a benchmark's steps as they run: starting a system,
// filling it, each job. A nil Progress says nothing; the command passes
// a progress bar only when a person watches (a terminal, not --json).
type Progress interface {
	// Begin announces total steps.
	Begin(total int)
	// Step says a step starts.
	Step(desc string)
	// End closes the report (also after an error).
	End()
}

// noProgress is the Progress of a benchmark nobody watches.
type noProgress struct{}

func (noProgress) Begin(int)   {}
func (noProgress) Step(string) {}
func (noProgress) End()        {}

func progressOr(p Progress) Progress {
	if p == nil {
		return noProgress{}
	}
	return p
}
