#!/usr/bin/env bash
# A local multi-node Ray cluster with `ray start`, laid out like ray-cluster.yaml, for people
# without Kubernetes (and for tests/test_job_submit.py):
#   head     num-cpus 0, token auth, dashboard / Jobs API on 127.0.0.1
#   trainer  nodes advertising `trainer` (one per train worker), like the trainer-gpu group
#   cpu      nodes advertising `reward` (a label; CPUs bound the reward actors) and `driver`,
#            like the reward-cpu group
#
# Everything lives in one state dir (default /tmp/elastic-ray; keep it short: Ray's socket
# paths must stay under ~107 characters): the token, the addresses, and per node its start
# log and its own Ray temp dir (<dir>/<node>/ray), as if each node were its own machine.
# Why not one temp dir for all: every node's runtime-env agent unpacks a job's working_dir
# into <session>/runtime_resources/working_dir_files/, and Ray's working_dir plugin deletes
# and re-unpacks that directory the first time each node needs it (overwrite=True). With one
# shared dir, a second node unpacking it for its first worker of a job deleted the files the driver
# on the cpu node was importing (ModuleNotFoundError, intermittently). Logs stay in one place:
# every node's session logs dir is the head's (a symlink), because the Jobs API reads a
# job's log from the head's logs dir while the driver writes it under its own node's.
# Token auth is always on; the token is generated into <dir>/token (mode 600), never into
# ~/.ray/auth_token. Every port is chosen free at start, so several clusters can coexist.
# `stop` and `remove-node` kill exactly this cluster's processes (found by an environment
# marker every Ray process of a node inherits), never other clusters: no `ray stop`.
#
# Usage:
#   scripts/local_cluster.sh start                       # head only
#   scripts/local_cluster.sh add-node trainer [--cpus N] [--workers W]   # prints node name
#   scripts/local_cluster.sh add-node cpu [--cpus N]
#   scripts/local_cluster.sh remove-node NAME [--kill]   # SIGTERM (graceful) or SIGKILL (crash)
#   scripts/local_cluster.sh status | nodes | stop
#   scripts/local_cluster.sh pids [NAME]                 # PIDs of the cluster's (a node's) processes
#   eval "$(scripts/local_cluster.sh env)"               # RAY_ADDRESS, RAY_AUTH_MODE, token path
# Options (any command): --dir DIR, or ELASTIC_CLUSTER_DIR.
set -euo pipefail

DIR=${ELASTIC_CLUSTER_DIR:-/tmp/elastic-ray}
RAY=${RAY:-ray}
# Resource names: the same as ray-cluster.yaml and jobs/configs/k8s-*.yaml (tests check this).
TRAINER_RESOURCE=trainer
REWARD_RESOURCE=reward
DRIVER_RESOURCE=driver
MARKER=ELASTIC_RAY_NODE

die() { printf 'local_cluster: %s\n' "$*" >&2; exit 2; }
say() { printf 'local_cluster: %s\n' "$*" >&2; }

# The Python next to the `ray` executable (the same environment as the cluster).
python_for_ray() {
  local r; r=$(command -v "$RAY") || die "'$RAY' not found on PATH (activate the virtualenv)"
  if [[ -x "$(dirname "$r")/python" ]]; then echo "$(dirname "$r")/python"; else echo python3; fi
}

