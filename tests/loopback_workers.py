"""Runs a test script as N JAX processes on 127.0.0.1 (one CPU device each): a multi-host pod in miniature.

Each worker gets the environment `agent_r1_jax.distributed.maybe_initialize` reads, with the coordinator bound
to loopback only; the whole run is bounded by `timeout_s`, after which workers are killed and the test fails
with their log tails.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def worker_env(process_id: int, num_processes: int, port: int) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if "_proxy" not in k.lower()}  # gRPC must not proxy loopback
  env.update({
      "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
      "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}",  # loopback only (JAX binds [::] by default)
      "JAX_NUM_PROCESSES": str(num_processes),
      "JAX_PROCESS_ID": str(process_id),
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
      "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
  })
  for name in ("AGENT_R1_DISTRIBUTED", "JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
    env.pop(name, None)
  return env


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> None:
  """Waits for every process, together at most `timeout_s`; kills (and reaps) whichever is still running then."""
  deadline = time.monotonic() + timeout_s
  try:
    for p in procs:
      p.wait(timeout=max(deadline - time.monotonic(), 1.0))
  except subprocess.TimeoutExpired:
    pass
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def run_workers(script: str, out_dir: pathlib.Path, *, num_processes: int, timeout_s: float) -> None:
  """Runs `python script out_dir` as `num_processes` workers; asserts every one exits 0 in time."""
  port = free_port()
  # pylint: disable-next=consider-using-with
  logs = [open(out_dir / f"worker_{i}.log", "w+", encoding="utf-8") for i in range(num_processes)]
  procs = [subprocess.Popen([sys.executable, script, str(out_dir)], env=worker_env(i, num_processes, port),
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT) for i, log in enumerate(logs)]
  wait_all(procs, timeout_s)
  outputs = []
  for log in logs:
    log.seek(0)
    outputs.append(log.read()[-3000:])
    log.close()
  codes = [p.returncode for p in procs]
  assert codes == [0] * num_processes, (f"worker exit codes {codes} (negative = killed at the {timeout_s} s "
                                        "bound); logs:\n" + "\n-----\n".join(outputs))
