package cluster

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// DefaultName is the cluster name when none is given (--cluster).
const DefaultName = "pd3"

// ErrUnreachable is returned when etcd does not answer within the dial
// timeout: the control plane is down or the endpoints are wrong.
var ErrUnreachable = errors.New("cluster: etcd unreachable")

// Access is how to reach the control plane.
type Access struct {
	Endpoints []string // URLs or host:port
	// TLS, if set, secures the connections: RootCAs verifies etcd's
	// certificate, and Certificates, if any, is this client's (etcd's
	// --client-cert-auth).
	TLS *tls.Config
	// Username and Password authenticate to an etcd with authentication
	// enabled (etcdctl auth enable).
	Username, Password string
}

// Enabled reports whether any endpoint is given, i.e. the control plane
// is in use.
func (a Access) Enabled() bool { return len(a.Endpoints) > 0 }

// ErrDenied is returned when etcd refuses the credentials: a wrong user
// or password, no user, or a user without a role that reaches the
// cluster's keys. (An etcd without authentication ignores credentials.)
var ErrDenied = errors.New("cluster: etcd refused access")

// Dial connects to etcd as a says and checks that it answers, so that a
// wrong address fails here with ErrUnreachable, and wrong credentials
// with ErrDenied, not at the first use.
func Dial(ctx context.Context, a Access) (*clientv3.Client, error) {
	if len(a.Endpoints) == 0 {
		return nil, errors.New("cluster: no etcd endpoints")
	}
	at := strings.Join(a.Endpoints, ",")
	cli, err := clientv3.New(clientv3.Config{Endpoints: a.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		TLS: a.TLS, Username: a.Username, Password: a.Password})
	if err != nil {
		return nil, dialError(at, err)
	}
	// 5 s for an etcd that is still starting (docs/decisions.md, 25).
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Get(cctx, "/pd3/", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		if perr := probe(ctx, a.Endpoints); perr != nil {
			// Not "context deadline exceeded": why no endpoint answered.
			return nil, fmt.Errorf("%w at %s: %w; is etcd running there? (pd3 coord starts one)", ErrUnreachable, at, perr)
		}
		return nil, dialError(at, err)
	}
	return cli, nil
}

// probe connects to each TCP endpoint once and reports why none took the
// connection (connection refused, no route): after the client gave up,
// that is the cause to report rather than its "context deadline
// exceeded". An endpoint that connects, or one that is not TCP, gives nil.
func probe(ctx context.Context, endpoints []string) error {
	var errs []error
	for _, e := range endpoints {
		hostport := e
		if u, err := url.Parse(e); err == nil && u.Host != "" {
			if u.Scheme != "http" && u.Scheme != "https" {
				return nil
			}
			hostport = u.Host
		}
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", hostport)
		if err == nil {
			c.Close()
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// dialError names why etcd at could not be used: credentials refused, or
// no answer at all.
func dialError(at string, err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrPermissionDenied),
		errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrAuthNotEnabled),
		errors.Is(err, rpctypes.ErrInvalidAuthToken):
		return fmt.Errorf("%w at %s: %w", ErrDenied, at, err)
	}
	return fmt.Errorf("%w at %s: %w", ErrUnreachable, at, err)
}

// newSession opens an etcd session (a lease kept alive) of ttl, in whole
// seconds as etcd counts them, at least one.
func newSession(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (*concurrency.Session, error) {
	secs := max(1, int(ttl.Round(time.Second)/time.Second))
	// The lease is granted within ctx: concurrency.NewSession would wait
	// for an etcd that is gone for as long as it stays gone.
	lease, err := cli.Grant(ctx, int64(secs))
	if err != nil {
		return nil, err
	}
	return concurrency.NewSession(cli, concurrency.WithTTL(secs), concurrency.WithLease(lease.ID))
}

func prefix(cluster string) string { return "/pd3/" + cmp.Or(cluster, DefaultName) + "/" }

// NodeRecord is what a memory node records of itself at start.
type NodeRecord struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	Capacity uint64 `json:"capacity"` // bytes of page memory; 0 = unlimited
	Started  string `json:"started"`  // RFC 3339
}

// Liveness is the value of a node's alive key.
type Liveness struct {
	Stored uint64 `json:"stored"` // bytes of page memory in use
}

