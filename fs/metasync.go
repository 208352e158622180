package fs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// Making the mount durable: Sync, and the metadata behind it, written as
// journal records of what changed or as a whole snapshot, by Sync and
// by the periodic sync loop.

// Sync makes everything written so far durable at the memory node: dirty
// pages, then the metadata that refers to them.
func (f *FS) Sync(ctx context.Context) error {
	if err := f.cfg.Store.Flush(ctx); err != nil {
		return fmt.Errorf("fs: writing back data: %w", err)
	}
	return f.syncMeta(ctx, false)
}

// syncMeta makes the metadata volume hold every change so far: a
// journal record of what changed since the last one, or (compact, or
// when no journal can be trusted) a whole snapshot.
func (f *FS) syncMeta(ctx context.Context, compact bool) error {
	if f.fenced.Load() {
		return fmt.Errorf("fs: %w: not writing metadata", ErrMounted)
	}
	f.syncMu.Lock()
	defer f.syncMu.Unlock()
	f.mu.Lock()
	switch {
	case f.changes == f.saved && !compact:
		f.mu.Unlock()
		return nil
	case compact || f.snapshotDue:
		f.mu.Unlock()
		return f.saveSnapshot(ctx)
	}
	at := f.changes
	rec, err := json.Marshal(f.takeRecordLocked())
	f.mu.Unlock()
	if err != nil {
		return fmt.Errorf("fs: encoding a journal record: %w", err)
	}
	switch err := f.meta.appendRecord(ctx, rec); {
	case err == nil:
		f.mu.Lock()
		f.saved = max(f.saved, at)
		f.mu.Unlock()
		return nil
	case errors.Is(err, errJournalFull):
		return f.saveSnapshot(ctx)
	default:
		// The record may be lost: only a snapshot covers it now.
		f.mu.Lock()
		f.snapshotDue = true
		f.mu.Unlock()
		return err
	}
}

// saveSnapshot writes the whole tree (syncMu held). It holds every change
// up to the moment it starts; what changes after that goes into the next
// record, which replays the same whether or not the snapshot caught it.
func (f *FS) saveSnapshot(ctx context.Context) error {
	f.mu.Lock()
	at := f.changes
	clear(f.dirty)
	clear(f.dents)
	f.snapshotDue = true // until the snapshot is written
	f.mu.Unlock()
	f.mu.RLock()
	snap := snapshot{Version: snapshotVersion, NextIno: f.nextIno, Inodes: make([]*inode, 0, len(f.inodes))}
	for _, n := range f.inodes {
		if n.Nlink > 0 {
			snap.Inodes = append(snap.Inodes, n)
		}
	}
	var buf bytes.Buffer
	err := json.NewEncoder(&buf).Encode(&snap)
	f.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("fs: encoding metadata: %w", err)
	}
	if err := f.meta.save(ctx, buf.Bytes()); err != nil {
		return err
	}
	f.mu.Lock()
	f.snapshotDue = false
	f.saved = max(f.saved, at)
	f.mu.Unlock()
	return nil
}

// dentKey names a directory entry that changed.
type dentKey struct {
	dir  uint64
	name string
}

// changedLocked notes that inodes changed (f.mu held for writing).
func (f *FS) changedLocked(ns ...*inode) {
	f.changes++
	for _, n := range ns {
		f.dirty[n.Ino] = struct{}{}
	}
}

// setEntryLocked makes name in directory d name inode ino (0: removes
// it), f.mu held for writing.
func (f *FS) setEntryLocked(d *inode, name string, ino uint64) {
	if ino == 0 {
		delete(d.Entries, name)
	} else {
		d.Entries[name] = ino
	}
	f.dents[dentKey{d.Ino, name}] = struct{}{}
	d.listVer++
}

// takeRecordLocked returns what changed since the last record, as it is
// now, and starts the next (f.mu held for writing).
func (f *FS) takeRecordLocked() *record {
	r := &record{NextIno: f.nextIno}
	for ino := range f.dirty {
		if n := f.inodes[ino]; n != nil && n.Nlink > 0 {
			r.Inodes = append(r.Inodes, n.attrs)
		} else {
			r.Freed = append(r.Freed, ino)
		}
	}
	for k := range f.dents {
		// A directory that is gone is in Freed, with its entries.
		if d := f.inodes[k.dir]; d != nil && d.Nlink > 0 {
			r.Entries = append(r.Entries, dentry{Dir: k.dir, Name: k.name, Ino: d.Entries[k.name]})
		}
	}
	clear(f.dirty)
	clear(f.dents)
	return r
}

// syncLoop renews the lease (every third of its TTL) and saves changed
// metadata every SyncInterval. A lost lease fences the filesystem: it
// writes no more metadata and refuses changes.
func (f *FS) syncLoop() {
	defer close(f.done)
	tick := f.cfg.LeaseTTL / 3
	if f.cfg.SyncInterval > 0 {
		tick = min(tick, f.cfg.SyncInterval)
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	var lastSync, lastRenew time.Time
	for {
		select {
		case <-f.stop:
			return
		case now := <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if f.cfg.Fencing == nil && !f.fenced.Load() && now.Sub(lastRenew) >= f.cfg.LeaseTTL/3 {
				err := f.lease.Renew(ctx)
				if errors.Is(err, pageid.ErrClosed) {
					cancel()
					return // the host is going away without Close
				}
				if errors.Is(err, pageid.ErrHeld) {
					f.fenced.Store(true)
					f.cfg.Log.Error("fs: another host took the filesystem over; refusing further changes", "err", err)
				} else if err != nil {
					f.cfg.Log.Warn("fs: lease renewal", "err", err)
				} else {
					lastRenew = now
				}
			}
			if f.cfg.SyncInterval > 0 && now.Sub(lastSync) >= f.cfg.SyncInterval {
				if err := f.syncMeta(ctx, false); err != nil {
					f.cfg.Log.Warn("fs: background metadata sync", "err", err)
				}
				lastSync = now
			}
			if !f.fenced.Load() && f.meta.compactDue() {
				if err := f.syncMeta(ctx, true); err != nil {
					f.cfg.Log.Warn("fs: folding the metadata journal into a snapshot", "err", err)
				}
			}
			cancel()
		}
	}
}
