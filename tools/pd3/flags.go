package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/host"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/pageid"
)

// Typed flag values: each is parsed once, when cobra sets the flag, so a
// bad value is a usage error (pointed at --help) before anything starts,
// and commands read numbers, not strings.

// pagesValue is a size in bytes that must be a whole number of pages.
type pagesValue struct {
	n    *uint64
	text string
}

// schemeValue is an erasure code flag, K+M ("" while unset).
type schemeValue struct{ s *cluster.Scheme }

func (v schemeValue) String() string {
	if v.s == nil || v.s.K == 0 {
		return ""
	}
	return v.s.String()
}
func (v schemeValue) Type() string { return "K+M" }
func (v schemeValue) Set(s string) error {
	sch, err := cluster.ParseScheme(s)
	if err == nil {
		*v.s = sch
	}
	return err
}

// pagesVar registers a page-multiple size flag with default def.
func pagesVar(fl *pflag.FlagSet, p *uint64, name, def, usage string) {
	n, err := units.ParseMultiple(def, pageid.Size)
	if err != nil {
		panic("flag --" + name + " default: " + err.Error())
	}
	*p = n
	fl.Var(&pagesValue{n: p, text: def}, name, usage)
}

func (v *pagesValue) String() string { return v.text }
func (v *pagesValue) Type() string   { return "size" }
func (v *pagesValue) Set(s string) error {
	n, err := units.ParseMultiple(s, pageid.Size)
	if err != nil {
		return err
	}
	*v.n, v.text = n, s
	return nil
}

// volumesValue is a repeatable NAME:SIZE flag; the first use replaces
// the default.
type volumesValue struct {
	vs      *[]host.VolumeSpec
	changed bool
}

func volumesVar(fl *pflag.FlagSet, p *[]host.VolumeSpec, name string, def []host.VolumeSpec, usage string) {
	*p = def
	fl.Var(&volumesValue{vs: p}, name, usage)
}

