#!/usr/bin/env bash
# What --persist costs a filesystem's metadata: cp -r of a tree of FILES
# small files (20 directories) onto a pd3 mount, with a volatile memory
# node and with a persistent one, ROUNDS times each, alternating; prints
# each time and the ratio of the medians. Run as root (mounts):
#   tools/persist-cp.sh            (FILES=1000 ROUNDS=3)
set -euo pipefail

PD3=${PD3:-./bin/pd3}
FILES=${FILES:-1000}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-17171}

[ "$(id -u)" = 0 ] || { echo "persist-cp: run as root (FUSE mounts)"; exit 1; }
work=$(mktemp -d /tmp/pd3-persist-cp-XXXXXX)
node_pid= host_pid=
cleanup() {
  [ -n "$host_pid" ] && kill "$host_pid" 2>/dev/null && wait "$host_pid" 2>/dev/null || true
  [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null || true
  mountpoint -q "$work/mnt" && umount -l "$work/mnt" || true
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/src" "$work/mnt"
per=$(( (FILES + 19) / 20 ))
for d in $(seq 1 20); do
  mkdir "$work/src/d$d"
  for f in $(seq 1 "$per"); do head -c 2000 /dev/urandom >"$work/src/d$d/f$f"; done
done

# one MODE (volatile|persist): prints the seconds cp -r took
one() {
  local args=()
  if [ "$1" = persist ]; then rm -rf "$work/node"; args=(--persist "$work/node"); fi
  "$PD3" memnode --listen 127.0.0.1:"$PORT" "${args[@]}" >"$work/node.log" 2>&1 & node_pid=$!
  for _ in $(seq 1 100); do grep -q "listening" "$work/node.log" && break; sleep 0.1; done
  "$PD3" serve --memnode 127.0.0.1:"$PORT" --mount "$work/mnt" --nbd "" --page "" --volume disk0:4MiB >"$work/host.log" 2>&1 & host_pid=$!
  for _ in $(seq 1 300); do grep -q "mounted at" "$work/host.log" && break; sleep 0.1; done
  local s e
  s=$(date +%s.%N)
  cp -r "$work/src" "$work/mnt/run"
  sync -f "$work/mnt/run"
  e=$(date +%s.%N)
  kill "$host_pid"; wait "$host_pid" || true; host_pid=
  kill "$node_pid"; wait "$node_pid" || true; node_pid=
  echo "$e - $s" | bc
}

vol=() per_=()
for r in $(seq 1 "$ROUNDS"); do
  v=$(one volatile); p=$(one persist)
  echo "round $r: volatile ${v}s, persist ${p}s"
  vol+=("$v"); per_+=("$p")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mv=$(median "${vol[@]}"); mp=$(median "${per_[@]}")
echo "cp -r of $FILES files: volatile ${mv}s, persist ${mp}s, persist/volatile $(echo "scale=2; $mp / $mv" | bc)"
