#!/usr/bin/env bash
# One-step, idempotent set-up for a fresh Debian machine: system packages, a virtualenv in
# .venv, the right PyTorch build for this machine, and the project with its test tools.
# Used by both Quickstart commands and by CI (.ci/run), so the three never drift apart.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

log() { printf '[setup] %s\n' "$*" >&2; }

# --- system packages (sandbox needs bubblewrap; venv needs ensurepip on Debian) ---
need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
"$PY" -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    log "installing Debian packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null || true
    $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null \
      || log "WARNING: apt-get install ${need_apt[*]} failed; continuing without"
  else
    log "WARNING: cannot install ${need_apt[*]} (no apt-get or no root); continuing without"
  fi
fi

# --- virtualenv ---
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
PIP=("$VPY" -m pip install -q --disable-pip-version-check)

# --- PyTorch: CUDA build only where there is a GPU; never pull CUDA wheels otherwise ---
if ! "$VPY" -c 'import torch' >/dev/null 2>&1; then
  TORCH_VERSION=${TORCH_VERSION:-2.13.0}
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "GPU found: installing torch==$TORCH_VERSION (CUDA build)"
    "${PIP[@]}" "torch==$TORCH_VERSION"
  else
    # A local +cpu wheel (find-links) wins if pip resolves to it; else use PyTorch's CPU index.
    resolved=$("$VPY" -m pip install --dry-run --no-deps -q --report - "torch==$TORCH_VERSION" 2>/dev/null \
      | "$VPY" -c 'import json,sys; r=json.load(sys.stdin); print(r["install"][0]["metadata"]["version"])' 2>/dev/null || true)
    if [[ "$resolved" == *+cpu* ]]; then
      log "no GPU: installing torch==$resolved (local CPU build)"
      "${PIP[@]}" "torch==$TORCH_VERSION"
    else
      log "no GPU: installing torch==$TORCH_VERSION from the PyTorch CPU index"
      "${PIP[@]}" "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi

# --- the project (editable) and its test tools; torch is already satisfied ---
stamp=.venv/.elastic-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  log "installing elastic[dev] and its dependencies"
  "${PIP[@]}" -e ".[dev]"
  touch "$stamp"
fi
log "ready: $("$VPY" -c 'import torch, ray; print(f"torch {torch.__version__}, ray {ray.__version__}, cuda={torch.cuda.is_available()}")')"
