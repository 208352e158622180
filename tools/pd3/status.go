package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// clusterStatus is what pd3 cluster status shows: the nodes as etcd
// records them and as they answer now, and one row per volume.
type clusterStatus struct {
	Cluster string       `json:"cluster"`
	Nodes   []nodeStatus `json:"nodes"`
	// Volumes has one row per volume, however many nodes hold it.
	Volumes []volumeStatus `json:"volumes"`
	Files   fsVolumes      `json:"filesystem_volumes"`
	// Bookkeeping is the memory of pd3's own volumes (pd3.leases and
	// pd3.epochs: the volume leases and fencing epochs hosts keep at a
	// node), so that the nodes' IN USE adds up.
	Bookkeeping uint64          `json:"bookkeeping_stored"`
	Replicated  []replicaStatus `json:"replicated"`
	Coded       []codedStatus   `json:"erasure_coded"`
}

// nodeStatus is a node as etcd records it, and whether it answered now:
// a node SIGKILLed a moment ago is still up in etcd until its lease runs
// out, but it does not answer.
type nodeStatus struct {
	cluster.Node
	// State is up, unreachable (up in etcd, but it did not answer) or
	// down; ",draining" is added while it is drained.
	State string `json:"state"`
	Error string `json:"error,omitempty"` // why it did not answer
}

// live says whether the node holds what it stores for clients now.
func (n nodeStatus) live() bool { return n.Up && n.Error == "" }

// volumeStatus is one volume: its size, the memory its copies hold at
// the nodes, where it lives and the host that holds it.
type volumeStatus struct {
	Name      string            `json:"name"`
	Size      uint64            `json:"size"`
	Stored    uint64            `json:"stored"`    // at every node, all copies
	Placement string            `json:"placement"` // a node's id, or "R=2 over 3 nodes"
	Nodes     []string          `json:"nodes"`
	Holder    *cluster.HostInfo `json:"holder,omitempty"`
}

// fsVolumes sums up the volumes that hold pd3 filesystems (one per file,
// and their metadata): a listing of them would drown the rest.
type fsVolumes struct {
	Count  int    `json:"count"`
	Stored uint64 `json:"stored"`
}

// replicaStatus is a replicated volume's health: its extents with fewer
// live replicas than wanted (on nodes dropped, down or not answering),
// and with none.
type replicaStatus struct {
	Name     string `json:"name"`
	Size     uint64 `json:"size"`
	Extents  int    `json:"extents"`
	Replicas int    `json:"replicas"`
	Degraded int    `json:"degraded"`
	Lost     int    `json:"lost"`
	Epoch    uint64 `json:"epoch"`
	Copying  int    `json:"copying"` // extents a repair is copying now
	Health   string `json:"health"`  // healthy, degraded or lost
}

// codedStatus is an erasure-coded volume's health: its groups with a
// shard lost, dropped or on a node down (read by decoding), and with more
// than M (pages that cannot be read).
type codedStatus struct {
	Name     string `json:"name"`
	Size     uint64 `json:"size"`
	Scheme   string `json:"scheme"`
	Groups   int    `json:"groups"`
	Degraded int    `json:"degraded"`
	Lost     int    `json:"lost"`
	Epoch    uint64 `json:"epoch"`
	Health   string `json:"health"` // healthy, degraded or lost
}

func codedHealth(r cluster.VolumeRecord, live map[string]bool) codedStatus {
	p := r.EC
	st := codedStatus{Name: r.Name, Size: r.Size, Scheme: p.Scheme.String(), Groups: len(p.Groups), Epoch: p.Epoch}
	for g, row := range p.Groups {
		n := 0
		for s, id := range row {
			if !p.Virtual(g, s) && !live[id] {
				n++
			}
		}
		if n > 0 {
			st.Degraded++
		}
		if n > p.M {
			st.Lost++
		}
	}
	st.Health = health(st.Degraded, st.Lost)
	return st
}

// health words a volume's counts of degraded and lost extents or groups.
func health(degraded, lost int) string {
	switch {
	case lost > 0:
		return "lost"
	case degraded > 0:
		return "degraded"
	}
	return "healthy"
}

