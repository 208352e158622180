//go:build !race

package memnode

const raceEnabled = false
