// Package fio ships pd3's fio job files. They read NBD_URI, RUNTIME, RAMP
// and SIZE from the environment, so users can rerun them against any NBD
// URI (or, with --ioengine and --filename, a mounted file); pd3 bench nbd
// runs them against pd3 and its baselines.
package fio

import "embed"

// Jobs holds the *.fio files of this directory.
//
//go:embed *.fio
var Jobs embed.FS
