#!/usr/bin/env bash
# Change the GPU trainer range of a live KubeRay cluster: patch the trainer group's
# minReplicas/maxReplicas, which the autoscaler honours (it adds pods up to the new max when
# the run asks for more GPUs, and removes pods above the new max, idle ones first).
#
# It never lowers `replicas`: on an autoscaled group the autoscaler owns that field, and
# lowering it by hand deletes arbitrary pods (possibly ones holding train workers) behind the
# autoscaler's back. Raising it (pre-warming GPU pods) is allowed.
#
# Usage:
#   scripts/scale_trainers.sh [options] MIN MAX
#     -c, --cluster NAME     RayCluster name (default: elastic, as in ray-cluster.yaml)
#     -j, --rayjob NAME      target the RayCluster created by this RayJob instead
#     -n, --namespace NS     namespace (default: kubectl's current one)
#     -g, --group NAME       worker group (default: trainer-gpu)
#         --replicas N       also raise replicas to N (refused if N < current replicas)
#         --dry-run          print the patch, change nothing
#
# What the run does (docs/deploy.md, "Scaling mid-run"): the run's own range
# scaling.min_workers..max_workers is fixed at submission. Within it, Ray Train grows to use
# new GPU pods at its next resize check (scaling.elastic_resize_monitor_interval_s) and
# shrinks when a pod goes away; both restart the workers from the last checkpoint with the
# same global batch. A cluster max below the run's min_workers stalls the run.
set -euo pipefail

KUBECTL=${KUBECTL:-kubectl}
cluster=elastic rayjob="" group=trainer-gpu replicas="" dry_run=0 ns_args=()

die() { printf 'scale_trainers: %s\n' "$*" >&2; exit 2; }
say() { printf 'scale_trainers: %s\n' "$*"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

pos=()
while (($#)); do
  case "$1" in
    -c|--cluster) cluster=${2:?}; shift 2 ;;
    -j|--rayjob) rayjob=${2:?}; shift 2 ;;
    -n|--namespace) ns_args=(-n "${2:?}"); shift 2 ;;
    -g|--group) group=${2:?}; shift 2 ;;
    --replicas) replicas=${2:?}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) pos+=("$1"); shift ;;
  esac
done
((${#pos[@]} == 2)) || die "expected MIN MAX (see --help)"
min=${pos[0]} max=${pos[1]}
is_uint "$min" && is_uint "$max" || die "MIN and MAX must be non-negative integers, got '$min' '$max'"
((min <= max)) || die "MIN ($min) must be <= MAX ($max)"
[[ -z "$replicas" ]] || is_uint "$replicas" || die "--replicas must be a non-negative integer"

if [[ -n "$rayjob" ]]; then
  cluster=$("$KUBECTL" "${ns_args[@]}" get rayjob "$rayjob" -o jsonpath='{.status.rayClusterName}')
  [[ -n "$cluster" ]] || die "RayJob $rayjob has no RayCluster yet (status.rayClusterName is empty)"
  say "RayJob $rayjob runs on RayCluster $cluster"
fi

# One line per worker group: name replicas minReplicas maxReplicas.
groups=$("$KUBECTL" "${ns_args[@]}" get raycluster "$cluster" -o \
  jsonpath='{range .spec.workerGroupSpecs[*]}{.groupName} {.replicas} {.minReplicas} {.maxReplicas}{"\n"}{end}')
index=-1 i=0 cur_rep="" cur_min="" cur_max=""
while read -r name rep mn mx; do
  [[ -z "$name" ]] && continue
  if [[ "$name" == "$group" ]]; then index=$i cur_rep=${rep:-0} cur_min=${mn:-0} cur_max=${mx:-0}; fi
  i=$((i + 1))
done <<< "$groups"
((index >= 0)) || die "RayCluster $cluster has no worker group '$group' (groups: $(awk '{printf "%s ", $1}' <<< "$groups"))"

say "RayCluster $cluster, group $group: replicas=$cur_rep minReplicas=$cur_min maxReplicas=$cur_max"
if [[ -n "$replicas" ]] && ((replicas < cur_rep)); then
  die "refusing to lower replicas from $cur_rep to $replicas: on an autoscaled group that deletes arbitrary pods, possibly ones running train workers. Lower MAX instead; the autoscaler removes pods above it, idle ones first."
fi
if [[ -n "$replicas" ]] && ((replicas > max)); then
  die "--replicas $replicas is above the new MAX $max"
fi
if ((max < cur_rep)); then
  say "note: MAX $max < current replicas $cur_rep: the autoscaler will remove $((cur_rep - max)) pod(s); a run using them loses workers and restarts from its last checkpoint with fewer (elastic)."
fi
if ((min > cur_rep)); then
  say "note: MIN $min > current replicas $cur_rep: the autoscaler will add $((min - cur_rep)) pod(s) (GPU pods take minutes)."
fi

base="/spec/workerGroupSpecs/$index"
# The `test` op makes the patch fail instead of hitting another group if the list changed.
patch="[{\"op\":\"test\",\"path\":\"$base/groupName\",\"value\":\"$group\"},"
patch+="{\"op\":\"replace\",\"path\":\"$base/minReplicas\",\"value\":$min},"
patch+="{\"op\":\"replace\",\"path\":\"$base/maxReplicas\",\"value\":$max}"
if [[ -n "$replicas" ]] && ((replicas > cur_rep)); then
  patch+=",{\"op\":\"replace\",\"path\":\"$base/replicas\",\"value\":$replicas}"
fi
patch+="]"

cmd=("$KUBECTL" "${ns_args[@]}" patch raycluster "$cluster" --type=json -p "$patch")
say "running: ${cmd[*]}"
if ((dry_run)); then
  say "dry run: nothing changed"
  exit 0
fi
"${cmd[@]}"
say "done: $group minReplicas=$min maxReplicas=$max; watch with: $KUBECTL ${ns_args[*]} get pods -l ray.io/group=$group -w"