// Node is a node as the cluster sees it.
type Node struct {
	NodeRecord
	Up     bool   `json:"up"`
	Stored uint64 `json:"stored,omitempty"` // while up
	// Draining: an operator is moving everything off it (pd3 node
	// drain); nothing new is placed there.
	Draining bool `json:"draining,omitempty"`
}

// SetDraining marks node id as draining, or no longer.
func SetDraining(ctx context.Context, cli *clientv3.Client, cluster, id string, on bool) error {
	key := prefix(cluster) + "draining/" + id
	var err error
	if on {
		_, err = cli.Put(ctx, key, time.Now().UTC().Format(time.RFC3339))
	} else {
		_, err = cli.Delete(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("cluster: marking node %s draining: %w", id, err)
	}
	return nil
}

// State is "up" or "down".
func (n Node) State() string {
	if n.Up {
		return "up"
	}
	return "down"
}

// NodeID returns the id a memory node keeps across restarts in dir (its
// --persist directory), making one on first use; with dir "" it makes a
// fresh one, as a volatile node is a new node each time it starts.
func NodeID(dir string) (string, error) {
	fresh := func() string {
		var b [6]byte
		rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}
	if dir == "" {
		return fresh(), nil
	}
	p := filepath.Join(dir, "node-id")
	if b, err := os.ReadFile(p); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("cluster: node id: %w", err)
	}
	id := fresh()
	if err := os.WriteFile(p, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("cluster: node id: %w", err)
	}
	return id, nil
}

// Registration is a node's presence in the cluster: its record and its
// alive key, renewed until Close.
type Registration struct {
	cli    *clientv3.Client
	mu     sync.Mutex // guards sess, replaced when lost
	sess   *concurrency.Session
	ttl    time.Duration
	log    *slog.Logger
	pfx    string
	rec    NodeRecord
	keep   bool // Close leaves the record (a persistent node comes back)
	stored func() uint64
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	// Rejoined counts the sessions opened after one was lost.
	Rejoined atomic.Uint64
}

// RegisterOptions configure Register.
type RegisterOptions struct {
	Cluster string
	// TTL is how long after its last renewal a silent node is down
	// (default 5s; etcd's granularity is a second).
	TTL time.Duration
	// Stored, if set, reports the node's memory in use, looked at every
	// TTL/2 and put in its alive key when it changed.
	Stored func() uint64
	// Persistent nodes keep their record when they stop: they come back
	// with the same id and data. A volatile node's record is removed.
	Persistent bool
	// Log hears of a lost session and of the node rejoining (nil: not
	// logged).
	Log *slog.Logger

	repairTicks int // tests: aliveRepairTicks
}

// Register records node rec in the cluster and keeps it alive until
// Close; cli stays the caller's.
func Register(ctx context.Context, cli *clientv3.Client, rec NodeRecord, opt RegisterOptions) (*Registration, error) {
	ttl := cmp.Or(opt.TTL, 5*time.Second)
	sess, err := newSession(ctx, cli, ttl)
	if err != nil {
		return nil, fmt.Errorf("cluster: node lease: %w", err)
	}
	rec.Started = time.Now().UTC().Format(time.RFC3339)
	r := &Registration{cli: cli, sess: sess, ttl: ttl, log: opt.Log, pfx: prefix(opt.Cluster), rec: rec, keep: opt.Persistent,
		stored: opt.Stored, stop: make(chan struct{}), done: make(chan struct{})}
	if r.stored == nil {
		r.stored = func() uint64 { return 0 }
	}
	b, _ := json.Marshal(rec)
	if _, err := cli.Put(ctx, r.pfx+"nodes/"+rec.ID, string(b)); err != nil {
		sess.Close()
		return nil, fmt.Errorf("cluster: recording node %s: %w", rec.ID, err)
	}
	said := r.liveness()
	if err := r.alive(ctx, said); err != nil {
		sess.Close()
		return nil, err
	}
	go r.refresh(ttl/2, said, cmp.Or(opt.repairTicks, aliveRepairTicks))
	return r, nil
}

// liveness is what the node's alive key says now.
func (r *Registration) liveness() []byte {
	b, _ := json.Marshal(Liveness{Stored: r.stored()})
	return b
}

