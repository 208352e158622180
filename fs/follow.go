package fs

import gofs "github.com/hanwen/go-fuse/v2/fs"

// FollowFrom is the size from which the kernel page cache of a file is
// followed for Host View: the mount reads up to 1 MiB ahead per READ
// (docs/decisions.md, 34), so the kernel's first reads of a smaller file
// bring in all of it and leave a prefetcher nothing to do, while
// following its pages cost a tree of small files more than the agent
// saves anywhere (docs/decisions.md, 44).
const FollowFrom = 1 << 20

// A Follower follows the kernel page cache of the files it is given, by
// inode number (pagecache.Tracker, started by StartFollowing).
type Follower interface {
	Follow(ino uint64) error
	Unfollow(ino uint64)
}

// SetFollower gives the mount the follower of its files' page cache: a
// regular file is followed from the first open, or the first write,
// truncation or allocation that finds it at FollowFrom bytes or more,
// until the kernel forgets it. Set once, after Mount (the tracker needs
// the mount's device); a file open before then is followed from its next
// open.
func (f *FS) SetFollower(fl Follower) {
	f.mu.Lock()
	f.follower = fl
	f.mu.Unlock()
}

// unlockFollowing releases f.mu, held for writing by a change that may
// have brought file c to FollowFrom bytes, and then has c followed if it
// is to be from now on (the follower's map update is a syscall, made
// outside the lock). A follower that cannot follow more files leaves c
// unfollowed: Host View then lacks its pages, which costs a redundant
// prefetch at worst; c is not offered again.
func (f *FS) unlockFollowing(c *inode) {
	fl := f.follower
	if fl == nil || c.followed || c.Size < FollowFrom || !c.isReg() {
		f.mu.Unlock()
		return
	}
	c.followed = true
	ino := c.Ino
	f.mu.Unlock()
	if err := fl.Follow(ino); err != nil {
		f.cfg.Log.Debug("page cache of a file not followed", "ino", ino, "err", err)
	}
}

var _ gofs.NodeOnForgetter = (*node)(nil)

// OnForget ends the following of a file the kernel forgot: it dropped
// the file's pages, and reported them, before it sent FORGET. If the
// file is looked up again, its next open follows it again.
func (n *node) OnForget() {
	f := n.f
	f.mu.Lock()
	fl := f.follower
	if c := f.inodes[n.ino]; c != nil {
		c.followed = false
	}
	f.mu.Unlock()
	if fl != nil {
		fl.Unfollow(n.ino)
	}
}
