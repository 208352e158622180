// Package remotetest checks a pagestore.Remote against the contract in
// pagestore/api.go: what the Store relies on from every Remote, and from
// each optional capability the Remote offers. Every Remote in pd3 runs it
// (the table is dpu's TestRemoteConformance); a new Remote, such as a
// replicated one, joins that table.
package remotetest
