// Package etcdembed runs a single-member etcd server inside a pd3 process:
// the control plane of `pd3 up` and `pd3 coord`, on loopback unless told
// otherwise. It is the only package that imports etcd's server.
package etcdembed