// statusOf asks every node etcd says is up for its volumes (at once, so a
// dead node costs one dial timeout, not one each) and puts the answers
// together with the records.
func statusOf(ctx context.Context, name string, nodes []cluster.Node, recs []cluster.VolumeRecord, holders map[string]cluster.HostInfo, token string) *clusterStatus {
	st := &clusterStatus{Cluster: name, Nodes: make([]nodeStatus, len(nodes))}
	lists := make([][]pageid.VolumeInfo, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		st.Nodes[i] = nodeStatus{Node: n, State: n.State()}
		if !n.Up {
			continue
		}
		wg.Go(func() {
			vs, err := listNode(ctx, n.Addr, token)
			if err != nil {
				st.Nodes[i].State, st.Nodes[i].Error = "unreachable", err.Error()
				return
			}
			// The node's own answer, not the figure it last put in etcd
			// (renewed every few seconds): a write just made shows.
			var stored uint64
			for _, v := range vs {
				stored += v.Stored
			}
			st.Nodes[i].Stored = stored
			lists[i] = vs
		})
	}
	wg.Wait()
	for i := range st.Nodes {
		if st.Nodes[i].Draining {
			st.Nodes[i].State += ",draining"
		}
	}

	// One row per volume: its record, and what each node holds of it.
	type held struct {
		size, stored uint64
		nodes        []string
	}
	at := map[string]*held{}
	fsNames := map[string]bool{}
	for i, vs := range lists {
		for _, v := range vs {
			switch {
			case strings.HasPrefix(v.Name, "pd3."): // pd3's own bookkeeping
				st.Bookkeeping += v.Stored
				continue
			case strings.HasPrefix(v.Name, "fs."):
				fsNames[v.Name] = true
				st.Files.Stored += v.Stored
				continue
			}
			h := at[v.Name]
			if h == nil {
				h = &held{}
				at[v.Name] = h
			}
			h.size = max(h.size, v.Size)
			h.stored += v.Stored
			h.nodes = append(h.nodes, st.Nodes[i].ID)
		}
	}
	st.Files.Count = len(fsNames)
	live := map[string]bool{}
	for _, n := range st.Nodes {
		live[n.ID] = n.live()
	}
	for _, r := range recs {
		if r.Filesystem {
			st.Replicated = append(st.Replicated, replicaHealth(r, live))
			continue
		}
		row := volumeStatus{Name: r.Name, Size: r.Size, Placement: r.Node, Nodes: []string{r.Node}}
		if r.Stripes != nil {
			row.Nodes = r.Stripes.Nodes()
			row.Placement = fmt.Sprintf("R=%d over %s", r.Stripes.Replicas, units.Count(len(row.Nodes), "node", ""))
			st.Replicated = append(st.Replicated, replicaHealth(r, live))
		}
		if r.EC != nil {
			row.Nodes = r.EC.Nodes()
			row.Placement = fmt.Sprintf("EC %s over %s", r.EC.Scheme, units.Count(len(row.Nodes), "node", ""))
			st.Coded = append(st.Coded, codedHealth(r, live))
		}
		if h := at[r.Name]; h != nil {
			row.Stored = h.stored
			delete(at, r.Name)
		}
		st.Volumes = append(st.Volumes, row)
	}
	for name, h := range at { // at a node, without a record (made without etcd)
		st.Volumes = append(st.Volumes, volumeStatus{Name: name, Size: h.size, Stored: h.stored, Placement: strings.Join(h.nodes, ","), Nodes: h.nodes})
	}
	for i := range st.Volumes {
		if h, ok := holders[st.Volumes[i].Name]; ok {
			st.Volumes[i].Holder = &h
		}
	}
	slices.SortFunc(st.Volumes, func(a, b volumeStatus) int { return strings.Compare(a.Name, b.Name) })
	return st
}

// listNode asks the node at addr for its volumes, within a second or two:
// a node that does not answer is what the caller reports.
func listNode(ctx context.Context, addr, token string) ([]pageid.VolumeInfo, error) {
	c, err := memnode.Dial(ctx, addr, memnode.ClientOptions{Token: token, DialTimeout: time.Second, OpTimeout: 2 * time.Second})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.List(ctx)
}

