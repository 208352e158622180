// Package testsum reads the events of `go test -json` (cmd/test2json) and
// prints what plain `go test` would — one line per package, the output of
// every failed test — followed by one summary line of tests run, passed,
// failed and skipped, and the reason of every skip.
//
// Under a requirement (PD3_REQUIRE=all, which .ci/run sets) a skipped test
// fails the run: on the CI machine every tool and capability a test needs
// is installed, so a skip there means a test that did not run without
// anyone seeing it.
package testsum

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// event is one line of test2json's output.
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// Skip is a test that skipped, and the last line it printed (the reason
// t.Skip gave).
type Skip struct {
	Package, Test, Reason string
}

// Summary counts what ran.
type Summary struct {
	Run, Passed, Failed, Skipped int
	// FailedPackages are packages whose test binary failed (a failed test,
	// a panic, a build error, a timeout).
	FailedPackages []string
	Skips          []Skip
}

// OK reports whether nothing failed and, when skips are not allowed,
// nothing skipped.
func (s *Summary) OK(allowSkips bool) bool {
	return s.Failed == 0 && len(s.FailedPackages) == 0 && (allowSkips || s.Skipped == 0)
}

// Line is the one-line summary.
func (s *Summary) Line() string {
	return fmt.Sprintf("tests: %d run, %d passed, %d failed, %d skipped; %d packages failed",
		s.Run, s.Passed, s.Failed, s.Skipped, len(s.FailedPackages))
}

// Read reads events from r until it ends, writing to w what plain go test
// prints as it goes: a line per package and the output of each failed test
// and failed package. Lines that are not JSON (go vet's, a build's) are
// passed through.
func Read(r io.Reader, w io.Writer) (*Summary, error) { return ReadTicking(r, w, nil) }

// ReadTicking is Read that also, at each tick, names the packages still
// running and for how long: a run of packages that take minutes each is
// never silent for longer than a tick.
func ReadTicking(r io.Reader, w io.Writer, ticks <-chan time.Time) (*Summary, error) {
	lines := make(chan []byte)
	var scanErr error
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			lines <- slices.Clone(sc.Bytes())
		}
		scanErr = sc.Err()
	}()
	rd := &reader{w: w, sum: &Summary{}, out: map[key][]string{}, started: map[string]time.Time{}}
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				slices.SortFunc(rd.sum.Skips, func(a, b Skip) int {
					return strings.Compare(a.Package+" "+a.Test, b.Package+" "+b.Test)
				})
				return rd.sum, scanErr
			}
			rd.line(line)
		case now := <-ticks:
			rd.running(now)
		}
	}
}

type key struct{ pkg, test string }

// reader is the state of one Read.
type reader struct {
	w       io.Writer
	sum     *Summary
	out     map[key][]string     // output of each test (and package) so far
	started map[string]time.Time // packages running, since when
}

// running prints the packages still running at now.
func (rd *reader) running(now time.Time) {
	if len(rd.started) == 0 {
		return
	}
	names := make([]string, 0, len(rd.started))
	for pkg := range rd.started {
		names = append(names, pkg)
	}
	slices.Sort(names)
	for i, pkg := range names {
		names[i] = fmt.Sprintf("%s (%s)", pkg, now.Sub(rd.started[pkg]).Round(time.Second))
	}
	fmt.Fprintf(rd.w, "... still running: %s\n", strings.Join(names, ", "))
}

// line handles one line of go test -json.
func (rd *reader) line(line []byte) {
	w, sum := rd.w, rd.sum
	var e event
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
		fmt.Fprintf(w, "%s\n", line)
		return
	}
	k := key{e.Package, e.Test}
	switch e.Action {
	case "start":
		rd.started[e.Package] = time.Now()
		return
	case "output":
		rd.out[k] = append(rd.out[k], e.Output)
		return
	case "build-output": // a package that does not build
		io.WriteString(w, e.Output)
		return
	case "run":
		sum.Run++
		return
	case "pass", "fail", "skip":
	default:
		return
	}
	lines := rd.out[k]
	delete(rd.out, k)
	if e.Test == "" { // the package's binary ended
		delete(rd.started, e.Package)
		switch e.Action {
		case "fail":
			sum.FailedPackages = append(sum.FailedPackages, e.Package)
			io.WriteString(w, strings.Join(lines, ""))
			fmt.Fprintf(w, "FAIL\t%s\t%.3fs\n", e.Package, e.Elapsed)
		case "skip":
			fmt.Fprintf(w, "?   \t%s\t[no test files]\n", e.Package)
		default:
			fmt.Fprintf(w, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
		}
		return
	}
	switch e.Action {
	case "pass":
		sum.Passed++
	case "fail":
		sum.Failed++
		io.WriteString(w, strings.Join(lines, ""))
	case "skip":
		sum.Skipped++
		sum.Skips = append(sum.Skips, Skip{Package: e.Package, Test: e.Test, Reason: reason(lines)})
	}
}

// reason is the last line a skipped test printed before "--- SKIP": the
// message of its t.Skip, with the file and line it came from.
func reason(lines []string) string {
	for _, l := range slices.Backward(lines) {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "=== ") {
			continue
		}
		return l
	}
	return "(no reason given)"
}
