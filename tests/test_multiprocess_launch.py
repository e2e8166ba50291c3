"""The launch environment: `agent_r1_jax.distributed`'s reading of it and the scripts in `launch/` that set it.

The scripts run here with stand-ins for the programs they start (a fake `python` that records its environment
and arguments; fake `srun`/`scontrol` for Slurm), so what is checked is exactly what each script hands to
every process; the real two-process JAX run is in test_multiprocess.py.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import stat
import subprocess

import jax
import pytest

from agent_r1_jax import distributed

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = REPO_ROOT / "launch"
SCRIPTS = ("local_multiprocess.sh", "tpu_pod.sh", "gpu_slurm.sbatch")

# A stand-in interpreter: records JAX_* variables and its arguments (one per line) in $RECORD_DIR, then
# exits with $FAKE_EXIT_<process id> (default 0). Two other behaviours, synchronised through files, not time:
#   "wait_for_term": writes $out.ready once its TERM trap is installed, then waits (up to 300 s, exiting 0); on
#     TERM it writes $out.term and exits 143;
#   "after_ready:N": waits until process 0 has written its .ready file, then exits N.
FAKE_PYTHON = r"""#!/usr/bin/env bash
set -euo pipefail
out="$RECORD_DIR/process_${JAX_PROCESS_ID}"
env | grep -E '^(JAX_|XLA_FLAGS=)' | sort > "$out.env"
printf '%s\n' "$@" > "$out.args"
code_var="FAKE_EXIT_${JAX_PROCESS_ID}"
code="${!code_var:-0}"
if [[ "$code" == wait_for_term ]]; then
  child=""
  trap 'echo TERM > "$out.term"; [[ -n "$child" ]] && kill "$child" 2>/dev/null; exit 143' TERM
  sleep 300 &
  child=$!
  touch "$out.ready"
  wait "$child" || true
  exit 0
fi
if [[ "$code" == after_ready:* ]]; then
  while [[ ! -e "$RECORD_DIR/process_0.ready" ]]; do sleep 0.05; done
  exit "${code#after_ready:}"
