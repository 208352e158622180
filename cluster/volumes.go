package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/pd3-go/pd3/pageid"
)

// Host is a host's presence in the control plane: one etcd session (a
// lease the host keeps renewing) under which it holds its volumes.
type Host struct {
	cli *clientv3.Client
	pfx string
	ttl time.Duration

	mu    sync.Mutex
	sess  *concurrency.Session // replaced when resumed
	doubt func(bool)           // SetDoubt's

	lost, stop, done chan struct{}
	once             sync.Once

	// Resumed counts the times the client gave the lease up for lost
	// (no renewal answered for a TTL: an etcd leader that died, and a
	// client slow to find the next one) while etcd still kept it.
	Resumed atomic.Uint64
}

// HostInfo says which host a session is: what pd3 cluster status shows
// as a volume's holder.
type HostInfo struct {
	Hostname string `json:"hostname"`
	PID      int    `json:"pid"`
	Started  string `json:"started"` // RFC 3339
}

func (h HostInfo) String() string { return fmt.Sprintf("%s pid %d", h.Hostname, h.PID) }

// NewHost opens a session of ttl for a host of cluster name, recorded as
// /pd3/NAME/hosts/LEASE for as long as the session lives; cli stays the
// caller's.
func NewHost(ctx context.Context, cli *clientv3.Client, name string, ttl time.Duration) (*Host, error) {
	sess, err := newSession(ctx, cli, ttl)
	if err != nil {
		return nil, fmt.Errorf("cluster: host session: %w", err)
	}
	h := &Host{cli: cli, sess: sess, pfx: prefix(name), ttl: ttl,
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	hn, _ := os.Hostname()
	b, _ := json.Marshal(HostInfo{Hostname: hn, PID: os.Getpid(), Started: time.Now().UTC().Format(time.RFC3339)})
	if _, err := cli.Put(ctx, fmt.Sprintf("%shosts/%x", h.pfx, sess.Lease()), string(b), clientv3.WithLease(sess.Lease())); err != nil {
		sess.Close()
		return nil, fmt.Errorf("cluster: recording the host: %w", err)
	}
	go h.watch()
	return h, nil
}

// SetDoubt has fn(true) called when the session ends on the client's
// side, before etcd is asked whether the lease lives on, and fn(false)
// when it does: in between the host should serve nothing, as another
// host may hold its volumes if the answer is no. (A no closes Lost
// instead, without fn(false).)
func (h *Host) SetDoubt(fn func(doubting bool)) {
	h.mu.Lock()
	h.doubt = fn
	h.mu.Unlock()
}

func (h *Host) doubting(d bool) {
	h.mu.Lock()
	fn := h.doubt
	h.mu.Unlock()
	if fn != nil {
		fn(d)
	}
}

func (h *Host) session() *concurrency.Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sess
}

// watch turns the end of the session into Lost, unless etcd says the
// lease is still alive: the client's view (no renewal answered for a TTL)
// is a suspicion, and etcd's the answer. A leader's death shows this way
// when the client takes longer than the TTL to move to another member,
// while the new leader has extended every lease. If etcd cannot be asked,
// the lease may have run out and another host may hold the volumes: the
// host is lost. (Fencing tokens at the memory node keep the late writes
// of a host that loses its lease out either way.)
func (h *Host) watch() {
	defer close(h.done)
	for {
		select {
		case <-h.stop:
			return
		case <-h.session().Done():
		}
		select {
		case <-h.stop:
			return
		default:
		}
		h.doubting(true)
		if !h.resume() {
			close(h.lost)
			return
		}
		h.doubting(false)
	}
}

// resume opens a session on the same lease if etcd still keeps it.
func (h *Host) resume() bool {
	old := h.session()
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Second, h.ttl/2))
	defer cancel()
	go func() { // a Close meanwhile ends the question: the host stops
		select {
		case <-h.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	ttl, err := h.cli.TimeToLive(ctx, old.Lease())
	if err != nil || ttl.TTL <= 0 {
		return false
	}
	sess, err := concurrency.NewSession(h.cli, concurrency.WithLease(old.Lease()))
	if err != nil {
		return false
	}
	h.mu.Lock()
	h.sess = sess
	h.mu.Unlock()
	old.Orphan()
	h.Resumed.Add(1)
	return true
}

// Holders maps each volume held in cluster name to its holder (the
// oldest waiter of the volume's mutex, as etcd's mutex defines it).
func Holders(ctx context.Context, cli *clientv3.Client, name string) (map[string]HostInfo, error) {
	pfx := prefix(name)
	locks, err := cli.Get(ctx, pfx+"holders/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("cluster: listing holders: %w", err)
	}
	hosts, err := cli.Get(ctx, pfx+"hosts/", clientv3.WithPrefix(), clientv3.WithRev(locks.Header.Revision))
	if err != nil {
		return nil, fmt.Errorf("cluster: listing hosts: %w", err)
	}
	byLease := bySuffix[HostInfo](hosts.Kvs, pfx+"hosts/")
	out := map[string]HostInfo{}
	oldest := map[string]int64{}
	for _, kv := range locks.Kvs {
		vol, lease, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), pfx+"holders/"), "/")
		if !ok {
			continue
		}
		if r, seen := oldest[vol]; seen && r < kv.CreateRevision {
			continue
		}
		oldest[vol] = kv.CreateRevision
		out[vol] = byLease[lease]
	}
	return out, nil
}

// Lost is closed when the host's session expired: etcd did not hear from
// it for a TTL, and another host may hold its volumes by now.
func (h *Host) Lost() <-chan struct{} { return h.lost }

// Hold takes volume name for this host alone (an etcd mutex under the
// host's session, /pd3/NAME/holders/VOLUME/LEASE), waiting up to wait for a
// holder to release it or for a crashed holder's session to expire.
func (h *Host) Hold(ctx context.Context, name string, wait time.Duration) (*Hold, error) {
	m := concurrency.NewMutex(h.session(), h.pfx+"holders/"+name) // its keys: .../NAME/LEASE
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := m.Lock(lctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("cluster: volume %q: %w (waited %v)", name, pageid.ErrHeld, wait)
		}
		return nil, fmt.Errorf("cluster: holding volume %q: %w", name, err)
	}
	return &Hold{m: m}, nil
}

// Close releases what the host holds and ends its session, waiting for
// etcd at most 5 s. A session already lost has nothing left to end.
func (h *Host) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.CloseContext(ctx)
}

// CloseContext is Close waiting for etcd until ctx ends.
func (h *Host) CloseContext(ctx context.Context) error {
	h.once.Do(func() { close(h.stop) })
	<-h.done
	return endSession(ctx, h.session(), h.lost, "the host's")
}

// Hold is a host's hold on one volume.
type Hold struct{ m *concurrency.Mutex }

// Token is a fencing token for this hold: the etcd revision at which it
// was taken. A later holder takes the lock only after this one's key is
// gone, at a later revision, so tokens grow with every new holder.
func (v *Hold) Token() uint64 { return uint64(v.m.Header().Revision) }

// Release lets the volume go.
func (v *Hold) Release(ctx context.Context) error { return v.m.Unlock(ctx) }
