#!/usr/bin/env bash
# Small files on a pd3 mount: tar x of FILES files of 0-3 KB (100
# directories), then every file fsynced; prints the seconds each took,
# what the node stores for the filesystem (df) and the node's RSS, and
# checks the tree with diff -r. Run as root (mounts):
#   tools/small-files.sh                (FILES=10000)
#   PD3=/path/to/other/pd3 tools/small-files.sh
set -euo pipefail

PD3=${PD3:-./bin/pd3}
FILES=${FILES:-10000}
PORT=${PORT:-17173}

. "$(dirname "$0")/mount-lib.sh"
python3 - "$work/src" "$FILES" <<'PY'
import os, sys
src, files = sys.argv[1], int(sys.argv[2])
for i in range(files):
    d = f"{src}/tree/d{i % 100}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i}", "wb") as f:
        f.write(bytes([i % 251]) * (i * 37 % 3000))
PY
tar -C "$work/src" -cf "$work/tree.tar" tree
mount_pd3

s=$(date +%s.%N)
tar -C "$work/mnt" -xf "$work/tree.tar"
e=$(date +%s.%N)
python3 - "$work/mnt/tree" <<'PY'
import os, sys, time
t = time.perf_counter()
n = 0
for root, dirs, files in os.walk(sys.argv[1]):
    for name in files:
        fd = os.open(os.path.join(root, name), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        n += 1
print(f"fsync of {n} files: {time.perf_counter() - t:.2f}s")
PY
echo "tar x of $FILES files: $(echo "$e - $s" | bc)s"
echo "stored at the node (df): $(( $(df -B1 --output=used "$work/mnt" | tail -1) >> 20 )) MiB"
echo "memory node RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/"$node_pid"/status)"
diff -r "$work/src/tree" "$work/mnt/tree" && echo "diff -r: same"