fi
exit "$code"
"""


def _executable(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return path


def _read_env(path: pathlib.Path) -> dict[str, str]:
  return dict(line.split("=", 1) for line in path.read_text().splitlines())


def _clean_env(**extra: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_", "AGENT_R1_DISTRIBUTED"))}
  env.pop("XLA_FLAGS", None)
  env.update(extra)
  return env


# --------------------------------------------------------------------------------------------------
# agent_r1_jax.distributed


EXPLICIT = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
SLURM_STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
              "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("environ, expected", [
    ({}, distributed.DistributedPlan("single", num_processes=1, process_id=0)),
    (EXPLICIT, distributed.DistributedPlan("explicit", "10.0.0.1:1234", 4, 3)),
    ({**EXPLICIT, "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"},
     distributed.DistributedPlan("single", num_processes=1, process_id=0)),
    ({**EXPLICIT, "AGENT_R1_DISTRIBUTED": "off"}, distributed.DistributedPlan("single", num_processes=1, process_id=0)),
    (SLURM_STEP, distributed.DistributedPlan("cluster", cluster="slurm")),
    ({**SLURM_STEP, "SLURM_NTASKS": "1"}, distributed.DistributedPlan("single", num_processes=1, process_id=0)),
    # The batch script of an sbatch job (no job step yet): one process, even with --ntasks=2.
    ({k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_NODELIST"},
     distributed.DistributedPlan("single", num_processes=1, process_id=0)),
    ({**SLURM_STEP, **EXPLICIT}, distributed.DistributedPlan("explicit", "10.0.0.1:1234", 4, 3)),
    ({"OMPI_MCA_orte_hnp_uri": "123.0;tcp://10.0.0.1:5000", "OMPI_COMM_WORLD_SIZE": "8"},
     distributed.DistributedPlan("cluster", cluster="ompi")),
    ({"TPU_WORKER_HOSTNAMES": "w-0,w-1,w-2,w-3"}, distributed.DistributedPlan("cluster", cluster="tpu")),
    ({"TPU_WORKER_HOSTNAMES": "w-0"}, distributed.DistributedPlan("single", num_processes=1, process_id=0)),
    ({"AGENT_R1_DISTRIBUTED": "on"}, distributed.DistributedPlan("cluster", cluster="forced")),
])
def test_plan_from_environment(environ, expected):
  assert distributed.plan_from_environment(environ) == expected


@pytest.mark.parametrize("environ, message", [
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS is not set"),
    ({"JAX_NUM_PROCESSES": "2"}, "JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID are not set"),
    ({**EXPLICIT, "JAX_PROCESS_ID": "4"}, r"JAX_PROCESS_ID=4 must be in \[0, JAX_NUM_PROCESSES=4\)"),
    ({**EXPLICIT, "JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is not an integer"),
    ({**EXPLICIT, "JAX_NUM_PROCESSES": "0"}, "JAX_NUM_PROCESSES=0 must be >= 1"),
    ({**EXPLICIT, "JAX_COORDINATOR_ADDRESS": "10.0.0.1"}, "must be host:port"),
    ({"AGENT_R1_DISTRIBUTED": "yes"}, "AGENT_R1_DISTRIBUTED='yes'; use one of"),
])
def test_plan_rejects_inconsistent_environment(environ, message):
  with pytest.raises(ValueError, match=message):
    distributed.plan_from_environment(environ)


def _record_initialize(monkeypatch) -> tuple[list, list]:
  calls, updates = [], []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda name, value: updates.append((name, value)))
  return calls, updates


def test_maybe_initialize_single_process_is_a_no_op(monkeypatch):
  calls, updates = _record_initialize(monkeypatch)
  plan = distributed.maybe_initialize({})
  assert plan.kind == "single" and calls == [] and updates == []


def test_maybe_initialize_explicit_passes_the_environment_and_selects_gloo(monkeypatch):
  calls, updates = _record_initialize(monkeypatch)
  distributed.maybe_initialize({**SLURM_STEP, **EXPLICIT}, initialization_timeout=12)
  # Explicit settings switch JAX's own cluster detection off (it would pin one GPU per Slurm task).
  assert calls == [dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3,
                        cluster_detection_method="deactivate", initialization_timeout=12)]
  assert updates == [("jax_cpu_collectives_implementation", "gloo")]


def test_maybe_initialize_cluster_lets_jax_detect_and_respects_chosen_collectives(monkeypatch):
  calls, updates = _record_initialize(monkeypatch)
  distributed.maybe_initialize({**SLURM_STEP, "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "mpi"})
  assert calls == [dict(initialization_timeout=300)] and updates == []


def test_maybe_initialize_explains_a_late_call(monkeypatch):
  _record_initialize(monkeypatch)

  def late(**kwargs):
    raise RuntimeError("jax.distributed.initialize() must be called before any JAX calls that might initialise "
                       "the XLA backend.")
  monkeypatch.setattr(jax.distributed, "initialize", late)
  with pytest.raises(RuntimeError, match="call it first in main"):
    distributed.maybe_initialize(EXPLICIT)


# --------------------------------------------------------------------------------------------------
# launch/ scripts


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse_and_are_strict(script):
  path = LAUNCH / script
  subprocess.run(["bash", "-n", str(path)], check=True, timeout=10)
  text = path.read_text()
  assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
  assert os.access(path, os.X_OK) or script.endswith(".sbatch")


def test_local_multiprocess_starts_every_process_with_its_environment(tmp_path):
  fake = _executable(tmp_path / "python", FAKE_PYTHON)
  args = ["--config=configs/grpo_multihopqa.py:tiny", "--workdir=/tmp/a dir", "--config.rollout.max_turns=3"]
  env = _clean_env(PYTHON=str(fake), RECORD_DIR=str(tmp_path), LOG_DIR=str(tmp_path / "logs"),
                   DEVICES_PER_PROCESS="2", GPUS_PER_PROCESS="2")
  result = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), "3", *args], env=env,
                          capture_output=True, text=True, timeout=30)
  assert result.returncode == 0, result.stderr
  envs = [_read_env(tmp_path / f"process_{i}.env") for i in range(3)]
  address = envs[0]["JAX_COORDINATOR_ADDRESS"]
  host, port = address.rsplit(":", 1)
  assert host == "127.0.0.1" and port.isdigit()
  for i, e in enumerate(envs):
    assert e["JAX_COORDINATOR_ADDRESS"] == address and e["JAX_NUM_PROCESSES"] == "3"
    assert e["JAX_PROCESS_ID"] == str(i)
    assert e["JAX_LOCAL_DEVICE_IDS"] == f"{2 * i},{2 * i + 1}"
    assert "--xla_force_host_platform_device_count=2" in e["XLA_FLAGS"]
    # What each process would read: the launcher's environment is a valid explicit plan.
    assert distributed.plan_from_environment(e) == distributed.DistributedPlan("explicit", address, 3, i)
    assert (tmp_path / f"process_{i}.args").read_text().splitlines() == ["-m", "agent_r1_jax.train", *args]


def test_local_multiprocess_stops_the_others_and_returns_the_failure(tmp_path):
  """Defects caught: a launcher that waits for the survivors instead of sending them TERM when one process
  fails (process 0 would then finish its wait and write no marker), or that returns 0 / the wrong status."""
  fake = _executable(tmp_path / "python", FAKE_PYTHON)
  env = _clean_env(PYTHON=str(fake), RECORD_DIR=str(tmp_path), LOG_DIR=str(tmp_path / "logs"),
                   FAKE_EXIT_0="wait_for_term", FAKE_EXIT_1="after_ready:3")
  # Process 1 fails once process 0 is waiting with its TERM trap set; the timeout is only a backstop.
  result = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), "2"], env=env, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 3, result.stderr
  assert "exited with status 3" in result.stderr
  # Process 0 was stopped by the launcher's TERM, not left to finish.
  assert (tmp_path / "process_0.term").read_text().strip() == "TERM"


@pytest.mark.parametrize("argv, message", [([], "usage:"), (["0"], "NUM_PROCESSES must be a positive integer")])
def test_local_multiprocess_usage_errors(argv, message):
  result = subprocess.run(["bash", str(LAUNCH / "local_multiprocess.sh"), *argv], env=_clean_env(),
                          capture_output=True, text=True, timeout=10)
  assert result.returncode == 2 and message in result.stderr


def test_gpu_slurm_runs_one_process_per_node_with_the_first_node_as_coordinator(tmp_path):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  _executable(bin_dir / "scontrol", "#!/usr/bin/env bash\nprintf 'gpu-a17\\ngpu-b03\\n'\n")
  # srun stand-in: records its options, then runs the task command once per task with its SLURM_PROCID.
  _executable(bin_dir / "srun", r"""#!/usr/bin/env bash