// alive puts the node's alive key, saying b, under its session's lease.
func (r *Registration) alive(ctx context.Context, b []byte) error {
	if _, err := r.cli.Put(ctx, r.pfx+"alive/"+r.rec.ID, string(b), clientv3.WithLease(r.session().Lease())); err != nil {
		return fmt.Errorf("cluster: node %s alive: %w", r.rec.ID, err)
	}
	return nil
}

func (r *Registration) session() *concurrency.Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sess
}

// aliveRepairTicks: an alive key whose figures have not changed is put
// again only every this many refreshes (30 s at the default TTL). The
// session's lease keeps the node alive on its own; a put is a write to
// etcd's log and an fdatasync (24 in 20 s of an idle pd3 up), so an idle
// node says nothing new, but still mends a key someone deleted.
const aliveRepairTicks = 12

// refresh renews the alive key's figures every interval when they changed
// (said is what the key says now), and when the session is lost (etcd
// did not hear from the node for a TTL: etcd down, or a partition) opens
// a new one and says the node is alive again, for as long as it takes: a
// node that is serving must come back up in the cluster's view once etcd
// can hear it.
func (r *Registration) refresh(every time.Duration, said []byte, repair int) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	quiet := 0 // refreshes since the last put
	for {
		select {
		case <-r.stop:
			return
		case <-r.session().Done():
			if !r.rejoin(every) {
				return
			}
			said = nil // the rejoin's put may have failed: say it again
		case <-t.C:
			b := r.liveness()
			if quiet++; bytes.Equal(b, said) && quiet < repair {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), every)
			said = b
			if r.alive(ctx, b) != nil {
				said = nil // a failure shows as the lease running out; say it again
			}
			cancel()
			quiet = 0
		}
	}
}

// rejoin replaces a lost session, retrying every interval until it
// succeeds (true) or Close is called (false).
func (r *Registration) rejoin(every time.Duration) bool {
	if r.log != nil {
		r.log.Warn(fmt.Sprintf("memory node %s: etcd did not hear from it for %v: it shows as down; rejoining", r.rec.ID, r.ttl))
	}
	for {
		// Each try within an interval, and given up at once by Close: a
		// node stopped while etcd is gone must stop.
		ctx, cancel := context.WithTimeout(context.Background(), every)
		go func() {
			select {
			case <-r.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		sess, err := newSession(ctx, r.cli, r.ttl)
		cancel()
		if err == nil {
			r.mu.Lock()
			r.sess.Orphan()
			r.sess = sess
			r.mu.Unlock()
			r.Rejoined.Add(1)
			if r.log != nil {
				r.log.Info(fmt.Sprintf("memory node %s: back in the cluster", r.rec.ID))
			}
			ctx, cancel := context.WithTimeout(context.Background(), every)
			r.alive(ctx, r.liveness()) // if this fails, the next tick says it
			cancel()
			return true
		}
		select {
		case <-r.stop:
			return false
		case <-time.After(every):
		}
	}
}

// Abandon stops the renewals without removing the node's record or
// ending its lease, as a node that crashed leaves them: the lease runs out
// one TTL later and the node reads as down. It is how a test kills a node
// that runs inside the test's process; Close after Abandon does nothing.
func (r *Registration) Abandon() {
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		r.session().Orphan()
	})
}

// Close takes the node out of the cluster: its alive key goes with its
// lease, and a volatile node's record with it.
func (r *Registration) Close() error {
	var err error
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if !r.keep {
			if _, derr := r.cli.Delete(ctx, r.pfx+"nodes/"+r.rec.ID); derr != nil {
				err = fmt.Errorf("cluster: removing node %s's record: %w", r.rec.ID, derr)
			}
		}
		sess := r.session()
		err = errors.Join(err, endSession(ctx, sess, sess.Done(), "node "+r.rec.ID+"'s"))
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("cluster: node %s: etcd did not answer within 5s, so the node left without a word: etcd shows it down once its lease runs out (%w)", r.rec.ID, ctx.Err())
		}
	})
	return err
}

