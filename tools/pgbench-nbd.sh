#!/usr/bin/env bash
# PostgreSQL over pd3: its data directory on ext4 on a loop device over
# nbdfuse over pd3's NBD export, pgbench for a fixed time; then the same on
# local disk; prints both TPS and the ratio, and checks every index with
# amcheck. Run as root:   make pgbench-nbd   (PGBENCH_SECONDS=60 for longer)
set -euo pipefail
shopt -s inherit_errexit # errors inside $(run_pg ...) must stop the script

SECONDS_RUN=${PGBENCH_SECONDS:-30}
SCALE=${PGBENCH_SCALE:-10}
CLIENTS=${PGBENCH_CLIENTS:-4}
PD3=${PD3:-./bin/pd3}
PORT_NBD=${PORT_NBD:-10899}
PORT_PG=${PORT_PG:-5499}

[ "$(id -u)" = 0 ] || { echo "pgbench-nbd: run as root (loop devices, mounts, running postgres as its user)"; exit 1; }
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$PGBIN" ] || ! command -v pgbench >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
for t in nbdfuse losetup mkfs.ext4 fusermount3; do
  command -v $t >/dev/null || { echo "pgbench-nbd: $t missing: make deps-system"; exit 1; }
done
[ -x "$PD3" ] || { echo "pgbench-nbd: $PD3 missing: make build"; exit 1; }

WORK=$(mktemp -d /tmp/pd3-pgbench.XXXXXX)
chmod 755 "$WORK"
PD3_PID= FUSE_PID= LOOP= PG_DATA=
cleanup() {
  set +e
  [ -n "$PG_DATA" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DATA" -m immediate stop >/dev/null 2>&1
  mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  mountpoint -q "$WORK/fuse" && fusermount3 -u "$WORK/fuse"
  [ -n "$FUSE_PID" ] && wait "$FUSE_PID" 2>/dev/null
  [ -n "$PD3_PID" ] && kill -INT "$PD3_PID" 2>/dev/null && wait "$PD3_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# run_pg DATADIR LABEL: initdb, load, benchmark, amcheck; prints TPS.
run_pg() {
  local data=$1 label=$2 sock="$WORK/sock-$2"
  mkdir -p "$data" "$sock"; chown postgres: "$data" "$sock"
  PG_DATA=$data
  runuser -u postgres -- "$PGBIN/initdb" -D "$data" >"$WORK/$label-initdb.log"
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$data" -l "$sock/server.log" -w \
    -o "-p $PORT_PG -k $sock -c listen_addresses='' -c shared_buffers=128MB -c fsync=on" start >/dev/null
  local pg="-h $sock -p $PORT_PG -U postgres"
  runuser -u postgres -- pgbench $pg -i -q -s "$SCALE" postgres >/dev/null 2>&1
  local tps
  tps=$(runuser -u postgres -- pgbench $pg -c "$CLIENTS" -j 2 -T "$SECONDS_RUN" postgres 2>/dev/null |
        awk '/^tps/ {print $3; exit}')
  [ -n "$tps" ] || { echo "pgbench-nbd: pgbench on $label produced no result" >&2; exit 1; }
  # amcheck over every B-tree index: any corruption fails the run.
  runuser -u postgres -- "$PGBIN/pg_amcheck" $pg --install-missing --heapallindexed postgres >/dev/null
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null
  PG_DATA=
  echo "$tps"
}

echo "pgbench-nbd: starting pd3 (NBD on 127.0.0.1:$PORT_NBD)"
"$PD3" up --volume pg:4GiB --nbd "127.0.0.1:$PORT_NBD" --page "" --cache 256MiB >"$WORK/pd3.log" 2>&1 &
PD3_PID=$!
for _ in $(seq 100); do grep -q "NBD server listening" "$WORK/pd3.log" && break; sleep 0.1; done
grep -q "NBD server listening" "$WORK/pd3.log" || { cat "$WORK/pd3.log"; exit 1; }

mkdir -p "$WORK/fuse" "$WORK/mnt"
nbdfuse -P "$WORK/fuse.pid" "$WORK/fuse/disk" "nbd://127.0.0.1:$PORT_NBD/pg" &
FUSE_PID=$!
for _ in $(seq 100); do [ -f "$WORK/fuse.pid" ] && break; sleep 0.1; done
LOOP=$(losetup --find --show "$WORK/fuse/disk")
mkfs.ext4 -q -F "$LOOP"
mount "$LOOP" "$WORK/mnt"
echo "pgbench-nbd: PostgreSQL on ext4 on $LOOP over nbdfuse over pd3 (scale $SCALE, $CLIENTS clients, ${SECONDS_RUN}s)"
TPS_PD3=$(run_pg "$WORK/mnt/pgdata" pd3)
umount "$WORK/mnt"
e2fsck -fn "$LOOP" >/dev/null && echo "pgbench-nbd: e2fsck clean after the run"

echo "pgbench-nbd: PostgreSQL on local disk ($WORK)"
TPS_LOCAL=$(run_pg "$WORK/local-pgdata" local)

echo "pgbench-nbd: amcheck found no corruption in either run"
printf 'tps pd3=%s local=%s ratio pd3/local=%s\n' "$TPS_PD3" "$TPS_LOCAL" \
  "$(awk -v a="$TPS_PD3" -v b="$TPS_LOCAL" 'BEGIN { printf "%.3f", a / b }')"
