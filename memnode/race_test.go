//go:build race

package memnode

// raceEnabled: the race detector slows the crash-point test tenfold, so
// its bounded form explores fewer points (-crashpoints runs more).
const raceEnabled = true
