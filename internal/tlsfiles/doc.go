// Package tlsfiles turns PEM files named on the command line into TLS
// configurations for pd3's links, and makes throwaway certificate
// authorities for tests and benchmarks. Loading happens once, at start-up:
// a missing or unreadable file is an error that names it.
package tlsfiles
