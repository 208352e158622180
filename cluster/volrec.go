package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pd3-go/pd3/pageid"
)

// Errors of the volume records, for callers to branch on.
var (
	// ErrVolumeExists: a record of that name exists already.
	ErrVolumeExists = errors.New("cluster: volume exists")
	// ErrNoVolume: no record of that name.
	ErrNoVolume = errors.New("cluster: no such volume")
	// ErrRaced: the record changed under the caller (another operator's
	// command); nothing was done, and trying again sees the change.
	ErrRaced = errors.New("cluster: volume record changed meanwhile")
)

// Volume states: a record is "creating" between its reservation and the
// memory node's answer, "deleting" or "resizing" between the decision and
// the node's, "ready" otherwise. A command that died half-way leaves its
// state for the next one to see and finish (pd3 volume rm removes any;
// pd3 volume resize takes up a "resizing" one). No host takes a volume
// that is not ready.
const (
	VolumeCreating = "creating"
	VolumeReady    = "ready"
	VolumeDeleting = "deleting"
	VolumeResizing = "resizing"
)

// VolumeRecord is a volume as the control plane knows it,
// /pd3/NAME/volumes/VOLUME. Placement is one memory node for now.
type VolumeRecord struct {
	Name     string `json:"name"`
	ID       uint16 `json:"id"` // the node's id of the volume
	Size     uint64 `json:"size"`
	PageSize int    `json:"page_size"`
	Node     string `json:"node"`      // id of the memory node holding it ("" if it did not register)
	NodeAddr string `json:"node_addr"` // its address when the volume was placed
	State    string `json:"state"`
	Created  string `json:"created"` // RFC 3339
	// Stripes, for a replicated volume, places its extents over nodes
	// (Node and NodeAddr are then empty, and ID is the cluster's id of
	// the volume, not a node's).
	Stripes *Stripes `json:"stripes,omitempty"`
	// EC, for an erasure-coded volume, places its shards (Node and
	// NodeAddr are then empty, and ID is the cluster's id).
	EC *Coded `json:"ec,omitempty"`
	// Filesystem marks the placement of a filesystem's volumes: one
	// extent as large as a file may be, holding what its files hold,
	// so placing it weighs nothing up front.
	Filesystem bool `json:"filesystem,omitempty"`

	rev int64 // ModRevision the record was read at
}

// Nodes are the ids of the nodes a volume placed over many nodes lives
// on (replicated or erasure-coded), sorted; nil for a volume of one node.
func (rec *VolumeRecord) Nodes() []string {
	switch {
	case rec.Stripes != nil:
		return rec.Stripes.Nodes()
	case rec.EC != nil:
		return rec.EC.Nodes()
	}
	return nil
}

// NodeBytes is the size of the volume each node of the placement holds:
// the volume's own for replicas, the shards' address space for an
// erasure-coded volume.
func (rec *VolumeRecord) NodeBytes() uint64 {
	if rec.EC != nil {
		return rec.EC.NodeBytes()
	}
	return rec.Size
}

func volumeKey(cluster, name string) string { return prefix(cluster) + "volumes/" + name }

// ReserveVolume records rec as being created: it fails with
// ErrVolumeExists if the name is taken. The caller creates the volume at
// the node and calls VolumeCreated, or DropVolume on failure.
func ReserveVolume(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord) (VolumeRecord, error) {
	got, created, err := putIfAbsent(ctx, cli, cluster, rec, VolumeCreating)
	if err == nil && !created {
		return rec, fmt.Errorf("%w: %q", ErrVolumeExists, rec.Name)
	}
	return got, err
}

// VolumeCreated marks a reserved record ready with the id the node gave.
func VolumeCreated(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord, id uint16, size uint64) (VolumeRecord, error) {
	rec.ID, rec.Size, rec.State = id, size, VolumeReady
	return rec, update(ctx, cli, cluster, &rec)
}

// EnsureVolume records a volume a host found or created at its node, if
// no record of it exists (a host predating the records, or pd3 up's own
// volumes); an existing record is left as it is and returned.
func EnsureVolume(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord) (VolumeRecord, error) {
	got, _, err := putIfAbsent(ctx, cli, cluster, rec, VolumeReady)
	return got, err
}

// putIfAbsent records rec in state unless a record of its name exists,
// which it returns instead (created false).
func putIfAbsent(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord, state string) (VolumeRecord, bool, error) {
	rec.State = state
	rec.Created = time.Now().UTC().Format(time.RFC3339)
	key := volumeKey(cluster, rec.Name)
	b, _ := json.Marshal(rec)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(b))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return rec, false, fmt.Errorf("cluster: recording volume %q: %w", rec.Name, err)
	}
	if resp.Succeeded {
		rec.rev = resp.Header.Revision
		return rec, true, nil
	}
	got, err := decodeVolume(resp.Responses[0].GetResponseRange().Kvs[0])
	return got, false, err
}

// MarkDeleting moves a record to "deleting" unless a host holds the
// volume (pageid.ErrHeld): from then on no host may take it.
func MarkDeleting(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord) (VolumeRecord, error) {
	return markUnheld(ctx, cli, cluster, rec, VolumeDeleting, "removing")
}

