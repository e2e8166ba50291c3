"""Multi-process (multi-controller) JAX start-up, configured by the launcher's environment.

On a pod or cluster every host runs the same program (`python -m agent_r1_jax.train ...`) as one JAX
process; `jax.distributed.initialize` connects them through a coordinator on process 0 so that a
`jax.sharding.Mesh` can span every process's devices. `maybe_initialize()` must run before anything touches
a JAX backend (`jax.devices()`, a computation, `device_put`), i.e. first thing in `main`.

Environment read here (the launch scripts in `launch/` set it):

  JAX_COORDINATOR_ADDRESS  `host:port` of process 0's coordinator; every process passes the same value.
  JAX_NUM_PROCESSES        total number of processes; 1 (or unset, with no cluster below) = single process.
  JAX_PROCESS_ID           this process's index, 0 .. JAX_NUM_PROCESSES - 1 (process 0 hosts the coordinator).
  JAX_LOCAL_DEVICE_IDS     optional, e.g. `0,1`: the local accelerators this process may use (read by JAX).
  AGENT_R1_DISTRIBUTED     `auto` (default) | `on` | `off`:
                             auto  initialize when the three variables above describe more than one process, or
                                   when a cluster that `jax.distributed.initialize()` configures by itself is
                                   present: a Slurm job step with more than one task (run under `srun`), an
                                   Open MPI job with more than one rank (`mpirun`), or a multi-host TPU slice
                                   that names its workers (`TPU_WORKER_HOSTNAMES` / `TPU_PROCESS_ADDRESSES`).
                             on    always initialize; with the explicit variables unset this calls
                                   `jax.distributed.initialize()` with no arguments, which on a Cloud TPU VM
                                   pod reads the slice's topology from the metadata server.
                             off   never initialize (one process, whatever else is set).
  AGENT_R1_HEARTBEAT_TIMEOUT_S  optional, seconds without a heartbeat after which the coordinator declares a
                           process dead and every other process stops (jax.distributed's heartbeat_timeout_seconds,
                           default 100): how long the survivors of a dead process wait before they exit.

With explicit variables, JAX's own cluster detection is switched off, so a process sees all of its local
devices (under Slurm, JAX would otherwise restrict each process to the one GPU numbered `SLURM_LOCALID`).
On CPU the cross-process collectives are Gloo over TCP (`jax_cpu_collectives_implementation="gloo"`) unless
`JAX_CPU_COLLECTIVES_IMPLEMENTATION` names another; without them a CPU mesh cannot span processes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping

import jax

MODE_VARIABLE = "AGENT_R1_DISTRIBUTED"
HEARTBEAT_VARIABLE = "AGENT_R1_HEARTBEAT_TIMEOUT_S"
MODES = ("auto", "on", "off")
_EXPLICIT = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
# What jax.distributed's Slurm detection needs (jax/_src/clusters/slurm_cluster.py).
_SLURM_REQUIRED = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistributedPlan:
  """What the environment asks for.

  Attributes:
    kind: "single" (no initialization), "explicit" (the JAX_* variables), or "cluster" (JAX detects
      coordinator, process count and id itself: Slurm, Open MPI, Cloud TPU).
    coordinator_address: `host:port` for "explicit", else None.
    num_processes: process count for "explicit" (1 for "single"), None when JAX detects it.
    process_id: this process's index for "explicit" (0 for "single"), None when JAX detects it.
    cluster: for "cluster", which environment was recognised ("slurm", "ompi", "tpu", or "forced" for
      AGENT_R1_DISTRIBUTED=on with nothing recognised); else None.
  """
  kind: str
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  cluster: str | None = None


def _int_variable(environ: Mapping[str, str], name: str) -> int:
  value = environ[name]
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"{name}={value!r} is not an integer; set it to a whole number") from None


def _detect_cluster(environ: Mapping[str, str]) -> str | None:
  """The multi-process cluster JAX can configure by itself, if this process runs in one."""
  if all(name in environ for name in _SLURM_REQUIRED):
    tasks = environ.get("SLURM_STEP_NUM_TASKS", environ["SLURM_NTASKS"])
    if tasks.isdigit() and int(tasks) > 1:
      return "slurm"
  ranks = environ.get("OMPI_COMM_WORLD_SIZE", "1")
  if "OMPI_MCA_orte_hnp_uri" in environ and ranks.isdigit() and int(ranks) > 1:
    return "ompi"
  workers = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES") or ""
  if len([w for w in workers.split(",") if w.strip()]) > 1:
    return "tpu"
  return None


def plan_from_environment(environ: Mapping[str, str] | None = None) -> DistributedPlan:
  """Reads the variables documented in the module docstring; raises ValueError on inconsistent settings.

  Pure: it neither initializes nor touches a JAX backend, so launchers and tests can call it freely.
  """
  environ = os.environ if environ is None else environ
  mode = environ.get(MODE_VARIABLE, "auto").strip().lower() or "auto"
  if mode not in MODES:
    raise ValueError(f"{MODE_VARIABLE}={environ[MODE_VARIABLE]!r}; use one of {MODES}")
  if mode == "off":
    return DistributedPlan("single", num_processes=1, process_id=0)

  present = [name for name in _EXPLICIT if environ.get(name)]
  if "JAX_NUM_PROCESSES" in present or "JAX_PROCESS_ID" in present:
    missing = [name for name in _EXPLICIT if name not in present]
    num_processes = _int_variable(environ, "JAX_NUM_PROCESSES") if "JAX_NUM_PROCESSES" in present else None
    if num_processes is not None and num_processes < 1:
      raise ValueError(f"JAX_NUM_PROCESSES={num_processes} must be >= 1")
    if num_processes == 1 and mode == "auto":
      return DistributedPlan("single", num_processes=1, process_id=0)
    if missing:
      raise ValueError(f"a multi-process run needs {', '.join(_EXPLICIT)}; {', '.join(missing)} "
                       f"{'is' if len(missing) == 1 else 'are'} not set (launch/local_multiprocess.sh sets all three)")
    process_id = _int_variable(environ, "JAX_PROCESS_ID")
    if not 0 <= process_id < num_processes:
      raise ValueError(f"JAX_PROCESS_ID={process_id} must be in [0, JAX_NUM_PROCESSES={num_processes})")
    address = environ["JAX_COORDINATOR_ADDRESS"]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
      raise ValueError(f"JAX_COORDINATOR_ADDRESS={address!r} must be host:port, e.g. 10.0.0.1:12355")
    return DistributedPlan("explicit", coordinator_address=address, num_processes=num_processes,
                           process_id=process_id)

  cluster = _detect_cluster(environ)
  if cluster is not None:
    return DistributedPlan("cluster", cluster=cluster)
  if mode == "on":
    return DistributedPlan("cluster", cluster="forced")
  return DistributedPlan("single", num_processes=1, process_id=0)


def maybe_initialize(environ: Mapping[str, str] | None = None, *, initialization_timeout: int = 300
                     ) -> DistributedPlan:
  """Calls `jax.distributed.initialize` when the environment describes a multi-process run; else nothing.

  Must run before any JAX backend is created. Calling it again after a successful initialization is a no-op.

  Args:
    environ: the environment to read (default `os.environ`).
    initialization_timeout: seconds each process waits for all processes to connect to the coordinator.

  Returns:
    The plan that was followed (`kind == "single"` means nothing was initialized).
  """
  environ = os.environ if environ is None else environ
  plan = plan_from_environment(environ)
  if plan.kind == "single" or jax.distributed.is_initialized():
    return plan
  if not environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
    # Cross-process CPU collectives; inert for accelerator backends. Must precede the CPU client's creation.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if plan.kind == "explicit":
    kwargs = dict(coordinator_address=plan.coordinator_address, num_processes=plan.num_processes,
                  process_id=plan.process_id, cluster_detection_method="deactivate")
  else:
    kwargs = {}
  if environ.get(HEARTBEAT_VARIABLE):
    heartbeat = _int_variable(environ, HEARTBEAT_VARIABLE)
    if heartbeat < 1:
      raise ValueError(f"{HEARTBEAT_VARIABLE}={heartbeat} must be >= 1 (seconds)")
    kwargs["heartbeat_timeout_seconds"] = heartbeat
  logger.info("jax.distributed.initialize: %s", plan)
  try:
    jax.distributed.initialize(initialization_timeout=initialization_timeout, **kwargs)
  except RuntimeError as e:
    if "before" in str(e):  # JAX refuses once a backend exists
      raise RuntimeError("agent_r1_jax.distributed.maybe_initialize() must run before any JAX call that creates "
                         "a backend (jax.devices(), device_put, a computation); call it first in main") from e
    raise
  except ValueError as e:  # "on" with no cluster JAX recognises: coordinator/process count unknown
    raise ValueError(f"jax.distributed.initialize could not configure itself ({e}); set JAX_COORDINATOR_ADDRESS, "
                     f"JAX_NUM_PROCESSES and JAX_PROCESS_ID, or {MODE_VARIABLE}=off for one process") from e
  return plan