set -euo pipefail
opts=()
while [[ "$1" == --* ]]; do opts+=("$1"); shift; done
printf '%s\n' "${opts[@]}" > "$RECORD_DIR/srun.opts"
for id in 0 1; do SLURM_PROCID=$id "$@"; done
""")
  fake = _executable(tmp_path / "python", FAKE_PYTHON)
  env = _clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHON=str(fake), RECORD_DIR=str(tmp_path),
                   SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu-a17,gpu-b03", SLURM_JOB_NUM_NODES="2")
  args = ["--config=configs/ppo_multihopqa.py:tiny", "--workdir=/shared/run 1"]
  result = subprocess.run(["bash", str(LAUNCH / "gpu_slurm.sbatch"), *args], env=env, capture_output=True,
                          text=True, timeout=30)
  assert result.returncode == 0, result.stderr
  opts = (tmp_path / "srun.opts").read_text().splitlines()
  assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1"} <= set(opts)
  for i in range(2):
    e = _read_env(tmp_path / f"process_{i}.env")
    assert e["JAX_COORDINATOR_ADDRESS"] == f"gpu-a17:{20000 + 4242 % 20000}"
    assert (e["JAX_NUM_PROCESSES"], e["JAX_PROCESS_ID"]) == ("2", str(i))
    assert (tmp_path / f"process_{i}.args").read_text().splitlines() == ["-m", "agent_r1_jax.train", *args]


def test_gpu_slurm_outside_an_allocation_says_how_to_submit():
  result = subprocess.run(["bash", str(LAUNCH / "gpu_slurm.sbatch")], env=_clean_env(), capture_output=True,
                          text=True, timeout=10)
  assert result.returncode == 2 and "sbatch launch/gpu_slurm.sbatch" in result.stderr
