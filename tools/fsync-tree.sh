#!/usr/bin/env bash
# What a metadata-changing fsync costs on a big tree: a pd3 mount holds
# FILES empty files (100 directories); then ROUNDS times a file is
# created and fsynced, one after the other. Prints the microseconds per
# create+fsync. With snapshots alone each fsync wrote the whole tree;
# with the journal, one record of what changed. Run as root (mounts):
#   tools/fsync-tree.sh                 (FILES=10000 ROUNDS=500)
#   PD3=/path/to/other/pd3 tools/fsync-tree.sh
set -euo pipefail

PD3=${PD3:-./bin/pd3}
FILES=${FILES:-10000}
ROUNDS=${ROUNDS:-500}
PORT=${PORT:-17172}

. "$(dirname "$0")/mount-lib.sh"
mount_pd3

python3 - "$work/mnt" "$FILES" "$ROUNDS" <<'PY'
import os, sys, time
mnt, files, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(100):
    os.mkdir(f"{mnt}/d{d}")
for i in range(files):
    os.close(os.open(f"{mnt}/d{i % 100}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
fd = os.open(mnt, os.O_RDONLY)
os.fsync(fd)
os.close(fd)
os.mkdir(f"{mnt}/new")
t = time.perf_counter()
for i in range(rounds):
    fd = os.open(f"{mnt}/new/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.fsync(fd)
    os.close(fd)
dt = time.perf_counter() - t
print(f"tree of {files} files: {rounds} create+fsync in {dt:.2f}s, {dt / rounds * 1e6:.0f} us each")
PY
