// Package cluster keeps pd3's cluster state in etcd, under one key prefix
// per cluster (/pd3/NAME/). Today that is membership: each memory node
// records itself once (id, address, capacity) and says it is alive with a
// second key bound to an etcd lease it keeps renewing, so a node whose
// process dies, or that is cut off from etcd, turns "down" when its lease
// runs out, without anyone having to notice.
//
// Keys (values are JSON):
//
//	/pd3/NAME/nodes/ID   NodeRecord: address, capacity; written at start
//	/pd3/NAME/alive/ID   Liveness: free memory; under the node's lease
//
// Only etcd v3 KV and lease calls are used, which etcd 3.4 (Debian's
// etcd-server) serves as well as the embedded 3.7 (package etcdembed).
package cluster