# N free TCP ports (bound together, so they are distinct).
free_ports() {
  "$PY" - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# PIDs of a node's processes ($1 = its dir) or of the whole cluster ($1 = "$DIR/"): those
# carrying the environment marker (inherited by raylet, GCS, dashboard, workers, drivers),
# plus every process in their sessions (each node is started under setsid) and all their
# descendants. The union matters: Ray retitles workers and agents (setproctitle), which can
# overwrite the environment block the marker is read from.
node_pids() {
  "$PY" - "$MARKER=$1" <<'EOF'
import os, sys
want = sys.argv[1].encode()
me, my_sid = os.getpid(), os.getsid(0)
procs = {}  # pid -> (ppid, sid, marked)
for name in filter(str.isdigit, os.listdir("/proc")):
    pid = int(name)
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
        fields = stat[stat.rindex(b")") + 2:].split()
        ppid, sid = int(fields[1]), int(fields[3])
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except (OSError, ValueError):
        continue
    marked = any(e == want or (want.endswith(b"/") and e.startswith(want)) for e in env)
    procs[pid] = (ppid, sid, marked)
found = {p for p, (_, _, m) in procs.items() if m}
sids = {procs[p][1] for p in found} - {my_sid, 0, 1}
found |= {p for p, (_, sid, _) in procs.items() if sid in sids}
children = {}
for p, (pp, _, _) in procs.items():
    children.setdefault(pp, []).append(p)
stack = list(found)
while stack:
    for c in children.get(stack.pop(), []):
        if c not in found:
            found.add(c)
            stack.append(c)
found.discard(me)
print("\n".join(map(str, sorted(found))))
EOF
}

# SIGTERM (or SIGKILL) the processes of a node or of the cluster; escalate after a grace period.
kill_marked() {
  local prefix=$1 sig=${2:-TERM} pids i
  pids=$(node_pids "$prefix")
  [[ -z "$pids" ]] && return 0
  # shellcheck disable=SC2086
  kill -"$sig" $pids 2>/dev/null || true
  for i in $(seq 1 20); do
    sleep 0.5
    pids=$(node_pids "$prefix")
    [[ -z "$pids" ]] && return 0
  done
  say "escalating to SIGKILL for: $(echo $pids)"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  sleep 0.5
}

env_lines() {
  [[ -f "$DIR/address" ]] || die "no cluster in $DIR (run: $0 start)"
  echo "export RAY_ADDRESS=$(cat "$DIR/dashboard_url")"
  echo "export RAY_AUTH_MODE=token"
  echo "export RAY_AUTH_TOKEN_PATH=$DIR/token"
}

# Start one node. $1 = node name, the rest = extra `ray start` arguments.
start_node() {
  local name=$1; shift
  local ndir="$DIR/$name" nm om al ag re me
  mkdir -p "$ndir"
  read -r nm om al ag re me <<< "$(free_ports 6)"
  if [[ "$name" != head ]]; then
    # Own temp dir, but the head's logs dir: the Jobs API reads a job's driver log from the
    # head's session logs, while the driver (on a cpu node) writes it under its own node's.
    local session
    session=$(basename "$(readlink -f "$DIR/head/ray/session_latest")") || die "no head session in $DIR/head/ray"
    mkdir -p "$ndir/ray/$session"
    ln -sfn "$DIR/head/ray/$session/logs" "$ndir/ray/$session/logs"
  fi
  # setsid: the node does not share the caller's process group (a Ctrl-C in the shell that
  # ran `start` must not kill the cluster).
  env "$MARKER=$ndir" RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$DIR/token" \
    setsid "$RAY" start --temp-dir "$ndir/ray" --disable-usage-stats \
      --node-manager-port "$nm" --object-manager-port "$om" \
      --dashboard-agent-listen-port "$al" --dashboard-agent-grpc-port "$ag" \
      --runtime-env-agent-port "$re" --metrics-export-port "$me" \
      --min-worker-port 0 --max-worker-port 0 \
      "$@" > "$ndir/start.log" 2>&1 < /dev/null \
    || { cat "$ndir/start.log" >&2; kill_marked "$ndir" KILL; die "ray start failed for node $name (log above)"; }
}

cmd_start() {
  [[ -f "$DIR/address" ]] && [[ -n "$(node_pids "$DIR/head")" ]] && die "a cluster is already running in $DIR ($0 --dir $DIR stop)"
  rm -rf "$DIR"; mkdir -p "$DIR"; chmod 700 "$DIR"
  (umask 077; "$PY" -c 'import secrets, sys; sys.stdout.write(secrets.token_hex(32))' > "$DIR/token")
  local gcs dash client
  read -r gcs dash client <<< "$(free_ports 3)"
  local extra=()
  # The Ray Client server needs ray[client] (grpcio); without it, `ray start` refuses the flag.
  if "$PY" -c 'from ray._private.utils import get_ray_client_dependency_error as e; raise SystemExit(e() is not None)' 2>/dev/null; then
    extra+=(--ray-client-server-port "$client")
  fi
  start_node head --head --port "$gcs" --dashboard-host 127.0.0.1 --dashboard-port "$dash" \
    --num-cpus 0 --num-gpus 0 "${extra[@]}"
  echo "127.0.0.1:$gcs" > "$DIR/address"
  echo "http://127.0.0.1:$dash" > "$DIR/dashboard_url"
  echo 0 > "$DIR/next_node"
  say "head up: GCS 127.0.0.1:$gcs, Jobs API http://127.0.0.1:$dash (token auth, token in $DIR/token)"
  env_lines
}

cmd_add_node() {
  local kind=${1:-} cpus=2 workers=1; shift || true
  while (($#)); do
    case "$1" in
      --cpus) cpus=${2:?}; shift 2 ;;
      --workers) workers=${2:?}; shift 2 ;;
      *) die "add-node: unknown option $1" ;;
    esac
  done
  [[ -f "$DIR/address" ]] || die "no cluster in $DIR (run: $0 start)"
  local n name res
  n=$(( $(cat "$DIR/next_node") + 1 )); echo "$n" > "$DIR/next_node"
  case "$kind" in
    trainer) name="trainer$n"; res="{\"$TRAINER_RESOURCE\": $workers}" ;;
    cpu) name="cpu$n"; res="{\"$REWARD_RESOURCE\": 1, \"$DRIVER_RESOURCE\": 1}" ;;
    *) die "add-node: kind must be trainer or cpu, got '$kind'" ;;
  esac
  # No log monitor: the head's already tails the shared log dir (a second one would print
  # every worker log line twice).
  start_node "$name" --address "$(cat "$DIR/address")" --num-cpus "$cpus" --resources "$res" \
    --include-log-monitor false
  say "node $name up: $cpus CPUs, resources $res"
  echo "$name"
}

