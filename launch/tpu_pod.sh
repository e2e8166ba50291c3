#!/usr/bin/env bash
# Runs the trainer on every host of a Cloud TPU VM slice (one JAX process per host).
#
# Multi-controller JAX: every host runs the SAME command; each process reads its own shard of the training
# data (shard_index = jax.process_index()), runs the episode driver on its rows, and all processes step
# through the same jitted calls in lockstep over one mesh that spans the whole slice. AGENT_R1_DISTRIBUTED=on
# makes agent_r1_jax.distributed.maybe_initialize() call jax.distributed.initialize() with no arguments, which
# on a TPU VM reads the slice's workers and this host's index from the metadata server.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: launch/tpu_pod.sh TPU_NAME ZONE [train flags...]

  e.g. launch/tpu_pod.sh my-v5e-32 us-west4-a --config=configs/grpo_multihopqa.py:qwen2.5-3b \
           --config.model.path=/mnt/models/Qwen2.5-3B-Instruct --config.data.prepared_dir=/mnt/data/mhqa \
           --config.tool.corpus_path=/mnt/data/wiki18.jsonl --workdir=/mnt/runs/grpo_3b

The checkout, the model, the data and --workdir must exist at the same paths on every worker (a shared disk
or bucket mount: every process writes its part of each checkpoint there). The default SETUP makes REPO_DIR/.venv
if it is missing and installs JAX's TPU build into it, `pip install -e ".[tpu]"`, unless libtpu is already there
(plain `pip install -e .` gives the CPU-only jaxlib, and a real preset then refuses to start). A checkout that
the workers share: install once before the first launch (the workers would otherwise write the same .venv at
once), e.g. on one worker: cd REPO_DIR && python3 -m venv .venv && .venv/bin/pip install -e ".[tpu]"

environment (all optional):
  PROJECT    gcloud project (default: gcloud's configured project)
  REPO_DIR   the checkout on the workers (default: ~/agent_r1_jax)
  SETUP      shell run on each worker in REPO_DIR before training (default: the .venv and the tpu extra,
             above; e.g. SETUP='source .venv/bin/activate' to use the environment as it is)
  PYTHON     interpreter on the workers (default: python)
  DRY_RUN=1  print the gcloud command instead of running it
USAGE
}

if [[ $# -ge 1 && ( "$1" == "-h" || "$1" == "--help" ) ]]; then
  usage
  exit 0
fi
if [[ $# -lt 2 ]]; then
  echo "error: need TPU_NAME and ZONE" >&2
  usage >&2
  exit 2
fi
TPU_NAME="$1"
ZONE="$2"
shift 2

REPO_DIR="${REPO_DIR:-~/agent_r1_jax}"
PYTHON="${PYTHON:-python}"
# The default set-up, in the workers' shell: the venv (made if missing) with JAX's TPU build (libtpu, the
# `tpu` extra) installed when it is not there yet, so a run never falls back to the workers' CPUs.
default_setup='{ test -d .venv || python3 -m venv .venv; } && source .venv/bin/activate'
default_setup+=" && { ${PYTHON} -c 'import libtpu' 2>/dev/null || ${PYTHON} -m pip install -q -e '.[tpu]'; }"
SETUP="${SETUP:-${default_setup}}"

# The remote command is one string for the workers' shell: quote every train flag for it.
train_args=""
if [[ $# -gt 0 ]]; then
  train_args="$(printf ' %q' "$@")"
fi
remote="cd ${REPO_DIR} && ${SETUP} && AGENT_R1_DISTRIBUTED=on ${PYTHON} -m agent_r1_jax.train${train_args}"

cmd=(gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$remote")
if [[ -n "${PROJECT:-}" ]]; then
  cmd+=(--project="$PROJECT")
fi

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  printf '%q ' "${cmd[@]}"
  printf '\n'
  exit 0
fi
exec "${cmd[@]}"
