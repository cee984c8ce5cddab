#!/usr/bin/env bash
# Resize the rollout fleet of a running disaggregated RL job (rl.rollout.placement:
# disaggregated): start rollout actors, or retire some (idle ones at once, busy ones when their
# unit of completions is done). Nothing is lost either way: a unit is only counted when its
# actor returns it, and a unit whose actor dies is generated again with the same seeds.
#
# Usage:
#   scripts/scale_rollouts.sh RUN_NAME N        (RAY_ADDRESS: the job's cluster; default auto)
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/scale_rollouts.sh RUN_NAME N" >&2; exit 2; }
here="$(cd "$(dirname "$0")/.." && pwd)"
py="$here/.venv/bin/python"
[ -x "$py" ] || py=python3
exec "$py" -m elastic.launch.rollouts --run "$1" --workers "$2"