cmd_remove_node() {
  local name=${1:-} sig=TERM
  [[ -n "$name" ]] || die "remove-node: give a node name (see: $0 nodes)"
  [[ "${2:-}" == "--kill" ]] && sig=KILL
  [[ "$name" != head ]] || die "remove-node: use stop to remove the head"
  [[ -d "$DIR/$name" ]] || die "remove-node: no node $name in $DIR"
  say "removing node $name with SIG$sig (processes: $(node_pids "$DIR/$name" | wc -l))"
  kill_marked "$DIR/$name" "$sig"
  mv "$DIR/$name" "$DIR/removed-$name-$(date +%s)"
}

cmd_nodes() {
  local d
  for d in "$DIR"/*/; do
    d=${d%/}; [[ "$(basename "$d")" == removed-* ]] && continue
    [[ -f "$d/start.log" ]] && echo "$(basename "$d") $(node_pids "$d" | wc -l) processes"
  done
}

cmd_stop() {
  [[ -d "$DIR" ]] || { say "nothing to stop in $DIR"; return 0; }
  say "stopping all nodes in $DIR"
  kill_marked "$DIR/" TERM
  rm -f "$DIR/address" "$DIR/dashboard_url"
}

main() {
  local args=()
  while (($#)); do
    case "$1" in
      --dir) DIR=${2:?}; shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  set -- "${args[@]}"
  DIR=${DIR%/}
  PY=$(python_for_ray)
  local cmd=${1:-}; shift || true
  case "$cmd" in
    start) cmd_start ;;
    add-node) cmd_add_node "$@" ;;
    remove-node) cmd_remove_node "$@" ;;
    nodes) cmd_nodes ;;
    pids) if [[ -n "${1:-}" ]]; then node_pids "$DIR/$1"; else node_pids "$DIR/"; fi ;;
    status) eval "$(env_lines)"; "$RAY" status --address "$(cat "$DIR/address")" ;;
    env) env_lines ;;
    stop) cmd_stop ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; [[ -z "$cmd" ]] || exit 2 ;;
  esac
}
main "$@"
