package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// ErrHeld is returned when another host holds a volume and did not let it
// go within the wait.
var ErrHeld = errors.New("cluster: volume held by another host")

// Host is a host's presence in the control plane: one etcd session (a
// lease the host keeps renewing) under which it holds its volumes.
type Host struct {
	cli  *clientv3.Client
	sess *concurrency.Session
	pfx  string
}

// NewHost opens a session of ttl for a host of cluster name; cli stays the
// caller's.
func NewHost(cli *clientv3.Client, name string, ttl time.Duration) (*Host, error) {
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(max(1, int(ttl.Round(time.Second)/time.Second))))
	if err != nil {
		return nil, fmt.Errorf("cluster: host session: %w", err)
	}
	return &Host{cli: cli, sess: sess, pfx: prefix(name)}, nil
}

// Lost is closed when the host's session expired: etcd did not hear from
// it for a TTL, and another host may hold its volumes by now.
func (h *Host) Lost() <-chan struct{} { return h.sess.Done() }

// Hold takes volume name for this host alone (an etcd mutex under the
// host's session, /pd3/NAME/holders/VOLUME/), waiting up to wait for a
// holder to release it or for a crashed holder's session to expire.
func (h *Host) Hold(ctx context.Context, name string, wait time.Duration) (*Hold, error) {
	m := concurrency.NewMutex(h.sess, h.pfx+"holders/"+name+"/")
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := m.Lock(lctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("%w: %q (waited %v)", ErrHeld, name, wait)
		}
		return nil, fmt.Errorf("cluster: holding volume %q: %w", name, err)
	}
	return &Hold{m: m}, nil
}

// Close releases what the host holds and ends its session.
func (h *Host) Close() error { return h.sess.Close() }

// Hold is a host's hold on one volume.
type Hold struct{ m *concurrency.Mutex }

// Release lets the volume go.
func (v *Hold) Release(ctx context.Context) error { return v.m.Unlock(ctx) }