// endSession ends sess: revoked within ctx, so that what it holds goes
// at once, or only let go if lost is closed (etcd let go of it already:
// nothing to revoke). whose names the session in the error. (The
// session's own Close would wait a whole TTL for an etcd that is gone,
// after the caller had waited for it already.)
func endSession(ctx context.Context, sess *concurrency.Session, lost <-chan struct{}, whose string) error {
	sess.Orphan() // no more keep-alives
	select {
	case <-lost:
		return nil
	default:
	}
	if _, err := sess.Client().Revoke(ctx, sess.Lease()); err != nil {
		return fmt.Errorf("cluster: ending %s session (etcd revokes it after its TTL anyway): %w", whose, err)
	}
	return nil
}

// bySuffix decodes the JSON values of kvs into a map keyed by what
// follows pfx in each key; a value that does not decode reads as zero
// (the keys are the cluster's own, and a reader should not fail on one).
func bySuffix[T any](kvs []*mvccpb.KeyValue, pfx string) map[string]T {
	out := make(map[string]T, len(kvs))
	for _, kv := range kvs {
		var v T
		json.Unmarshal(kv.Value, &v)
		out[strings.TrimPrefix(string(kv.Key), pfx)] = v
	}
	return out
}

// ErrNodeUp is Forget's answer for a node that is up.
var ErrNodeUp = errors.New("cluster: the node is up")

// ErrNodeHolds is Forget's answer for a node that volumes still name.
var ErrNodeHolds = errors.New("cluster: volumes still name the node")

// Forget removes the record of memory node id, which must be down and
// named by no volume (a volume of its own, or a replica in a stripe map):
// a volatile node that died stays listed down for ever otherwise. The
// check of liveness and the removal are one transaction.
func Forget(ctx context.Context, cli *clientv3.Client, cluster, id string) error {
	pfx := prefix(cluster)
	vols, err := Volumes(ctx, cli, cluster)
	if err != nil {
		return err
	}
	var named []string
	for _, v := range vols {
		if v.Node == id || (v.Stripes != nil && slices.Contains(v.Stripes.Nodes(), id)) {
			named = append(named, v.Name)
		}
	}
	if len(named) > 0 {
		return fmt.Errorf("%w: node %s: %s", ErrNodeHolds, id, strings.Join(named, ", "))
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(pfx+"nodes/"+id), ">", 0),
			clientv3.Compare(clientv3.CreateRevision(pfx+"alive/"+id), "=", 0)).
		Then(clientv3.OpDelete(pfx+"nodes/"+id), clientv3.OpDelete(pfx+"draining/"+id)).
		Else(clientv3.OpGet(pfx+"nodes/"+id, clientv3.WithCountOnly())).
		Commit()
	if err != nil {
		return fmt.Errorf("cluster: forgetting node %s: %w", id, err)
	}
	if !resp.Succeeded {
		if resp.Responses[0].GetResponseRange().Count == 0 {
			return fmt.Errorf("cluster: no memory node %s in cluster %s", id, cmp.Or(cluster, DefaultName))
		}
		return fmt.Errorf("%w: node %s", ErrNodeUp, id)
	}
	return nil
}

// Nodes lists the cluster's memory nodes, up or down, by id.
func Nodes(ctx context.Context, cli *clientv3.Client, cluster string) ([]Node, error) {
	pfx := prefix(cluster)
	// One revision for both ranges: a node is not seen up without its record.
	recs, err := cli.Get(ctx, pfx+"nodes/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("cluster: listing nodes: %w", err)
	}
	alive, err := cli.Get(ctx, pfx+"alive/", clientv3.WithPrefix(), clientv3.WithRev(recs.Header.Revision))
	if err != nil {
		return nil, fmt.Errorf("cluster: listing nodes: %w", err)
	}
	draining, err := cli.Get(ctx, pfx+"draining/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithRev(recs.Header.Revision))
	if err != nil {
		return nil, fmt.Errorf("cluster: listing nodes: %w", err)
	}
	drain := map[string]bool{}
	for _, kv := range draining.Kvs {
		drain[strings.TrimPrefix(string(kv.Key), pfx+"draining/")] = true
	}
	live := bySuffix[Liveness](alive.Kvs, pfx+"alive/")
	var out []Node
	for _, kv := range recs.Kvs {
		var n Node
		if err := json.Unmarshal(kv.Value, &n.NodeRecord); err != nil {
			return nil, fmt.Errorf("cluster: node record %s: %w", kv.Key, err)
		}
		l, ok := live[n.ID]
		n.Up, n.Stored, n.Draining = ok, l.Stored, drain[n.ID]
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
