package host

import (
	"context"
	"fmt"

	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// startLocal is Start for Config.Local: the volumes in host memory
// (pagestore.MemRemote) behind a cache as large as all of them, filled with
// the benchmarks' pattern, and the frontends; no memory node, no lease.
func startLocal(ctx context.Context, cfg Config) (*Host, error) {
	var total uint64
	for _, vs := range cfg.Volumes {
		total += (vs.Size + pageid.Size - 1) &^ (pageid.Size - 1)
	}
	st, err := pagestore.New(pagestore.NewMemRemote(), pagestore.Options{CacheBytes: int64(total) + 16*pageid.Size, Policy: cfg.Policy})
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h := &Host{Store: st, busy: new(sockio.Busy), done: make(chan error, 1)}
	for i, vs := range cfg.Volumes {
		v := pageid.VolumeInfo{ID: uint16(i + 1), Name: vs.Name, Size: (vs.Size + pageid.Size - 1) &^ (pageid.Size - 1)}
		st.AddVolume(v)
		h.Volumes = append(h.Volumes, v)
	}
	if err := fillVolumes(ctx, st, h.Volumes); err != nil {
		return nil, fmt.Errorf("host: filling the local volumes: %w", err)
	}
	if err := h.serve(ctx, cfg); err != nil {
		h.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return h, nil
}

// fillVolumes writes the benchmarks' pattern (workload.FillPage) into
// every page of vols, so their readers can check each page they get.
func fillVolumes(ctx context.Context, st *pagestore.Store, vols []pageid.VolumeInfo) error {
	p := make([]byte, pageid.Size)
	for _, v := range vols {
		for pg := range v.Size / pageid.Size {
			k := pageid.MakeKey(v.ID, pg)
			workload.FillPage(k, p)
			if err := st.Put(ctx, k, p); err != nil {
				return err
			}
		}
	}
	return nil
}
