#!/usr/bin/env bash
# Runs NUM_PROCESSES JAX processes of the trainer on this machine: a multi-host pod in miniature.
#
# Every process runs the same command, `python -m agent_r1_jax.train "$@"`, with the environment that
# agent_r1_jax.distributed.maybe_initialize() reads (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
# JAX_PROCESS_ID); process 0 hosts the coordinator on 127.0.0.1. Process 0 writes to this terminal, the
# others to LOG_DIR/process_<i>.log. The script exits with the first non-zero status of any process (and
# stops the rest), or 0 when all succeed. Ctrl-C / SIGTERM is forwarded to every process.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: launch/local_multiprocess.sh NUM_PROCESSES [train flags...]

  e.g. JAX_PLATFORMS=cpu DEVICES_PER_PROCESS=2 launch/local_multiprocess.sh 2 \
           --config=configs/grpo_multihopqa.py:tiny --workdir=/tmp/agent_r1_2proc

environment (all optional):
  PORT                 coordinator port on 127.0.0.1 (default: a free port)
  DEVICES_PER_PROCESS  CPU only: fake host devices per process (sets XLA_FLAGS
                       --xla_force_host_platform_device_count)
  GPUS_PER_PROCESS     GPUs only: process i gets local GPUs i*K .. i*K+K-1 (sets JAX_LOCAL_DEVICE_IDS)
  LOG_DIR              where processes 1.. log (default: a new temporary directory)
  PYTHON               interpreter (default: python)
USAGE
}

if [[ $# -ge 1 && ( "$1" == "-h" || "$1" == "--help" ) ]]; then
  usage
  exit 0
fi
if [[ $# -lt 1 ]]; then
  usage >&2
  exit 2
fi
if ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: NUM_PROCESSES must be a positive integer, got '$1'" >&2
  usage >&2
  exit 2
fi
NUM_PROCESSES="$1"
shift

for name in DEVICES_PER_PROCESS GPUS_PER_PROCESS PORT; do
  if [[ -n "${!name:-}" ]] && ! [[ "${!name}" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: ${name} must be a positive integer, got '${!name}'" >&2
    exit 2
  fi
done
PYTHON="${PYTHON:-python}"
if [[ -z "${PORT:-}" ]]; then
  PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
LOG_DIR="${LOG_DIR:-$(mktemp -d -t agent_r1_local_XXXXXX)}"
mkdir -p "$LOG_DIR"

export JAX_COORDINATOR_ADDRESS="127.0.0.1:${PORT}"
export JAX_COORDINATOR_BIND_ADDRESS="127.0.0.1:${PORT}"
export JAX_NUM_PROCESSES="$NUM_PROCESSES"
if [[ -n "${DEVICES_PER_PROCESS:-}" ]]; then
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=${DEVICES_PER_PROCESS}"
fi
# gRPC would send the loopback coordinator traffic through an HTTP proxy if one is configured. (Only then:
# JAX warns about any *_proxy variable, this one included.)
if [[ -n "${http_proxy:-}${HTTP_PROXY:-}${https_proxy:-}${HTTPS_PROXY:-}${grpc_proxy:-}${GRPC_PROXY:-}" ]]; then
  export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
  export no_proxy="$NO_PROXY"
fi

pids=()
stop_all() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
}
trap 'stop_all; wait; exit 130' INT
trap 'stop_all; wait; exit 143' TERM

echo "launching ${NUM_PROCESSES} processes, coordinator ${JAX_COORDINATOR_ADDRESS}, logs of processes 1.. in ${LOG_DIR}" >&2
for (( i = 0; i < NUM_PROCESSES; i++ )); do
  assignments=("JAX_PROCESS_ID=${i}")
  if [[ -n "${GPUS_PER_PROCESS:-}" ]]; then
    assignments+=("JAX_LOCAL_DEVICE_IDS=$(seq -s, $(( i * GPUS_PER_PROCESS )) $(( (i + 1) * GPUS_PER_PROCESS - 1 )))")
  fi
  if (( i == 0 )); then
    env "${assignments[@]}" "$PYTHON" -m agent_r1_jax.train "$@" &
  else
    env "${assignments[@]}" "$PYTHON" -m agent_r1_jax.train "$@" >"${LOG_DIR}/process_${i}.log" 2>&1 &
  fi
  pids+=("$!")
done

# Wait for the processes in completion order; the first failure stops the others (a multi-controller run
# cannot continue with a process missing, the survivors would block in their next collective).
status=0
remaining=${#pids[@]}
while (( remaining > 0 )); do
  code=0
  wait -n || code=$?
  remaining=$(( remaining - 1 ))
  if (( code != 0 && status == 0 )); then
    status=$code
    echo "a process exited with status ${code}; stopping the others (logs: ${LOG_DIR})" >&2
    stop_all
  fi
done
exit "$status"
