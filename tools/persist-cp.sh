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

. "$(dirname "$0")/mount-lib.sh"
mkdir -p "$work/src"
per=$(( (FILES + 19) / 20 ))
for d in $(seq 1 20); do
  mkdir "$work/src/d$d"
  for f in $(seq 1 "$per"); do head -c 2000 /dev/urandom >"$work/src/d$d/f$f"; done
done

# one MODE (volatile|persist): prints the seconds cp -r took
one() {
  local args=()
  if [ "$1" = persist ]; then rm -rf "$work/node"; args=(--persist "$work/node"); fi
  mount_pd3 "${args[@]}"
  local s e
  s=$(date +%s.%N)
  cp -r "$work/src" "$work/mnt/run"
  sync -f "$work/mnt/run"
  e=$(date +%s.%N)
  unmount_pd3
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