// ErrNotReady: the volume is being created or removed, so it cannot be
// resized.
var ErrNotReady = errors.New("cluster: volume is not ready")

// MarkResizing moves a ready (or half-resized) record to "resizing"
// unless a host holds the volume (pageid.ErrHeld): a served volume keeps
// its size, since an NBD client learns the size once, when it connects.
// The caller grows the volume at the node and calls VolumeResized.
func MarkResizing(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord) (VolumeRecord, error) {
	if rec.State != VolumeReady && rec.State != VolumeResizing {
		return rec, fmt.Errorf("%w: %q is %s", ErrNotReady, rec.Name, rec.State)
	}
	return markUnheld(ctx, cli, cluster, rec, VolumeResizing, "resizing")
}

// VolumeResized marks a record ready at size, the node's answer.
func VolumeResized(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord, size uint64) (VolumeRecord, error) {
	rec.Size, rec.State = size, VolumeReady
	return rec, update(ctx, cli, cluster, &rec)
}

// markUnheld moves rec to state in a transaction that also finds no
// holder of the volume, so no host can take it between the check and the
// change.
func markUnheld(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord, state, doing string) (VolumeRecord, error) {
	rec.State = state
	key := volumeKey(cluster, rec.Name)
	b, _ := json.Marshal(rec)
	held := prefix(cluster) + "holders/" + rec.Name + "/"
	resp, err := cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(key), "=", rec.rev),
		clientv3.Compare(clientv3.CreateRevision(held), "=", 0).WithPrefix(),
	).Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return rec, fmt.Errorf("cluster: %s volume %q: %w", doing, rec.Name, err)
	}
	if !resp.Succeeded {
		if h, err := cli.Get(ctx, held, clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil && h.Count > 0 {
			return rec, fmt.Errorf("cluster: volume %q: %w; stop the host that serves it first", rec.Name, pageid.ErrHeld)
		}
		return rec, fmt.Errorf("%w: %q", ErrRaced, rec.Name)
	}
	rec.rev = resp.Header.Revision
	return rec, nil
}

// DropVolume removes the record, if it is still as the caller read it.
func DropVolume(ctx context.Context, cli *clientv3.Client, cluster string, rec VolumeRecord) error {
	key := volumeKey(cluster, rec.Name)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rec.rev)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return fmt.Errorf("cluster: removing the record of volume %q: %w", rec.Name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %q", ErrRaced, rec.Name)
	}
	return nil
}

// GetVolume returns the record of volume name (ErrNoVolume if none).
func GetVolume(ctx context.Context, cli *clientv3.Client, cluster, name string) (VolumeRecord, error) {
	resp, err := cli.Get(ctx, volumeKey(cluster, name))
	if err != nil {
		return VolumeRecord{}, fmt.Errorf("cluster: reading volume %q: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return VolumeRecord{}, fmt.Errorf("%w: %q", ErrNoVolume, name)
	}
	return decodeVolume(resp.Kvs[0])
}

// Volumes lists the cluster's volume records by name.
func Volumes(ctx context.Context, cli *clientv3.Client, cluster string) ([]VolumeRecord, error) {
	resp, err := cli.Get(ctx, prefix(cluster)+"volumes/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("cluster: listing volumes: %w", err)
	}
	out := make([]VolumeRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		rec, err := decodeVolume(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	slices.SortFunc(out, func(a, b VolumeRecord) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func update(ctx context.Context, cli *clientv3.Client, cluster string, rec *VolumeRecord) error {
	key := volumeKey(cluster, rec.Name)
	b, _ := json.Marshal(rec)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rec.rev)).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return fmt.Errorf("cluster: updating volume %q: %w", rec.Name, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %q", ErrRaced, rec.Name)
	}
	rec.rev = resp.Header.Revision
	return nil
}

func decodeVolume(kv *mvccpb.KeyValue) (VolumeRecord, error) {
	var rec VolumeRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return rec, fmt.Errorf("cluster: volume record %s: %w", kv.Key, err)
	}
	rec.rev = kv.ModRevision
	return rec, nil
}

// ErrNoNode: no memory node that is up has room for the volume.
var ErrNoNode = errors.New("cluster: no memory node up with room")

// Place chooses the node for a new volume of size: of two nodes drawn at
// random among those up with room, the one with more memory free (power
// of two choices: close to the emptiest node's balance without every
// creator piling onto the same node between two refreshes of the
// figures). pick(n) returns a random int in [0, n).
func Place(nodes []Node, size uint64, pick func(int) int) (Node, error) {
	free := func(n Node) uint64 {
		if n.Capacity == 0 {
			return ^uint64(0)
		}
		return n.Capacity - min(n.Capacity, n.Stored)
	}
	var fit []Node
	for _, n := range nodes {
		if n.Up && !n.Draining && free(n) >= size {
			fit = append(fit, n)
		}
	}
	if len(fit) == 0 {
		return Node{}, fmt.Errorf("%w: %d nodes known, none up with %d bytes free", ErrNoNode, len(nodes), size)
	}
	a, b := fit[pick(len(fit))], fit[pick(len(fit))]
	if free(b) > free(a) {
		return b, nil
	}
	return a, nil
}
