package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pd3-go/pd3/hostview/pagecache"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/pageid"
)

func cachestatCmd() *cobra.Command {
	var interval time.Duration
	var count, top int
	cmd := &cobra.Command{
		Use:   "cachestat DIR",
		Short: "Per-file kernel page-cache residency and hits/misses under a mount",
		Long: `Show, for the files of the filesystem mounted at DIR (a pd3 mount, or any
other), how much of each the kernel page cache holds (mincore) and, from the
eBPF page-cache tracker, the pages read, the pages brought in (misses) and
the hit ratio over each interval, like bcc's cachetop. Hits and misses need
root; residency does not.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			dev, err := pagecache.DevOf(dir)
			if err != nil {
				return err
			}
			view := &pagecache.View{KeyOf: func(uint64, uint64) (pageid.Key, bool) { return 0, false }}
			tr, err := pagecache.Start(dev, view)
			if err != nil {
				logger().Warn(fmt.Sprintf("hits and misses unavailable (%v); showing residency only", err))
			} else {
				defer tr.Close()
				logger().Info(fmt.Sprintf("tracing the page cache of %s (every %v until Ctrl-C, or --count times)", dir, interval))
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sig)
			prev := map[uint64]pagecache.FileStats{}
			for i := 0; count == 0 || i < count; i++ {
				select {
				case <-sig:
					return nil
				case <-time.After(interval):
				}
				cur := map[uint64]pagecache.FileStats{}
				for _, f := range view.Files() {
					cur[f.Ino] = f
				}
				if err := printCachestat(cmd.OutOrStdout(), dir, cur, prev, top); err != nil {
					return err
				}
				prev = cur
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between reports")
	cmd.Flags().IntVar(&count, "count", 0, "reports to print (0: until Ctrl-C)")
	cmd.Flags().IntVar(&top, "top", 20, "files to show, most read first")
	return cmd
}

type cacheRow struct {
	path            string
	pages, resident int64
	delta           pagecache.FileStats // counters over the interval
}

func printCachestat(w io.Writer, dir string, cur, prev map[uint64]pagecache.FileStats, top int) error {
	var rows []cacheRow
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed while walking
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		r := cacheRow{path: p, pages: (info.Size() + 4095) / 4096}
		if f, err := os.Open(p); err == nil {
			shm.Residency(f, info.Size(), func(_ int64, res bool) {
				if res {
					r.resident++
				}
			})
			f.Close()
		}
		c, p0 := cur[st.Ino], prev[st.Ino]
		r.delta = pagecache.FileStats{Accessed: c.Accessed - p0.Accessed, Added: c.Added - p0.Added}
		if r.resident > 0 || r.delta.Accessed > 0 || r.delta.Added > 0 {
			rows = append(rows, r)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].delta.Accessed != rows[j].delta.Accessed {
			return rows[i].delta.Accessed > rows[j].delta.Accessed
		}
		return rows[i].resident > rows[j].resident
	})
	if len(rows) > top {
		rows = rows[:top]
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\n", time.Now().Format("15:04:05"))
	fmt.Fprintln(tw, "READ\tMISSES\tHIT%\tCACHED\tPAGES\tCACHED%\tFILE\t")
	for _, r := range rows {
		hit := "-"
		if r.delta.Accessed > 0 {
			hit = fmt.Sprintf("%.1f", 100*float64(r.delta.Hits())/float64(r.delta.Accessed))
		}
		pct := 0.0
		if r.pages > 0 {
			pct = 100 * float64(r.resident) / float64(r.pages)
		}
		rel, _ := filepath.Rel(dir, r.path)
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%.1f\t%s\t\n", r.delta.Accessed, r.delta.Added, hit, r.resident, r.pages, pct, rel)
	}
	return tw.Flush()
}
