// Package cluster keeps pd3's cluster state in etcd, under one key prefix
// per cluster (/pd3/NAME/): membership, volume records and the hosts'
// holds on volumes. Each memory node records itself once (id, address,
// capacity) and says it is alive with a second key bound to an etcd lease
// it keeps renewing, so a node whose process dies, or that is cut off
// from etcd, turns "down" when its lease runs out, without anyone having
// to notice. A volume's record names its node (Place: power of two
// choices by free memory) and changes only by transactions that compare
// the revision the caller read (ErrRaced otherwise), so two operators
// never both create, or remove, the same volume; removal also compares
// that nobody holds the volume, in the same transaction.
//
// Keys (values are JSON):
//
//	/pd3/NAME/nodes/ID   NodeRecord: address, capacity; written at start
//	/pd3/NAME/alive/ID   Liveness: free memory; under the node's lease, put
//	                     when it changes (and every 12th refresh)
//	/pd3/NAME/volumes/V  VolumeRecord: node, id, size, state
//	/pd3/NAME/hosts/L    HostInfo of the host whose session is lease L
//	/pd3/NAME/holders/V/L  etcd mutex keys: the host of lease L holds V
//
// Only etcd v3 KV and lease calls are used, which etcd 3.4 (Debian's
// etcd-server) serves as well as the embedded 3.7 (package etcdembed).
package cluster
