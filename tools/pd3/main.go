// Command pd3 runs the pd3 page store: memory node, host and benchmarks.
// Flag parsing lives here; everything else is in the library packages.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"

	"github.com/pd3-go/pd3/internal/sched"
)

func main() {
	root := newRoot()
	// PD3_CPUPROFILE=prefix profiles this process (and the children a
	// benchmark starts) into prefix.<pid>, for `go tool pprof`.
	if prefix := os.Getenv("PD3_CPUPROFILE"); prefix != "" {
		f, err := os.Create(fmt.Sprintf("%s.%d", prefix, os.Getpid()))
		if err == nil {
			pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	if cmd, err := root.ExecuteC(); err != nil {
		err = inFlagWords(err)
		log := logger()
		log.Error(err.Error())
		if errors.As(err, new(usageError)) {
			log.Info(fmt.Sprintf("run '%s --help' for usage", cmd.CommandPath()))
		}
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// newRoot builds the command tree: every command, flag and help text
// (docs/cli is generated from it).
func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "pd3",
		Short:         "pd3 — pages in remote memory, prefetched by a DPU agent",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var procs int
	root.PersistentFlags().IntVar(&procs, "procs", 0, "OS threads running Go code at once, in this process and the pd3 processes a benchmark starts (GOMAXPROCS; 0: one per CPU). Where pd3 shares a few cores with its memory node and clients, 1 saves the Go scheduler's cross-thread wake-ups (docs/decisions.md, 23)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		enterSched(cmd)
		if procs < 0 {
			return fmt.Errorf("--procs %d: want 0 (one per CPU) or more", procs)
		}
		if procs > 0 {
			runtime.GOMAXPROCS(procs)
			// Benchmarks re-execute pd3 for each role; they inherit it.
			os.Setenv("GOMAXPROCS", strconv.Itoa(procs))
		}
		return nil
	}
	root.AddCommand(upCmd(), serveCmd(), mountCmd(), cachestatCmd(), memnodeCmd(), dpuCmd(), pageCmd(), benchCmd(), topCmd(), clusterCmd(), volumeCmd(), coordCmd(), nodeCmd(), certsCmd())
	// Runnable, so that "pd3 frob" fails NoArgs (an unknown command, a
	// usage error) instead of printing the help and exiting 0.
	root.Args = cobra.NoArgs
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	markUsageErrors(root)
	return root
}

// schedValue is the --sched flag: batch or normal.
type schedValue string

func (v *schedValue) String() string { return string(*v) }
func (v *schedValue) Type() string   { return "class" }
func (v *schedValue) Set(s string) error {
	if s != "batch" && s != "normal" {
		return fmt.Errorf("%q is no scheduling class of pd3's: want batch or normal", s)
	}
	*v = schedValue(s)
	return nil
}

// servingKey is the annotation of the commands that serve.
const servingKey = "pd3.serving"

// serving marks cmd as a serving command and gives it --sched.
func serving(cmd *cobra.Command) *cobra.Command {
	cmd.Annotations = map[string]string{servingKey: "true"}
	class := schedValue("batch")
	cmd.Flags().Var(&class, "sched", "scheduling class of this process: batch (SCHED_BATCH: a request one pd3 process hands another on shared cores does not preempt the sender, which goes on to its next requests; docs/decisions.md, 47) or normal")
	return cmd
}

// enterSched puts a serving command's process in the scheduling class
// of its --sched. A benchmark's --sched reaches the pd3 processes it
// starts through $PD3_SCHED, unless their own --sched says otherwise. A
// process that cannot change its class serves in the one it has.
func enterSched(cmd *cobra.Command) {
	f := cmd.Flags().Lookup("sched")
	if f == nil {
		return
	}
	class := f.Value.(*schedValue)
	if env := os.Getenv("PD3_SCHED"); env != "" && !f.Changed {
		if err := class.Set(env); err != nil {
			logger().Warn("$PD3_SCHED: " + err.Error())
		}
	}
	os.Setenv("PD3_SCHED", string(*class))
	if *class != "batch" || cmd.Annotations[servingKey] == "" {
		return
	}
	if _, err := sched.Batch(); err != nil {
		logger().Warn("serving in the normal scheduling class", "err", err)
	}
}

// usageError is a command line cobra could not take (an unknown command
// or flag, a bad flag value, the wrong number of arguments): the user is
// pointed at --help, which other errors do not need.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// markUsageErrors makes the flag and argument errors of c and its
// subcommands usageErrors.
func markUsageErrors(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
	}
}

// notifySystemd tells systemd the service's state (a Type=notify unit
// waits for READY=1 before starting its dependants). Outside systemd
// ($NOTIFY_SOCKET unset) it does nothing.
func notifySystemd(log *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Warn("telling systemd the service state", "state", state, "err", err)
	}
}

// notifyReady reports readiness with a status line, and STOPPING=1 once
// ctx ends (the shutdown, with its write-back, begins). The process must
// call the returned function before it exits: the STOPPING datagram is sent
// from a goroutine that an exiting process would not wait for.
func notifyReady(ctx context.Context, log *slog.Logger, status string) (flush func()) {
	notifySystemd(log, daemon.SdNotifyReady+"\nSTATUS="+status)
	sent := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		notifySystemd(log, daemon.SdNotifyStopping)
		close(sent)
	})
	return func() {
		if !stop() {
			<-sent
		} else if ctx.Err() != nil {
			// ctx ended but its AfterFunc had not started yet.
			notifySystemd(log, daemon.SdNotifyStopping)
		}
	}
}
