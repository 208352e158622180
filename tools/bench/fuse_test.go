package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFUSEJobNames(t *testing.T) {
	for _, tc := range []struct {
		job  string
		want []string // nil: a dbench or files job
		err  string
	}{
		{job: "randread-psync-1-direct", want: []string{"--ioengine=psync", "--iodepth=1", "--rw=randread", "--bs=4k", "--direct=1"}},
		{job: "randread-psync-1-direct-4", want: []string{"--ioengine=psync", "--iodepth=1", "--rw=randread", "--bs=4k", "--direct=1", "--numjobs=4", "--group_reporting"}},
		{job: "seqwrite1m-psync-1-buffered", want: []string{"--ioengine=psync", "--iodepth=1", "--rw=write", "--bs=1M", "--end_fsync=1", "--direct=0"}},
		{job: "seqwrite4k-psync-1-buffered", want: []string{"--ioengine=psync", "--iodepth=1", "--rw=write", "--bs=4k", "--end_fsync=1", "--direct=0"}},
		{job: "commit4k-psync-1-buffered", want: []string{"--ioengine=psync", "--iodepth=1", "--rw=randwrite", "--bs=4k", "--fsync=1", "--direct=0"}},
		{job: "dbench-2"},
		{job: "files-rename"},
		{job: "files-chmod", err: "files-OP"},
		{job: "dbench-x", err: "dbench-CLIENTS"},
		{job: "randread-psync-1", err: "want pattern"},
		{job: "scan-psync-1-direct", err: "bad FUSE job pattern"},
		{job: "randread-psync-1-sideways", err: "bad FUSE job mode"},
		{job: "randread-psync-1-direct-0", err: "thread count"},
	} {
		t.Run(tc.job, func(t *testing.T) {
			got, err := fuseJobArgs(tc.job)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	for _, job := range FUSEJobs {
		_, err := fuseJobArgs(job)
		assert.NoError(t, err, "default job %s", job)
	}
}

// Every files-OP job runs on a plain directory and counts its files.
func TestFileOps(t *testing.T) {
	for _, op := range fileOps {
		r, err := runFileOps(t.TempDir()+"/files", op)
		require.NoError(t, err, op)
		assert.Equal(t, uint64(fileOpsCount), r.Ops, op)
		assert.Positive(t, r.OpsPerSec, op)
	}
}
