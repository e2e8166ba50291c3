#!/usr/bin/env bash
# Drives a Cloud TPU VM slice from your machine, one verb at a time: the code onto every worker, the model and
# data staged, the retrieval server started, training and evaluation launched detached on every worker, watched,
# stopped. The walk-through is docs/tpu.md; how the processes find each other is launch/README.md.
#
# Multi-controller JAX: every worker runs the SAME command as one process. AGENT_R1_DISTRIBUTED=on makes
# agent_r1_jax.distributed.maybe_initialize() call jax.distributed.initialize() with no arguments, which on a TPU
# VM reads the slice's workers and this worker's index from the metadata server.
#
# Each verb is one or a few `gcloud compute tpus tpu-vm ssh|scp|describe` calls ($GCLOUD, so a test can stand in
# for gcloud). What runs on a worker is the `w_*` functions below, sent with `declare -f` and run by bash in the
# worker's home; nothing on the workers needs this file.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: launch/tpu_pod.sh VERB TPU ZONE [ARGS...]

  setup                copy this checkout to every worker (REPO_DIR), make the virtual environment (VENV) with a
                       Python the package supports (provisioned with uv when the image's python3 is too old), and
                       install the package with its `tpu` extra unless requirements.txt's pins and libtpu are there
  stage [--worker=W] SRC DEST
                       copy SRC to DEST on every worker, or worker W (DEST relative to the worker's home): SRC is
                       gs://... (read by each worker with its own credentials) or a path on this machine (gcloud scp)
  exec [--worker=W] -- COMMAND...
                       run COMMAND in REPO_DIR with the venv first on PATH, on worker W (a number, or all: default)
  retriever [SERVER FLAGS...]
                       start `python -m agent_r1_jax.retrieval.server SERVER FLAGS` on worker 0, detached, bound to
                       every interface (port 8000 unless --port says); wait until it answers /health and every
                       worker reaches it; print its URL, http://WORKER0_IP:PORT, alone on stdout
  run [TRAIN FLAGS...] start `python -m agent_r1_jax.train TRAIN FLAGS` on every worker, detached: it survives this
                       ssh session; output in LOG_DIR/train.log on each worker; the command line is appended to
                       WORKDIR/launches.jsonl. Rerunning with the same --workdir resumes from its last checkpoint
  evaluate [FLAGS...]  the same for `python -m agent_r1_jax.evaluate FLAGS` (LOG_DIR/evaluate.log)
  status               each worker's jobs (running, finished, failed with the exit status, or died: no exit status,
                       killed with its machine) with their last log line; the run's last metrics step and its
                       checkpoints, read from the workdir
  logs [JOB] [--worker=W] [--lines=N]
                       the last N (default 20) lines of JOB's log (train, evaluate or retriever; default train)
  stop [JOB...]        SIGTERM to JOB (default: train and evaluate) on every worker (the trainer saves a checkpoint
                       and exits), SIGKILL to its process group after STOP_GRACE_S seconds

A flag value or argument that starts with ~/ names the worker's home (the same path on every worker of a slice).

environment (all optional):
  GCLOUD        gcloud binary (default: gcloud)
  PROJECT       gcloud project (default: gcloud's configured project)
  REPO_DIR      the checkout on each worker, relative to its home (default: agent_r1_jax)
  VENV          the virtual environment on each worker, relative to its home (default: agent_r1_venv)
  LOG_DIR       job logs, pid and exit files on each worker, relative to its home (default: agent_r1_logs)
  UV_PYTHON     the Python setup provisions with uv when python3 is outside requires-python (default: 3.11)
  INSTALL_UV    1 (default): setup installs uv with its official installer when it needs uv and has none; 0: it
                stops and says how instead
  RUN_ENV       NAME=VALUE words added to the environment of run and evaluate, e.g. 'WANDB_API_KEY=...'
  STOP_GRACE_S  seconds stop waits between SIGTERM and SIGKILL (default: 120)
  DRY_RUN=1     print the gcloud commands instead of running them
USAGE
}

die() {
  echo "error: $*" >&2
  exit 2
}

# ----------------------------------------------------------------------------------------------------------------
# Worker side: run by bash on each worker, in its home, with the arguments the verbs below pass. Output goes to
# stdout (gcloud collects each worker's into its own file); a non-zero return fails the verb.

# w_version PYTHON: "3.11.7" (or nothing when PYTHON does not run).
w_version() {
  local out
  out="$("$1" --version 2>&1)" || return 0
  [[ "$out" =~ ^Python\ ([0-9]+\.[0-9]+(\.[0-9]+)?) ]] && printf '%s\n' "${BASH_REMATCH[1]}"
}

# w_supported VERSION MIN BELOW: whether MIN <= VERSION < BELOW (major.minor).
w_supported() {
  local v="$1" min="$2" below="$3"
  [[ -n "$v" ]] || return 1
  local major="${v%%.*}" rest="${v#*.}"
  local minor="${rest%%.*}"
  (( major * 100 + minor >= ${min%%.*} * 100 + ${min#*.} && major * 100 + minor < ${below%%.*} * 100 + ${below#*.} ))
}

# w_expand ARG: ARG with a leading ~/ (or a flag value's, --name=~/...) made the worker's home.
w_expand() {
  local arg="$1"
  # shellcheck disable=SC2088  # a literal ~/, expanded here
  if [[ "$arg" == "~/"* ]]; then
    printf '%s\n' "$HOME/${arg#"~/"}"
  elif [[ "$arg" =~ ^(--[^=]+=)~/(.*)$ ]]; then
    printf '%s\n' "${BASH_REMATCH[1]}$HOME/${BASH_REMATCH[2]}"
  else
    printf '%s\n' "$arg"
  fi
}

# w_alive LOG_DIR JOB: whether a process of JOB's process group (the session its pid file names) is alive. Zombies
# do not count: an init that is slow to reap orphans (some containers) would otherwise keep a finished job running.
w_alive() {
  local pid
  pid="$(cat "$1/$2.pid" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && ps -eo pgid=,stat= | awk -v group="$pid" '$1 == group && $2 !~ /^Z/ { alive = 1 } END { exit !alive }'
}

# w_setup TARBALL REPO_DIR VENV LOG_DIR MIN BELOW UV_PYTHON INSTALL_UV
w_setup() {
  local tarball="$1" repo="$2" venv="$3" log_dir="$4" min="$5" below="$6" uv_python="$7" install_uv="$8"
  local job
  for job in train evaluate retriever; do
    if w_alive "$log_dir" "$job"; then
      echo "error: $job is running here (pid $(cat "$log_dir/$job.pid")); stop it before setup replaces the code"
      return 1
    fi
  done
  # The code: unpacked beside the old copy, then swapped in, so a failed copy leaves the old one whole.
  rm -rf "$repo.new"
  mkdir -p "$repo.new"
  tar -xzf "$tarball" -C "$repo.new"
  rm -rf "$repo"
  mv "$repo.new" "$repo"
  rm -f "$tarball"

  # A Python that requires-python allows: the venv's, else python3's, else one uv provisions.
  local have
  have="$(w_version "$venv/bin/python")"
  if w_supported "$have" "$min" "$below"; then
    echo "python: $venv has Python $have"
  else
    [[ -n "$have" ]] && { echo "python: $venv has Python $have, outside >=$min,<$below: replacing it"; rm -rf "$venv"; }
    local system
    system="$(w_version python3)"
    if w_supported "$system" "$min" "$below"; then
      python3 -m venv "$venv"
      echo "python: made $venv with python3 ($system)"
    else
      local uv
      uv="$(command -v uv || true)"
      [[ -z "$uv" && -x "$HOME/.local/bin/uv" ]] && uv="$HOME/.local/bin/uv"
      if [[ -z "$uv" && "$install_uv" == 1 ]]; then
        echo "python: python3 is ${system:-missing}, outside >=$min,<$below; installing uv (https://astral.sh/uv)"
        if curl -LsSf https://astral.sh/uv/install.sh | env UV_UNMANAGED_INSTALL="$HOME/.local/bin" sh; then
          uv="$HOME/.local/bin/uv"
        fi
      fi
      if [[ -z "$uv" || ! -x "$uv" ]]; then
        echo "error: python3 is ${system:-missing} and agent_r1_jax needs Python >=$min,<$below: install uv" \
             "(curl -LsSf https://astral.sh/uv/install.sh | sh) or python$min on this worker and rerun setup"
        return 3
      fi
      "$uv" venv --python "$uv_python" --seed "$venv"
      echo "python: made $venv with uv ($("$uv" --version)): Python $(w_version "$venv/bin/python")"
    fi
  fi

  # The package and its pins, with JAX's TPU build (the `tpu` extra: libtpu), unless they are all there.
  local check='
import importlib.metadata as md, importlib.util, sys
wrong = []
for line in open("requirements.txt"):
  line = line.split("#", 1)[0].strip()
  if line and not line.startswith("-"):
    name, _, version = line.partition("==")
    try:
      have = md.version(name)
    except md.PackageNotFoundError:
      have = None
    if have != version:
      wrong.append(f"{name}=={version} (installed: {have})")
if importlib.util.find_spec("libtpu") is None:
  wrong.append("libtpu (the tpu extra)")
print("; ".join(wrong[:3]) + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""))
sys.exit(1 if wrong else 0)'
  local wrong
  if wrong="$(cd "$repo" && "$HOME/$venv/bin/python" -c "$check")"; then
    echo "packages: requirements.txt's pins and libtpu are installed"
  else
    echo "packages: installing the package with its tpu extra (missing: $wrong)"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e "$HOME/${repo}[tpu]"
  fi
  (cd "$repo" && "$HOME/$venv/bin/python" - <<'PY'
import importlib.metadata as md, sys
import agent_r1_jax
print(f"ready: Python {sys.version.split()[0]}, jax {md.version('jax')}, libtpu {md.version('libtpu')}, "
      f"agent_r1_jax from {agent_r1_jax.__path__[0]}")
PY
  )
}

# w_stage_gs VENV REPO_DIR SRC DEST: copy gs://SRC (a file or everything under it) to DEST, through DEST.partial.
w_stage_gs() {
  local venv="$1" repo="$2" src="$3" dest
  dest="$(w_expand "$4")"
  [[ "$dest" == /* ]] || dest="$HOME/$dest"
  (cd "$repo" && "$HOME/$venv/bin/python" - "$src" "$dest" <<'PY'
import pathlib, shutil, sys
from agent_r1_jax import workdir

def files(path, local):  # a bucket lists one level per call (epath has no recursive glob on gs://)
  for child in path.iterdir():
    if child.is_dir():
      yield from files(child, local / child.name)
    else:
      yield child, local / child.name

src, dest = workdir.workdir_path(sys.argv[1].rstrip("/")), pathlib.Path(sys.argv[2])
partial = dest.with_name(dest.name + ".partial")
shutil.rmtree(partial, ignore_errors=True)
partial.unlink(missing_ok=True)
if src.is_file():
  pairs = [(src, partial)]
elif src.is_dir():
  pairs = list(files(src, partial))
else:
  pairs = []
if not pairs:
  sys.exit(f"error: nothing at {src}")
size = 0
for remote, local in pairs:
  local.parent.mkdir(parents=True, exist_ok=True)
  workdir.copy_file(remote, local)
  size += local.stat().st_size
if dest.is_dir() and not dest.is_symlink():
  shutil.rmtree(dest)
elif dest.exists() or dest.is_symlink():
  dest.unlink()
partial.rename(dest)
print(f"staged {src} -> {dest}: {len(pairs)} files, {size / 2**20:.1f} MiB")
PY
  )
}

# w_stage_prepare DEST / w_stage_finish DEST: around `gcloud scp` into DEST.partial.
w_stage_prepare() {
  local dest
  dest="$(w_expand "$1")"
  rm -rf "$dest.partial"
  mkdir -p "$(dirname "$dest")"
}

w_stage_finish() {
  local dest
  dest="$(w_expand "$1")"
  [[ -e "$dest.partial" ]] || { echo "error: the copy to $dest.partial did not arrive"; return 1; }
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
  echo "staged $dest: $(find "$dest" -type f | wc -l) files, $(du -sh "$dest" | cut -f1)"
}

# w_exec REPO_DIR VENV COMMAND...: COMMAND in the checkout with the venv first on PATH.
w_exec() {
  local repo="$1" venv="$2"
  shift 2
  local args=() arg
  for arg in "$@"; do
    args+=("$(w_expand "$arg")")
  done
  cd "$repo"
  PATH="$HOME/$venv/bin:$PATH" VIRTUAL_ENV="$HOME/$venv" "${args[@]}"
}

# w_launch JOB REPO_DIR VENV LOG_DIR ENV_WORDS -- PROGRAM...: PROGRAM detached in its own session (setsid), its
# output appended to LOG_DIR/JOB.log, the session leader's pid in JOB.pid and PROGRAM's exit status in JOB.exit
# when it ends. The leader forwards SIGTERM to PROGRAM.
w_launch() {
  local job="$1" repo="$2" venv="$3" log_dir="$4" env_words="$5"
  shift 6  # the sixth is "--"
  mkdir -p "$log_dir"
  log_dir="$(cd "$log_dir" && pwd)"
  local waited=0
  while w_alive "$log_dir" "$job" && [[ -s "$log_dir/$job.exit" ]] && (( waited++ < 100 )); do
    sleep 0.1  # the job has ended: its session's last processes are on their way out
  done
  if w_alive "$log_dir" "$job"; then
    echo "error: $job is already running (pid $(cat "$log_dir/$job.pid")); stop it first"
    return 1
  fi
  local args=() arg
  for arg in "$@"; do
    args+=("$(w_expand "$arg")")
  done
  local env_args=()
  read -r -a env_args <<<"$env_words"
  rm -f "$log_dir/$job.exit" "$log_dir/$job.pid"
  printf '%q ' "${args[@]}" >"$log_dir/$job.cmd"
  printf '\n=== %s %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$job" "$(<"$log_dir/$job.cmd")" >>"$log_dir/$job.log"
  cd "$repo"
  # shellcheck disable=SC2016  # the leader's script, expanded by the leader
  setsid bash -c '
    base="$1"; shift
    echo "$$" >"$base.pid"
    "$@" &
    child=$!
    exec 2>/dev/null  # the leader'"'"'s own notices ("Aborted") stay out of the log
    trap "kill -TERM $child 2>/dev/null" TERM
    code=0
    wait "$child" || code=$?
    while kill -0 "$child" 2>/dev/null; do  # a trapped signal interrupted the wait: the child is still there
      code=0
      wait "$child" || code=$?
    done
    echo "$code" >"$base.exit"
  ' "$job" "$log_dir/$job" env "${env_args[@]}" AGENT_R1_DISTRIBUTED=on PYTHONUNBUFFERED=1 \
    "$HOME/$venv/bin/python" "${args[@]}" >>"$log_dir/$job.log" 2>&1 </dev/null &
  waited=0
  until [[ -s "$log_dir/$job.pid" ]]; do
    sleep 0.1
    (( ++waited < 100 )) || { echo "error: $job did not start; see $log_dir/$job.log"; return 1; }
  done
  echo "$job started (pid $(cat "$log_dir/$job.pid")), log $log_dir/$job.log"
}

# w_state LOG_DIR JOB: one line, JOB's state and its log's last line (nothing when JOB never ran here).
w_state() {
  local log_dir="$1" job="$2" state last
  [[ -e "$log_dir/$job.cmd" ]] || return 0
  if w_alive "$log_dir" "$job"; then
    state="running (pid $(cat "$log_dir/$job.pid"))"
  elif [[ -s "$log_dir/$job.exit" ]]; then
    local code
    code="$(cat "$log_dir/$job.exit")"
    if [[ "$code" == 0 ]]; then
      state="finished"
    elif (( code > 128 )); then
      state="failed (exit $code: signal $(( code - 128 )))"
    else
      state="failed (exit $code)"
    fi
  else
    state="died (no exit status: killed together with its session, or its machine went away)"
  fi
  last="$(grep -v '^[[:space:]]*$' "$log_dir/$job.log" 2>/dev/null | tail -n 1 | cut -c1-160)"
  echo "$job: $state | $last"
}

# w_status LOG_DIR REPO_DIR VENV: every job's state; on the worker that launched a run, the run's progress.
w_status() {
  local log_dir="$1" repo="$2" venv="$3" job
  for job in train evaluate retriever; do
    w_state "$log_dir" "$job"
  done
  [[ -s "$log_dir/train.workdir" ]] || return 0
  local run
  run="$(cat "$log_dir/train.workdir")"
  (cd "$repo" && "$HOME/$venv/bin/python" - "$run" <<'PY'
import json, sys
from agent_r1_jax import workdir
from agent_r1_jax.trainer.actor_checkpoint import checkpoint_steps

run = workdir.workdir_path(sys.argv[1])
metrics = run / "metrics.jsonl"
rows = metrics.read_text().splitlines() if metrics.exists() else []
step = json.loads(rows[-1])["step"] if rows else None
print(f"run {run}: metrics up to step {step if step is not None else '-'} (uploaded with each checkpoint), "
      f"checkpoints {' '.join(map(str, checkpoint_steps(run))) or '-'}")
PY
  )
}

# w_record REPO_DIR VENV LOG_DIR JOB WORKDIR TPU ZONE -- COMMAND...: the launch appended to WORKDIR/launches.jsonl
# (time, job, slice, the command line that made it); a train job's workdir kept for status.
w_record() {
  local repo="$1" venv="$2" log_dir="$3" job="$4" run tpu="$6" zone="$7"
  run="$(w_expand "$5")"
  shift 8  # the eighth is "--"
  mkdir -p "$log_dir"
  [[ "$job" == train ]] && printf '%s\n' "$run" >"$log_dir/train.workdir"
  (cd "$repo" && "$HOME/$venv/bin/python" - "$run" "$job" "$tpu" "$zone" "$@" <<'PY'
import datetime, json, shlex, sys
from agent_r1_jax import workdir

run, job, tpu, zone, argv = workdir.workdir_path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
run.mkdir(parents=True, exist_ok=True)
record = run / "launches.jsonl"
line = json.dumps({"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "job": job, "tpu": tpu, "zone": zone, "argv": argv, "command": shlex.join(argv)})
before = record.read_text() if record.exists() else ""
record.write_text(before + line + "\n")  # an object cannot be appended to: read, add, write
print(f"recorded the launch in {record}")
PY
  )
}

# w_logs LOG_DIR JOB LINES
w_logs() {
  local log_dir="$1" job="$2" lines="$3"
  [[ -e "$log_dir/$job.log" ]] || { echo "($job never ran here)"; return 0; }
  tail -n "$lines" "$log_dir/$job.log"
}

# w_stop LOG_DIR GRACE JOB...: SIGTERM to each running JOB's session leader (forwarded to the program), SIGKILL to
# its whole process group after GRACE seconds.
w_stop() {
  local log_dir="$1" grace="$2" job
  shift 2
  local running=()
  for job in "$@"; do
    if w_alive "$log_dir" "$job"; then
      kill -TERM "$(cat "$log_dir/$job.pid")" 2>/dev/null || true
      running+=("$job")
    fi
  done
  local deadline=$(( SECONDS + grace ))
  for job in "${running[@]}"; do
    while w_alive "$log_dir" "$job" && (( SECONDS < deadline )); do
      sleep 1
    done
    if w_alive "$log_dir" "$job"; then
      kill -KILL -- "-$(cat "$log_dir/$job.pid")" 2>/dev/null || true
      echo "$job: killed (still running ${grace} s after SIGTERM)"
    else
      echo "$job: stopped (exit $(cat "$log_dir/$job.exit" 2>/dev/null || echo '?'))"
    fi
  done
  for job in "$@"; do
    [[ " ${running[*]} " == *" $job "* ]] || w_state "$log_dir" "$job"
  done
}

# w_health URL: what URL/health answers (from this worker), or a failure.
w_health() {
  local repo="$1" venv="$2" url="$3"
  (cd "$repo" && "$HOME/$venv/bin/python" - "$url" <<'PY'
import json, sys, urllib.request

with urllib.request.urlopen(sys.argv[1] + "/health", timeout=10) as r:
  health = json.load(r)
print(f"reaches {sys.argv[1]}: {health['retriever']}, {health['num_passages']} passages")
PY
  )
}

# w_wait_health REPO_DIR VENV LOG_DIR PORT TIMEOUT: wait until the local retriever answers, or its process dies.
w_wait_health() {
  local repo="$1" venv="$2" log_dir="$3" port="$4" timeout="$5" start=$SECONDS
  until w_health "$repo" "$venv" "http://127.0.0.1:$port" >/dev/null 2>&1; do
    if ! w_alive "$log_dir" retriever; then
      echo "error: the retriever exited; the end of $log_dir/retriever.log:"
      tail -n 20 "$log_dir/retriever.log"
      return 1
    fi
    if (( SECONDS - start > timeout )); then
      echo "error: the retriever did not answer on port $port within $timeout s; see $log_dir/retriever.log"
      return 1
    fi
    sleep 2
  done
  echo "retriever up after $(( SECONDS - start )) s"
}

WORKER_FUNCTIONS=(w_version w_supported w_expand w_alive w_setup w_stage_gs w_stage_prepare w_stage_finish w_exec
                  w_launch w_state w_status w_record w_logs w_stop w_health w_wait_health)

# ----------------------------------------------------------------------------------------------------------------
# This machine's side.

dry() { [[ "${DRY_RUN:-0}" == 1 ]]; }

# sh_quote WORD: WORD in single quotes for a POSIX shell (the workers' login shell reads the remote command).
sh_quote() {
  local q="'\\''"
  printf "'%s'" "${1//\'/$q}"
}

# remote FUNCTION ARGS...: the command line that runs FUNCTION ARGS with bash on a worker (errors stop it).
remote() {
  local script
  script="$(declare -f "${WORKER_FUNCTIONS[@]}")"$'\n'"set -euo pipefail; exec 2>&1; cd; $(printf '%q ' "$@")"
  printf 'bash -c %s' "$(sh_quote "$script")"
}

# tpu_vm SUBCOMMAND ARGS...: gcloud compute tpus tpu-vm SUBCOMMAND ARGS --zone=ZONE [--project=PROJECT].
tpu_vm() {
  local cmd=("$GCLOUD" compute tpus tpu-vm "$@" --zone="$ZONE")
  if [[ -n "${PROJECT:-}" ]]; then
    cmd+=(--project="$PROJECT")
  fi
  if dry; then
    printf '%q ' "${cmd[@]}"
    printf '\n'
    return 0
  fi
  "${cmd[@]}"
}

# on WORKER FUNCTION ARGS...: FUNCTION on WORKER (all, or a number); each output line as "worker N: line".
on() {
  local worker="$1"
  shift
  local command
  command="$(remote "$@")"
  if dry; then
    tpu_vm ssh "$TPU" --worker="$worker" --command="$command"
    return 0
  fi
  if [[ "$worker" != all ]]; then
    local code=0
    tpu_vm ssh "$TPU" --worker="$worker" --command="$command" | sed -u "s/^/worker $worker: /" || code=$?
    return "$code"
  fi
  local out code=0 file
  out="$(mktemp -d -t tpu_pod_XXXXXX)"
  tpu_vm ssh "$TPU" --worker=all --command="$command" --output-directory="$out" || code=$?
  local files=()
  shopt -s nullglob
  files=("$out"/*.log)
  shopt -u nullglob
  for file in $( (( ${#files[@]} )) && printf '%s\n' "${files[@]##*/}" | sort -n); do
    sed "s/^/worker ${file%.log}: /" "$out/$file"
  done
  rm -rf "$out"
  return "$code"
}

# The package's Python range, from pyproject.toml's requires-python (">=3.11,<3.14").
python_range() {
  local spec
  spec="$(sed -n 's/^requires-python = "\(.*\)"$/\1/p' "$REPO_ROOT/pyproject.toml")"
  [[ "$spec" =~ ^\>=([0-9]+\.[0-9]+),\<([0-9]+\.[0-9]+)$ ]] || die "pyproject.toml's requires-python is '$spec'; expected >=X.Y,<X.Z"
  PYTHON_MIN="${BASH_REMATCH[1]}"
  PYTHON_BELOW="${BASH_REMATCH[2]}"
}

verb_setup() {
  (( $# == 0 )) || die "setup takes no arguments"
  python_range
  local tarball="agent_r1_jax_code.tar.gz" local_tar
  # The checkout as this machine has it: tracked files and untracked ones git does not ignore.
  if dry; then
    echo "# git ls-files -z --cached --others --exclude-standard | tar --null -T - -czf TMP/$tarball"
    local_tar="TMP/$tarball"
  else
    local_tar="$(mktemp -d -t tpu_pod_XXXXXX)/$tarball"
    (cd "$REPO_ROOT" && git ls-files -z --cached --others --exclude-standard \
       | tar --null -T - -czf "$local_tar") || die "could not pack the checkout (setup needs a git checkout)"
    echo "copying the checkout ($(du -h "$local_tar" | cut -f1)) to every worker" >&2
  fi
  tpu_vm scp "$local_tar" "$TPU:$tarball" --worker=all
  dry || rm -rf "$(dirname "$local_tar")"
  echo "setting up every worker (the first time, pip installs JAX's TPU build and the pins: minutes)" >&2
  on all w_setup "$tarball" "$REPO_DIR" "$VENV" "$LOG_DIR" "$PYTHON_MIN" "$PYTHON_BELOW" "${UV_PYTHON:-3.11}" \
     "${INSTALL_UV:-1}"
}

verb_stage() {
  local worker=all
  if [[ "${1:-}" == --worker=* ]]; then
    worker="${1#--worker=}"
    shift
  fi
  (( $# == 2 )) || die "stage takes [--worker=W] SRC DEST"
  local src="$1" dest="${2#"~/"}"
  if [[ "$src" == gs://* ]]; then
    on "$worker" w_stage_gs "$VENV" "$REPO_DIR" "$src" "$dest"
  else
    [[ -e "$src" ]] || dry || die "$src does not exist here (a local SRC is copied from this machine; use gs://... for a bucket)"
    on "$worker" w_stage_prepare "$dest"
    tpu_vm scp --recurse "$src" "$TPU:$dest.partial" --worker="$worker"
    on "$worker" w_stage_finish "$dest"
  fi
}

verb_exec() {
  local worker=all
  while (( $# )); do
    case "$1" in
      --worker=*) worker="${1#--worker=}"; shift ;;
      --) shift; break ;;
      *) die "exec: expected [--worker=W] -- COMMAND..., got '$1'" ;;
    esac
  done
  (( $# )) || die "exec needs a COMMAND after --"
  on "$worker" w_exec "$REPO_DIR" "$VENV" "$@"
}

verb_retriever() {
  local port=8000 args=("$@") i
  for (( i = 0; i < ${#args[@]}; i++ )); do
    case "${args[i]}" in
      --port=*) port="${args[i]#--port=}" ;;
      --port) port="${args[i + 1]:-}" ;;
      --host|--host=*) die "retriever binds every interface itself (--host 0.0.0.0); leave --host out" ;;
    esac
  done
  [[ "$port" =~ ^[0-9]+$ ]] || die "retriever: --port must be a number, got '$port'"
  [[ " ${args[*]} " == *" --port"* ]] || args+=(--port "$port")
  on 0 w_launch retriever "$REPO_DIR" "$VENV" "$LOG_DIR" "" -- -m agent_r1_jax.retrieval.server --host 0.0.0.0 \
     "${args[@]}" >&2
  on 0 w_wait_health "$REPO_DIR" "$VENV" "$LOG_DIR" "$port" "${RETRIEVER_WAIT_S:-3600}" >&2
  local ip
  if dry; then
    tpu_vm describe "$TPU" --format='value(networkEndpoints[0].ipAddress)' >&2
    ip=WORKER0_IP
  else
    ip="$(tpu_vm describe "$TPU" --format='value(networkEndpoints[0].ipAddress)')"
    [[ -n "$ip" ]] || die "gcloud describe gave no address for worker 0 of $TPU"
  fi
  on all w_health "$REPO_DIR" "$VENV" "http://$ip:$port" >&2
  echo "http://$ip:$port"
}

# launch JOB MODULE ARGS...: MODULE on every worker, detached; once all started, the command line recorded in its
# --workdir.
launch() {
  local job="$1" module="$2"
  shift 2
  local run="" i
  local args=("$@")
  for (( i = 0; i < ${#args[@]}; i++ )); do
    case "${args[i]}" in
      --workdir=*) run="${args[i]#--workdir=}" ;;
      --workdir) run="${args[i + 1]:-}" ;;
    esac
  done
  if [[ "$job" == train && -z "$run" ]]; then
    die "run needs --workdir=DIR (on a slice of several workers, a directory they all reach: gs://BUCKET/...)"
  fi
  on all w_launch "$job" "$REPO_DIR" "$VENV" "$LOG_DIR" "${RUN_ENV:-}" -- -m "$module" "$@"
  if [[ -n "$run" ]]; then
    on 0 w_record "$REPO_DIR" "$VENV" "$LOG_DIR" "$job" "$run" "$TPU" "$ZONE" -- \
       launch/tpu_pod.sh "$VERB" "$TPU" "$ZONE" "$@"
  fi
}

verb_status() {
  (( $# == 0 )) || die "status takes no arguments"
  on all w_status "$LOG_DIR" "$REPO_DIR" "$VENV"
}

verb_logs() {
  local job=train worker=all lines=20
  while (( $# )); do
    case "$1" in
      train|evaluate|retriever) job="$1" ;;
      --worker=*) worker="${1#--worker=}" ;;
      --lines=*) lines="${1#--lines=}" ;;
      *) die "logs: expected [train|evaluate|retriever] [--worker=W] [--lines=N], got '$1'" ;;
    esac
    shift
  done
  [[ "$lines" =~ ^[0-9]+$ ]] || die "logs: --lines must be a number"
  on "$worker" w_logs "$LOG_DIR" "$job" "$lines"
}

verb_stop() {
  local jobs=("$@") job
  (( ${#jobs[@]} )) || jobs=(train evaluate)
  for job in "${jobs[@]}"; do
    [[ "$job" =~ ^(train|evaluate|retriever)$ ]] || die "stop: jobs are train, evaluate and retriever, got '$job'"
  done
  local grace="${STOP_GRACE_S:-120}"
  [[ "$grace" =~ ^[0-9]+$ ]] || die "STOP_GRACE_S must be a number of seconds, got '$grace'"
  on all w_stop "$LOG_DIR" "$grace" "${jobs[@]}"
}

if [[ $# -ge 1 && ( "$1" == "-h" || "$1" == "--help" ) ]]; then
  usage
  exit 0
fi
if [[ $# -lt 3 ]]; then
  echo "error: need VERB, TPU and ZONE" >&2
  usage >&2
  exit 2
fi
VERB="$1"
TPU="$2"
ZONE="$3"
shift 3

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GCLOUD="${GCLOUD:-gcloud}"
REPO_DIR="${REPO_DIR:-agent_r1_jax}"
VENV="${VENV:-agent_r1_venv}"
LOG_DIR="${LOG_DIR:-agent_r1_logs}"
for name in REPO_DIR VENV LOG_DIR; do
  [[ "${!name}" != /* && "${!name}" != *..* && -n "${!name}" ]] \
    || die "$name must be a path inside the workers' home (relative, no ..), got '${!name}'"
done

case "$VERB" in
  setup) verb_setup "$@" ;;
  stage) verb_stage "$@" ;;
  exec) verb_exec "$@" ;;
  retriever) verb_retriever "$@" ;;
  run) launch train agent_r1_jax.train "$@" ;;
  evaluate) launch evaluate agent_r1_jax.evaluate "$@" ;;
  status) verb_status "$@" ;;
  logs) verb_logs "$@" ;;
  stop) verb_stop "$@" ;;
  *) die "unknown verb '$VERB'; see launch/tpu_pod.sh --help" ;;
esac
