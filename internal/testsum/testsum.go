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
func Read(r io.Reader, w io.Writer) (*Summary, error) {
	sum := &Summary{}
	type key struct{ pkg, test string }
	out := map[key][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			out[k] = append(out[k], e.Output)
			continue
		case "build-output": // a package that does not build
			io.WriteString(w, e.Output)
			continue
		case "run":
			sum.Run++
			continue
		case "pass", "fail", "skip":
		default:
			continue
		}
		lines := out[k]
		delete(out, k)
		if e.Test == "" { // the package's binary ended
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
			continue
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
	slices.SortFunc(sum.Skips, func(a, b Skip) int {
		return strings.Compare(a.Package+" "+a.Test, b.Package+" "+b.Test)
	})
	return sum, sc.Err()
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
