# Shared by the tools/*.sh that time a pd3 mount: source it after setting
# PD3 and PORT. It makes $work (removed at exit, with the processes it
# started ended by PID and the mount detached) and mount_pd3 [NODE ARGS]
# starts a memory node and a host mounted at $work/mnt.
[ "$(id -u)" = 0 ] || { echo "$(basename "$0"): run as root (FUSE mounts)"; exit 1; }
work=$(mktemp -d /tmp/pd3-tool-XXXXXX)
node_pid= host_pid=
cleanup() {
  [ -n "$host_pid" ] && kill "$host_pid" 2>/dev/null && wait "$host_pid" 2>/dev/null || true
  [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null || true
  mountpoint -q "$work/mnt" && umount -l "$work/mnt" || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt"

mount_pd3() {
  "$PD3" memnode --listen 127.0.0.1:"$PORT" "$@" >"$work/node.log" 2>&1 & node_pid=$!
  for _ in $(seq 1 100); do grep -q "listening" "$work/node.log" && break; sleep 0.1; done
  "$PD3" serve --memnode 127.0.0.1:"$PORT" --mount "$work/mnt" --nbd "" --page "" --volume disk0:4MiB >"$work/host.log" 2>&1 & host_pid=$!
  for _ in $(seq 1 300); do grep -q "mounted at" "$work/host.log" && break; sleep 0.1; done
}

# unmount_pd3 ends the host and the memory node mount_pd3 started.
unmount_pd3() {
  kill "$host_pid"; wait "$host_pid" || true; host_pid=
  kill "$node_pid"; wait "$node_pid" || true; node_pid=
}
