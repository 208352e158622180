package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/pd3-go/pd3/internal/scrape"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/pageid"
)

func topCmd() *cobra.Command {
	var interval time.Duration
	var once bool
	cmd := &cobra.Command{
		Use:   "top ADDR",
		Short: "A live view of a running pd3 host's or agent's /metrics (q quits)",
		Long: `Show a running pd3 process's metrics, refreshed every --interval: requests
and errors per second, p50/p99 latency per NBD command and page operation,
the host cache's hit ratio and Loading Zone hits, prefetches issued, useful
and wasted, the stream predictors' pages, accuracy and state, Host View false positives and negatives, memory-node round
trips, replica failovers and repair, dirty and resident pages, and whether
Go runs on all cores or on --lone-procs (the governor of cached reads
served one at a time). ADDR is what
--metrics was given (HOST:PORT) or the /metrics URL. q or Ctrl-C quits;
--once prints one frame (over one interval) and exits, for scripts.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval <= 0 {
				return usageError{fmt.Errorf("--interval %v: want a positive duration", interval)}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runTop(ctx, os.Stdin, os.Stdout, args[0], interval, once)
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "refresh period")
	cmd.Flags().BoolVar(&once, "once", false, "print one frame and exit")
	return cmd
}

// runTop scrapes addr every interval and draws a frame of the rates since
// the previous scrape; on a terminal it clears the screen per frame and
// quits on q.
func runTop(ctx context.Context, in *os.File, out io.Writer, addr string, interval time.Duration, once bool) error {
	prev, err := scrape.Families(ctx, addr)
	if err != nil {
		return err
	}
	prevAt := time.Now()
	tty := !once && term.IsTerminal(int(in.Fd()))
	if tty {
		// Raw mode, so q quits without Enter; restored on every exit.
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return err
		}
		defer term.Restore(int(in.Fd()), old)
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			r := bufio.NewReader(in)
			for {
				b, err := r.ReadByte()
				if err != nil || b == 'q' || b == 'Q' || b == 3 { // 3: Ctrl-C in raw mode
					cancel()
					return
				}
			}
		}()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur, err := scrape.Families(ctx, addr)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		now := time.Now()
		frame := topFrame(addr, prev, cur, now.Sub(prevAt), interval, tty)
		if tty {
			// Home, clear; raw mode needs \r for each new line.
			fmt.Fprint(out, "\x1b[H\x1b[2J"+strings.ReplaceAll(frame, "\n", "\r\n"))
		} else {
			fmt.Fprint(out, frame)
		}
		if once {
			return nil
		}
		prev, prevAt = cur, now
	}
}

// topFrame renders the rates between two scrapes dt apart; live says q
// quits it.
func topFrame(addr string, before, after map[string]*dto.MetricFamily, dt, interval time.Duration, live bool) string {
	v0, v1 := scrape.Values(before), scrape.Values(after)
	has := func(name string) bool { _, ok := v1[name]; return ok }
	rate := func(names ...string) float64 {
		var d float64
		for _, n := range names {
			d += v1[n] - v0[n]
		}
		return d / dt.Seconds()
	}
	var b strings.Builder
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-15s"+format+"\n", append([]any{label}, args...)...)
	}
	quits := ""
	if live {
		quits = "  (q quits)"
	}
	fmt.Fprintf(&b, "pd3 top %s  every %v  %s%s\n\n", addr, interval, time.Now().Format("15:04:05"), quits)
	if has("nbd_requests_total") || has("page_requests_total") {
		line("requests/s", "NBD %-10s page %-10s errors %s",
			num(rate("nbd_requests_total")), num(rate("page_requests_total")), num(rate("nbd_errors_total", "page_errors_total")))
	}
	for _, h := range []struct{ family, label, what string }{
		{"pd3_nbd_request_duration_seconds", "cmd", "NBD"},
		{"pd3_page_request_duration_seconds", "op", "page"},
	} {
		hb, ha := scrape.Histograms(before, h.family, h.label), scrape.Histograms(after, h.family, h.label)
		keys := make([]string, 0, len(ha))
		for k := range ha {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			p50, ok := scrape.Quantile(0.5, hb[k], ha[k])
			if !ok {
				continue // nothing of this kind in the interval
			}
			p99, _ := scrape.Quantile(0.99, hb[k], ha[k])
			line("latency", "%s %-13s p50 %-9s p99 %s", h.what, k, dur(p50), dur(p99))
		}
	}
	if has("cache_hits_total") {
		hits, misses := rate("cache_hits_total"), rate("cache_misses_total")
		ratio := "-"
		if hits+misses > 0 {
			ratio = fmt.Sprintf("%.1f%%", 100*hits/(hits+misses))
		}
		line("host cache", "hit ratio %-8s Loading Zone hits/s %-9s dirty %-10s resident %s",
			ratio, num(rate("cache_loadingzone_hits_total")), pages(v1["cache_dirty_pages"]), pages(v1["cache_resident_pages"]))
	}
	if has("prefetch_issued_total") {
		line("prefetch/s", "issued %-9s useful %-9s wasted %-9s throttled %s",
			num(rate("prefetch_issued_total")), num(rate("prefetch_consumed_total")),
			num(rate("prefetch_dropped_unconsumed_total", "prefetch_stale_total")), num(rate("prefetch_throttled_total")))
	}
	for _, p := range []struct{ name, label string }{{"requests", "predict/s"}, {"fuse", "predict FUSE/s"}} {
		pre := "predict_" + p.name + "_"
		if !has(pre+"pages_total") || v1[pre+"pages_total"]+v1[pre+"useful_total"]+v1[pre+"wasted_total"] == 0 {
			continue // no stream seen yet
		}
		state := "on"
		if v1[pre+"off"] == 1 {
			state = "off (inaccurate; judging, returns when accurate)"
		}
		acc := "-"
		if u, w := rate(pre+"useful_total"), rate(pre+"wasted_total"); u+w > 0 {
			acc = fmt.Sprintf("%.0f%%", 100*u/(u+w))
		}
		line(p.label, "pages %-9s accuracy %-6s %s", num(rate(pre+"pages_total")), acc, state)
	}
	if has("hostview_false_positives_total") || has("hostview_false_negatives_total") {
		line("Host View/s", "false positives %-8s false negatives %-8s skipped as cached %s",
			num(rate("hostview_false_positives_total")), num(rate("hostview_false_negatives_total")), num(rate("agent_skipped_cached_total")))
	}
	if has("cache_remote_reads_total") || has("prefetch_issued_total") {
		line("memory node/s", "host reads %-9s write-backs %-9s prefetch reads %s",
			num(rate("cache_remote_reads_total")), num(rate("cache_writebacks_total")), num(rate("prefetch_issued_total")))
	}
	if has("replica_read_failovers_total") {
		line("replicas/s", "read failovers %-7s dropped %-7s repaired extents %-7s repair read %s/s",
			num(rate("replica_read_failovers_total")), num(rate("replica_dropped_total")), num(rate("replica_repaired_extents_total")),
			units.Approx(uint64(max(0, rate("replica_repair_bytes_total")))))
	}
	if has("procs_low") {
		state := "all cores"
		if v1["procs_low"] == 1 {
			state = "fewer cores (--lone-procs: a run of lone cached reads)"
		}
		line("Go scheduler", "%s  switches/s %s", state, num(rate("procs_switches_total")))
	}
	if has("link_attached") {
		state := "attached"
		if v1["link_attached"] == 0 {
			state = "not attached (serving directly)"
		}
		line("agent process", "%s  fallbacks/s %s", state, num(rate("link_fallbacks_total")))
	}
	return b.String()
}

// pages prints a count of pages with the memory they take: "512 (2.00MiB)".
func pages(n float64) string {
	return fmt.Sprintf("%s (%s)", num(n), units.Approx(uint64(max(0, n))*pageid.Size))
}

// num prints a rate or count compactly: 0, 12.5, 1234, 12.3k, 4.56M.
func num(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v == float64(int64(v)):
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}

// dur prints seconds as a duration rounded to 3 significant digits.
func dur(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond).String()
	}
	return d.String()
}