func (v *volumesValue) Type() string { return "NAME:SIZE" }
func (v *volumesValue) String() string {
	var parts []string
	for _, s := range *v.vs {
		parts = append(parts, s.Name+":"+units.FormatSize(s.Size))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func (v *volumesValue) Set(s string) error {
	vs, err := host.ParseVolume(s)
	if err != nil {
		return err
	}
	if !v.changed {
		*v.vs, v.changed = nil, true
	}
	*v.vs = append(*v.vs, vs)
	return nil
}

// tokenFlag registers --token on fl, defaulting to $PD3_TOKEN without
// putting it in the flag's default: cobra prints defaults in --help and
// in flag errors, and a secret must appear in neither.
func tokenFlag(fl *pflag.FlagSet, usage string) *secretFlag {
	s := &secretFlag{env: "PD3_TOKEN"}
	fl.Var(s, "token", usage)
	return s
}

// secretFlag is a string flag whose value is never printed.
type secretFlag struct {
	v   string
	set bool
	env string
}

func (s *secretFlag) String() string { return "" }
func (s *secretFlag) Type() string   { return "string" }
func (s *secretFlag) Set(v string) error {
	s.v, s.set = v, true
	return nil
}

// Value is the flag's value, or the environment variable's when the flag
// was not given (read at run time, not at registration).
func (s *secretFlag) Value() string {
	if s.set {
		return s.v
	}
	return os.Getenv(s.env)
}

// tlsFilesVar registers --PREFIXtls-ca, --PREFIXtls-cert and
// --PREFIXtls-key: the memory-node link's files. The memory node takes them
// without a prefix; hosts and agents as --memnode-tls-*, apart from the
// NBD server's --tls flags on the same command.
func tlsFilesVar(fl *pflag.FlagSet, f *tlsfiles.Files, prefix string, serving bool) {
	ca, cert := "CA certificate (PEM) that signed the memory node's certificate; TLS on the memory-node link", "this client's certificate (PEM), for a node that verifies clients"
	if serving {
		ca, cert = "CA certificate (PEM) that signs clients' certificates: clients must present one (mutual TLS)", "serve TLS with this certificate (PEM; with --tls-key)"
	}
	fl.StringVar(&f.CA, prefix+"tls-ca", "", ca)
	fl.StringVar(&f.Cert, prefix+"tls-cert", "", cert)
	fl.StringVar(&f.Key, prefix+"tls-key", "", "private key (PEM) of --"+prefix+"tls-cert")
}

// etcdFlags are how a command reaches the control plane: --etcd,
// --cluster, TLS (--etcd-ca, --etcd-cert, --etcd-key) and authentication
// (--etcd-user, with --etcd-password or $PD3_ETCD_PASSWORD).
type etcdFlags struct {
	endpoints []string
	cluster   string
	tls       tlsfiles.Files
	user      string
	password  *secretFlag
}

func addEtcdFlags(fl *pflag.FlagSet, usage string) *etcdFlags {
	f := &etcdFlags{password: &secretFlag{env: "PD3_ETCD_PASSWORD"}}
	fl.StringSliceVar(&f.endpoints, "etcd", nil, usage)
	fl.StringVar(&f.cluster, "cluster", cluster.DefaultName, "cluster name: its state lives under /pd3/NAME/ in etcd")
	fl.StringVar(&f.tls.CA, "etcd-ca", "", "CA certificate (PEM) that signed etcd's certificate: TLS to etcd (https:// endpoints)")
	fl.StringVar(&f.tls.Cert, "etcd-cert", "", "this client's certificate (PEM), for an etcd that verifies clients (--client-cert-auth)")
	fl.StringVar(&f.tls.Key, "etcd-key", "", "private key (PEM) of --etcd-cert")
	fl.StringVar(&f.user, "etcd-user", "", "etcd user, for an etcd with authentication enabled (password: --etcd-password, or $PD3_ETCD_PASSWORD)")
	fl.Var(f.password, "etcd-password", "password of --etcd-user (default $PD3_ETCD_PASSWORD)")
	return f
}

// dial connects to the control plane the flags name (cluster.Dial).
func (f *etcdFlags) dial(ctx context.Context) (*clientv3.Client, error) {
	a, err := f.access()
	if err != nil {
		return nil, err
	}
	return cluster.Dial(ctx, a)
}

// access loads the TLS files, if any are named.
func (f *etcdFlags) access() (cluster.Access, error) {
	a := cluster.Access{Endpoints: f.endpoints, Username: f.user}
	if f.user != "" {
		a.Password = f.password.Value()
	}
	if f.tls.Enabled() {
		cfg, err := f.tls.Client()
		if err != nil {
			return a, fmt.Errorf("--etcd-ca/--etcd-cert/--etcd-key: %w", err)
		}
		a.TLS = cfg
	}
	return a, nil
}

// flagOf names the flag that sets host.Config's field, "" for a field
// no flag sets.
func flagOf(field string) string {
	switch field {
	case "Volumes":
		return "--volume"
	case "Policy":
		return "--policy"
	case "Memnode":
		return "--memnode"
	case "MemnodeTLS":
		return "--memnode-tls-cert"
	case "Local":
		return "--local"
	case "Mount":
		return "--mount"
	case "FSName":
		return "--fs-name"
	case "Etcd":
		return "--etcd"
	case "Replicas":
		return "--replicas"
	case "EC":
		return "--ec"
	case "DPU":
		return "--dpu"
	case "Mirror":
		return "--mirror"
	case "Prefetch":
		return "--prefetch"
	case "NBDTLS":
		return "--tls"
	case "NBDTLSCertificates":
		return "--tls-certificates"
	case "Memnodes":
		return "--memnodes"
	case "MemnodeListen":
		return "--memnode-listen"
	case "EtcdListen":
		return "--etcd-listen"
	case "Persist":
		return "--persist"
	}
	return ""
}

// configFieldRe matches a field of host.Config or host.EmbeddedConfig as
// their errors name one.
var configFieldRe = regexp.MustCompile(`\b(?:Embedded)?Config\.([A-Za-z]+)`)

// inFlagWords rewrites a host.ConfigError into the command's words: the
// fields it names become the flags that set them, and it becomes a usage
// error. Other errors pass unchanged.
func inFlagWords(err error) error {
	var ce *host.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	words := func(field string) string {
		if f := flagOf(field); f != "" {
			return f
		}
		return "Config." + field
	}
	msg := configFieldRe.ReplaceAllStringFunc(ce.Err.Error(), func(m string) string { return words(m[strings.IndexByte(m, '.')+1:]) })
	return usageError{fmt.Errorf("%s: %s", words(ce.Field), msg)}
}

// portsFree refuses, before anything starts or prints, a listen address
// (flag → address) that another process holds: a port in use would
// otherwise be found only after etcd and a memory node had started. A
// port left to the system (:0) and unix sockets are not checked. The
// check binds and lets go at once, so a port taken in between is still
// reported by the server that binds it.
func portsFree(flags map[string]string) error {
	names := make([]string, 0, len(flags))
	for f := range flags {
		names = append(names, f)
	}
	slices.Sort(names)
	for _, flag := range names {
		addr := flags[flag]
		if addr == "" || strings.HasPrefix(addr, "unix:") || strings.HasSuffix(addr, ":0") {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return usageError{fmt.Errorf("%s %s: the address is in use (another pd3 or server listens there): choose another with %s HOST:PORT, or %s '' for none", flag, addr, flag, flag)}
			}
			return usageError{fmt.Errorf("%s %s: %w", flag, addr, err)}
		}
		ln.Close()
	}
	return nil
}

// checkFirst refuses, before anything starts, a configuration host.Start
// would refuse. embedded says the command starts the memory nodes and the
// etcd that cfg does not name yet (pd3 up, pd3 mount).
func checkFirst(cfg host.Config, embedded bool) error {
	if embedded {
		if cfg.Memnode == "" {
			cfg.Memnode = "embedded"
		}
		if !cfg.Etcd.Enabled() {
			cfg.Etcd.Endpoints = []string{"embedded"}
		}
	}
	return inFlagWords(cfg.Check())
}
