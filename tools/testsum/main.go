// Command testsum reads `go test -json` on its standard input, prints what
// plain go test would and a summary line, and exits non-zero when a test
// failed or, with PD3_REQUIRE=all in the environment, when one skipped.
//
//	go test -json ./... | go run ./tools/testsum
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/pd3-go/pd3/internal/testsum"
)

func main() {
	require := os.Getenv("PD3_REQUIRE")
	if require != "" && require != "all" {
		fmt.Fprintf(os.Stderr, "testsum: PD3_REQUIRE=%q: the only requirement is \"all\" (every test runs)\n", require)
		os.Exit(2)
	}
	// A package may take minutes: say which are still running, once a
	// minute, so a long run is never silent.
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	sum, err := testsum.ReadTicking(os.Stdin, os.Stdout, tick.C)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum: reading go test -json:", err)
		os.Exit(2)
	}
	fmt.Println(sum.Line())
	for _, s := range sum.Skips {
		fmt.Printf("skipped: %s %s: %s\n", s.Package, s.Test, s.Reason)
	}
	switch {
	case !sum.OK(true):
		os.Exit(1)
	case require == "all" && sum.Skipped > 0:
		fmt.Printf("PD3_REQUIRE=all: %d tests skipped; install what they name (make deps-system) or run them where they can run\n", sum.Skipped)
		os.Exit(1)
	}
}
