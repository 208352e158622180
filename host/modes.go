package host

import (
	"fmt"
	"github.com/pd3-go/pd3/cluster"
	"slices"
	"strings"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/pagestore"
)

// The host's modes are types, parsed where they are written (a flag, a
// test's literal), so Start meets no unknown mode. Each has String and Set
// and so serves as a pflag.Value as it is.

// AgentMode says where the DPU agent runs.
type AgentMode struct {
	// Kind is AgentNone, AgentEmbedded or AgentSplit.
	Kind AgentKind
	// Region names the shared-memory region of a split agent (pd3 dpu
	// --region NAME); empty otherwise.
	Region string
}

// AgentKind is where the agent runs.
type AgentKind uint8

const (
	// AgentNone: no agent; every miss is the host's own memory-node read.
	AgentNone AgentKind = iota
	// AgentEmbedded: the agent's goroutines run in the host's process.
	AgentEmbedded
	// AgentSplit: the agent is a separate process (pd3 dpu), reached
	// through a shared-memory region.
	AgentSplit
)

// EmbeddedAgent is the agent that runs in the host's process.
var EmbeddedAgent = AgentMode{Kind: AgentEmbedded}

// SplitAgent is the agent process serving the shared-memory region name.
func SplitAgent(region string) AgentMode { return AgentMode{Kind: AgentSplit, Region: region} }

// ParseAgent reads "none" (or ""), "embedded" or "shm:NAME".
func ParseAgent(s string) (AgentMode, error) {
	switch s {
	case "", "none":
		return AgentMode{}, nil
	case "embedded":
		return EmbeddedAgent, nil
	}
	if name, ok := strings.CutPrefix(s, "shm:"); ok && name != "" {
		return SplitAgent(name), nil
	}
	return AgentMode{}, fmt.Errorf("unknown agent %q: embedded, none or shm:NAME", s)
}

func (a AgentMode) String() string {
	switch a.Kind {
	case AgentEmbedded:
		return "embedded"
	case AgentSplit:
		return "shm:" + a.Region
	}
	return "none"
}

// Set parses s into a (pflag.Value).
func (a *AgentMode) Set(s string) (err error) { *a, err = ParseAgent(s); return err }

// Type names the value's form in --help (pflag.Value).
func (a *AgentMode) Type() string { return "mode" }

// Mirror is how the agent sees the clients' requests.
type Mirror uint8

const (
	// MirrorTap: each connection reader hands the agent the bytes it read.
	MirrorTap Mirror = iota
	// MirrorPacket: an AF_PACKET capture of the servers' ports, in the
	// host's process for an embedded agent; a split agent captures in its
	// own (pd3 dpu --packet) and the host does nothing.
	MirrorPacket
	// MirrorNone: the agent sees no request.
	MirrorNone
)

// mirrorNames are the Mirror values' names in their order.
const mirrorNames = "tap packet none"

// ParseMirror reads "tap" (or ""), "packet" or "none".
func ParseMirror(s string) (Mirror, error) { return parseName[Mirror]("mirror", mirrorNames, s) }

func (m Mirror) String() string { return nameOf(mirrorNames, m) }

// Set parses s into m (pflag.Value).
func (m *Mirror) Set(s string) (err error) { *m, err = ParseMirror(s); return err }

// Type names the value's form in --help (pflag.Value).
func (m *Mirror) Type() string { return "mirror" }

// Prefetcher is a host-side prefetcher, for a host without an agent.
type Prefetcher uint8

const (
	// PrefetchNone: the host prefetches nothing itself.
	PrefetchNone Prefetcher = iota
	// PrefetchLeap: Leap's majority-delta predictor over the host's misses.
	PrefetchLeap
)

// prefetcherNames are the Prefetcher values' names in their order.
const prefetcherNames = "none leap"

// ParsePrefetcher reads "none" (or "") or "leap".
func ParsePrefetcher(s string) (Prefetcher, error) {
	return parseName[Prefetcher]("prefetcher", prefetcherNames, s)
}

func (p Prefetcher) String() string { return nameOf(prefetcherNames, p) }

// Set parses s into p (pflag.Value).
func (p *Prefetcher) Set(s string) (err error) { *p, err = ParsePrefetcher(s); return err }

// Type names the value's form in --help (pflag.Value).
func (p *Prefetcher) Type() string { return "prefetcher" }

// TLSMode is whether the NBD server speaks TLS.
type TLSMode uint8