// replicaHealth counts the extents of r with fewer live replicas than
// wanted, and with none.
func replicaHealth(r cluster.VolumeRecord, live map[string]bool) replicaStatus {
	s := r.Stripes
	st := replicaStatus{Name: r.Name, Size: r.Size, Extents: len(s.Extents), Replicas: s.Replicas, Epoch: s.Epoch, Copying: s.Repairing()}
	for _, e := range s.Extents {
		n := 0
		for _, id := range e {
			if live[id] {
				n++
			}
		}
		if n < s.Replicas {
			st.Degraded++
		}
		if n == 0 {
			st.Lost++
		}
	}
	st.Health = health(st.Degraded, st.Lost)
	return st
}

// bar draws how much of the volume has all its replicas: the repair's
// progress, extent by extent.
func (r replicaStatus) bar(width int) string {
	whole := r.Extents - r.Degraded
	n := width * whole / max(1, r.Extents)
	return fmt.Sprintf("[%s%s] %d/%d extents with %d replicas, %d being copied", strings.Repeat("#", n), strings.Repeat(".", width-n),
		whole, r.Extents, r.Replicas, r.Copying)
}

func (st *clusterStatus) print(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "cluster %s: %s\n", st.Cluster, units.Count(len(st.Nodes), "memory node", ""))
	fmt.Fprintln(w, "NODE\tSTATE\tADDRESS\tCAPACITY\tIN USE\tSTARTED")
	for _, n := range st.Nodes {
		capacity, used := "unlimited", "-"
		if n.Capacity > 0 {
			capacity = units.FormatSize(n.Capacity)
		}
		if n.live() {
			used = units.FormatSize(n.Stored)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.State, n.Addr, capacity, used, n.Started)
	}
	for _, n := range st.Nodes {
		if n.Error != "" {
			fmt.Fprintf(w, "(node %s is up in etcd but did not answer: %s; etcd marks it down once its lease runs out)\n", n.ID, n.Error)
		}
	}
	fmt.Fprintf(w, "\n%s\n", units.Count(len(st.Volumes), "volume", ""))
	fmt.Fprintln(w, "VOLUME\tSIZE\tSTORED\tPLACEMENT\tHOLDER")
	for _, v := range st.Volumes {
		holder := "-"
		if v.Holder != nil {
			holder = v.Holder.String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", v.Name, units.FormatSize(v.Size), units.FormatSize(v.Stored), v.Placement, holder)
	}
	if st.Files.Count > 0 {
		fmt.Fprintf(w, "and %s (the files and metadata of pd3 mounts), %s stored\n", units.Count(st.Files.Count, "filesystem volume", ""), units.FormatSize(st.Files.Stored))
	}
	if st.Bookkeeping > 0 {
		fmt.Fprintf(w, "and pd3's own records (pd3.* volumes), %s stored\n", units.FormatSize(st.Bookkeeping))
	}
	if len(st.Replicated) > 0 {
		fmt.Fprintf(w, "\nreplication\n")
		fmt.Fprintln(w, "VOLUME\tSIZE\tEXTENTS\tREPLICAS\tDEGRADED\tLOST\tEPOCH\tHEALTH")
		for _, r := range st.Replicated {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Name, units.FormatSize(r.Size), r.Extents, r.Replicas, r.Degraded, r.Lost, r.Epoch, r.Health)
		}
		for _, r := range st.Replicated {
			if r.Health != "healthy" {
				fmt.Fprintf(w, "%s: %s\n", r.Name, r.bar(30))
			}
		}
	}
	if len(st.Coded) > 0 {
		fmt.Fprintf(w, "\nerasure coding\n")
		fmt.Fprintln(w, "VOLUME\tSIZE\tCODE\tGROUPS\tDEGRADED\tLOST\tEPOCH\tHEALTH")
		for _, c := range st.Coded {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", c.Name, units.FormatSize(c.Size), c.Scheme, c.Groups, c.Degraded, c.Lost, c.Epoch, c.Health)
		}
	}
	return w.Flush()
}
