// Package replica serves volumes striped and replicated over many memory
// nodes: a pagestore.Remote that cuts a volume's bytes into extents and
// keeps each extent at every node its stripe map (cluster.Stripes) lists.
//
// Reads go to one replica of the extent, the one with the fewest
// requests outstanding that has not failed lately, and fail over to the
// next when it errs or stays silent past the memory-node client's op
// timeout: the caller sees an error only when every replica failed.
//
// Writes (write-backs, FLUSH, TRIM) go to every replica of the extent and
// return once all of them hold the data, or once every replica that did
// not has been dropped from the stripe map (Dropper, the control plane):
// a replica that missed a write is never read again, so a node that comes
// back from a partition with old bytes cannot serve them. A write no
// replica took fails, as it would with one node.
//
// Repair copies an extent that lost a replica to another node: the node
// joins the extent (takes its writes, is not read), each chunk is copied
// from a replica under the extent's lock, which orders the copy against
// the writes in flight, and the node is then promoted to a replica.
//
// A Group is volumes that share one map of one extent and one record in
// the control plane (a filesystem's metadata and files): they are made
// and freed at the group's nodes without a change of the record, and a
// failure, repair or move changes the record once for all of them.
//
// The host is the only writer of a volume (it holds it in the control
// plane), so the map changes only through it.
package replica