const (
	// TLSOff: plaintext only.
	TLSOff TLSMode = iota
	// TLSOn: STARTTLS offered; a client may stay in clear.
	TLSOn
	// TLSRequire: nothing but STARTTLS before TLS (clients use nbds://).
	TLSRequire
)

// tlsNames are the TLSMode values' names in their order.
const tlsNames = "off on require"

// ParseTLSMode reads "off" (or ""), "on" or "require".
func ParseTLSMode(s string) (TLSMode, error) { return parseName[TLSMode]("TLS mode", tlsNames, s) }

func (m TLSMode) String() string { return nameOf(tlsNames, m) }

// Set parses s into m (pflag.Value).
func (m *TLSMode) Set(s string) (err error) { *m, err = ParseTLSMode(s); return err }

// Type names the value's form in --help (pflag.Value).
func (m *TLSMode) Type() string { return "mode" }

// parseName reads one of names, "" being the first; the value is its
// index.
// parseName is the value of T named s among names (space-separated, in
// the values' order); "" is the zero value.
func parseName[T ~uint8](what, names, s string) (T, error) {
	if s == "" {
		return 0, nil
	}
	all := strings.Fields(names)
	if i := slices.Index(all, s); i >= 0 {
		return T(i), nil
	}
	return 0, fmt.Errorf("unknown %s %q: %s or %s", what, s, strings.Join(all[:len(all)-1], ", "), all[len(all)-1])
}

func nameOf[T ~uint8](names string, v T) string {
	if all := strings.Fields(names); int(v) < len(all) {
		return all[v]
	}
	return fmt.Sprintf("%d", v)
}

// A ConfigError is a Config that Start refuses before it starts anything:
// Field names the field at fault; the message names any other field as
// Config.Name, which a command may rewrite into its own flags' names.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return "host: Config." + e.Field + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

func fieldErr(field, format string, a ...any) error {
	return &ConfigError{Field: field, Err: fmt.Errorf(format, a...)}
}

// Check refuses a Config whose fields contradict each other. Start calls
// it before anything starts; a command may call it sooner.
func (c *Config) Check() error {
	if len(c.Volumes) == 0 {
		return fieldErr("Volumes", "no volume to serve")
	}
	if err := pagestore.CheckPolicy(c.Policy); err != nil {
		return &ConfigError{Field: "Policy", Err: err}
	}
	if c.FSName != "" {
		if err := fs.CheckName(c.FSName); err != nil {
			return &ConfigError{Field: "FSName", Err: err}
		}
	}
	if c.Local && c.Mount != "" {
		return fieldErr("Local", "keeps volumes in host memory; Config.Mount needs a memory node")
	}
	if c.Replicas > 0 && !c.Etcd.Enabled() {
		return fieldErr("Replicas", "replicated volumes need the control plane (Config.Etcd)")
	}
	if c.EC != (cluster.Scheme{}) {
		if err := c.EC.Check(); err != nil {
			return &ConfigError{Field: "EC", Err: err}
		}
		if !c.Etcd.Enabled() {
			return fieldErr("EC", "erasure-coded volumes need the control plane (Config.Etcd)")
		}
		if c.DPU.Kind == AgentSplit {
			return fieldErr("DPU", "a split agent reads one memory node: with Config.EC use embedded")
		}
	}
	if !c.Local && c.Replicas == 0 && c.Memnode == "" && !c.Etcd.Enabled() {
		return fieldErr("Memnode", "no memory node address, and no control plane (Config.Etcd) to place the volumes through")
	}
	if c.Mirror == MirrorPacket && c.DPU.Kind == AgentNone {
		return fieldErr("Mirror", "packet feeds an agent: set Config.DPU to embedded or shm:NAME")
	}
	if c.Prefetch != PrefetchNone && c.DPU.Kind != AgentNone {
		return fieldErr("Prefetch", "%s is a host-side prefetcher: set Config.DPU to none", c.Prefetch)
	}
	if c.DPU.Kind == AgentSplit && c.Replicas > 0 {
		return fieldErr("DPU", "a split agent reads one memory node: with Config.Replicas use embedded")
	}
	if c.DPU.Kind == AgentSplit && c.DPU.Region == "" {
		return fieldErr("DPU", "a split agent needs a region name (shm:NAME)")
	}
	if c.NBDTLS != TLSOff && c.NBDTLSCertificates == "" && c.NBDListen != "" {
		return fieldErr("NBDTLS", "%s needs Config.NBDTLSCertificates, a directory with server-cert.pem, server-key.pem and ca-cert.pem (pd3 certs makes one)", c.NBDTLS)
	}
	return nil
}
