package main

import (
	"fmt"
	"os/signal"
	"strings"
	"syscall"

	"github.com/pd3-go/pd3/dpu/split"
	"github.com/pd3-go/pd3/host"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/spf13/cobra"
)

func dpuCmd() *cobra.Command {
	var addr, name, metrics string
	var lzBytes, cacheBytes uint64
	var token *secretFlag
	var captures []string
	var nodeTLS tlsfiles.Files
	cmd := &cobra.Command{
		Use:   "dpu",
		Short: "Run the DPU agent as its own process (pair with: pd3 serve --dpu shm:NAME)",
		Long: `Run the DPU agent as a separate process. It creates /dev/shm/pd3-NAME, holding
the rings the host talks to it through and the Loading Zone, connects to the
memory node, and prefetches for the host that attaches with --dpu shm:NAME.
If it stops, the host goes on through its own memory-node connection and
re-attaches when an agent with the same name starts again.

With --packet page=ADDR or nbd=ADDR (repeatable) the agent watches the
clients' requests to the host's server at ADDR itself, on an AF_PACKET
socket, as a NIC mirroring packets to a DPU would; run the host with
--mirror packet (or none) so it does not also hand them over.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if addr == "" {
				return fmt.Errorf("--memnode ADDR is required")
			}
			targets, err := parseCaptures(captures)
			if err != nil {
				return err
			}
			log := logger()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cfg := host.AgentConfig{
				Name: name, Memnode: addr, Token: token.Value(), MemnodeTLS: nodeTLS, LZBytes: lzBytes, CacheBytes: cacheBytes,
				Captures: targets, Metrics: metrics, Log: log,
			}
			stopping := func() {}
			defer func() { stopping() }()
			return host.RunAgent(ctx, cfg, func(s *host.Agent) {
				for _, t := range targets {
					log.Info(fmt.Sprintf("dpu agent watching %s on an AF_PACKET socket", t.Addr))
				}
				if s.MetricsAddr != "" {
					log.Info(fmt.Sprintf("agent metrics listening on http://%s/metrics", s.MetricsAddr))
				}
				log.Info(fmt.Sprintf("dpu agent listening on shm:%s (epoch %d, Loading Zone %d pages)", name, s.Epoch, s.Zone.Records()))
				stopping = notifyReady(ctx, log, "agent serving shm:"+name)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "memnode", "", "memory node address")
	token = tokenFlag(fl, "memory-node access token (default $PD3_TOKEN)")
	tlsFilesVar(fl, &nodeTLS, "memnode-", false)
	fl.StringVar(&name, "shm", "pd3", "region name: /dev/shm/pd3-NAME")
	pagesVar(fl, &lzBytes, "lz", "16MiB", "Loading Zone size")
	pagesVar(fl, &cacheBytes, "cache", "64MiB", "the host's cache size (sizes Host View)")
	fl.StringVar(&metrics, "metrics", "", "serve Prometheus metrics on ADDR")
	fl.StringArrayVar(&captures, "packet", nil, "watch the requests to a host server: page=ADDR or nbd=ADDR (repeatable; needs CAP_NET_RAW)")
	return serving(cmd)
}

func parseCaptures(specs []string) ([]host.Capture, error) {
	var out []host.Capture
	for _, s := range specs {
		kind, addr, ok := strings.Cut(s, "=")
		t := host.Capture{Addr: addr}
		switch {
		case !ok || addr == "":
			return nil, fmt.Errorf("--packet %q: want page=ADDR or nbd=ADDR", s)
		case kind == "page":
			t.Proto = split.ProtoPage
		case kind == "nbd":
			t.Proto = split.ProtoNBD
		default:
			return nil, fmt.Errorf("--packet %q: protocol %q is neither page nor nbd", s, kind)
		}
		out = append(out, t)
	}
	return out, nil
}
