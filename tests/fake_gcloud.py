"""A stand-in for `gcloud compute tpus tpu-vm` that runs a slice's workers as local processes (the pod rehearsal).

    GCLOUD="python tests/fake_gcloud.py" launch/tpu_pod.sh status agent-r1-v5e-32 us-west4-a

A slice is a directory, `$FAKE_GCLOUD_ROOT/<zone>/<name>/` (made by `create_slice`): `slice.json` (its worker
count, accelerator type and the environment its VM image gives every shell) and one home directory per worker,
`worker-<i>/`. What it understands, and nothing else (anything else exits 2 naming it):

  compute tpus tpu-vm ssh [USER@]TPU --zone=Z [--worker=all|N|N,M|N-M] --command=CMD [--output-directory=DIR]
      CMD runs as `/bin/sh -c CMD` (a POSIX login shell's reading) in each selected worker's home, concurrently
      on all of them, with the image's environment, HOME and, standing in for what JAX reads from a real slice's
      metadata server, JAX_COORDINATOR_ADDRESS (127.0.0.1 and a port free for this call, process 0 hosting it),
      JAX_NUM_PROCESSES and JAX_PROCESS_ID. Like ssh, the call returns once every worker's shell has exited and
      closed its output; then whatever is left in that shell's session is killed, as a closed connection ends
      what it started (only a process that left the session, `setsid`, outlives the call). With
      --output-directory each worker's stdout goes to DIR/<worker>.log, else to this stdout; stderr to this
      stderr. The exit status is the first non-zero one of the workers' shells.
  compute tpus tpu-vm scp [--recurse] SRC... TPU:DEST --zone=Z [--worker=...]
      local SRC to DEST in each worker's home, as scp copies: into DEST when it is a directory, else as DEST.
  compute tpus tpu-vm describe TPU --zone=Z --format=json|'value(networkEndpoints[0].ipAddress)'
      the slice as JSON (`networkEndpoints`: one per worker, all 127.0.0.1), or worker 0's address.

  storage cp [-r] SRC... DEST
      between this machine and a bucket, through gcsfs (on the local Cloud Storage emulator when the environment
      names one, as tests/gcs_emulator.py does; a TPU VM image's gcloud, on the workers' PATH in the rehearsal):
      into DEST when it ends with "/", else as DEST.

`--project=P` is accepted everywhere. With $FAKE_GCLOUD_ROOT set, every call is appended to its calls.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
from typing import Mapping, Sequence

ROOT_VARIABLE = "FAKE_GCLOUD_ROOT"
IP = "127.0.0.1"


class Usage(Exception):
  """A call the real gcloud would refuse, or one this stand-in does not implement."""


def slice_dir(root: os.PathLike | str, zone: str, name: str) -> pathlib.Path:
  return pathlib.Path(root) / zone / name


def create_slice(root: os.PathLike | str, zone: str, name: str, *, workers: int, accelerator_type: str,
                 env: Mapping[str, str]) -> list[pathlib.Path]:
  """Makes slice `name` in `zone` with `workers` empty homes; `env` is every shell's environment (the VM image's:
  PATH and whatever else the image sets). Returns the homes, worker 0 first."""
  base = slice_dir(root, zone, name)
  base.mkdir(parents=True)
  (base / "slice.json").write_text(json.dumps({"workers": workers, "accelerator_type": accelerator_type,
                                               "env": dict(env)}, indent=1))
  homes = [base / f"worker-{i}" for i in range(workers)]
  for home in homes:
    home.mkdir()
  return homes


def _load(root: pathlib.Path, zone: str | None, name: str) -> tuple[pathlib.Path, dict]:
  if not zone:
    raise Usage("--zone is required (the fake has no configured compute/zone)")
  name = name.split("@", 1)[-1]
  base = slice_dir(root, zone, name)
  if not (base / "slice.json").is_file():
    raise Usage(f"ERROR: (gcloud.compute.tpus.tpu-vm) NOT_FOUND: {name} in {zone}")
  return base, json.loads((base / "slice.json").read_text())


def _workers(spec: str, count: int) -> list[int]:
  """`all`, `N`, `N,M,...` or `N-M`, as gcloud's --worker reads them."""
  if spec == "all":
    return list(range(count))
  chosen = []
  for part in spec.split(","):
    low, _, high = part.partition("-")
    if not low.isdigit() or (high and not high.isdigit()):
      raise Usage(f"--worker={spec}: expected all, a number, a comma-separated list or a range")
    chosen.extend(range(int(low), int(high or low) + 1))
  for worker in chosen:
    if not 0 <= worker < count:
      raise Usage(f"--worker={spec}: the slice has workers 0..{count - 1}")
  return chosen


def _free_port() -> int:
  with socket.socket() as s:
    s.bind((IP, 0))
    return s.getsockname()[1]


def _pump(stream, sink, lock: threading.Lock) -> None:
  for chunk in iter(lambda: stream.read1(65536), b""):
    with lock:
      sink.write(chunk)
      sink.flush()
  stream.close()


def ssh(root: pathlib.Path, args: argparse.Namespace) -> int:
  if args.command is None:
    raise Usage("an interactive session is not rehearsed: pass --command")
  base, config = _load(root, args.zone, args.tpu)
  chosen = _workers(args.worker, config["workers"])
  out_dir = pathlib.Path(args.output_directory) if args.output_directory else None
  if out_dir is not None and not out_dir.is_dir():
    raise Usage(f"--output-directory={out_dir} must already exist")
  port = _free_port()
  lock = threading.Lock()
  running = []
  for worker in chosen:
    home = base / f"worker-{worker}"
    env = {**config["env"], "HOME": str(home), "USER": "rehearsal", "LOGNAME": "rehearsal",
           "JAX_COORDINATOR_ADDRESS": f"{IP}:{port}", "JAX_COORDINATOR_BIND_ADDRESS": f"{IP}:{port}",
           "JAX_NUM_PROCESSES": str(config["workers"]), "JAX_PROCESS_ID": str(worker)}
    proc = subprocess.Popen(["/bin/sh", "-c", args.command], cwd=home, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    sink = open(out_dir / f"{worker}.log", "wb") if out_dir else sys.stdout.buffer  # pylint: disable=consider-using-with
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, sink, lock)),
             threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, lock))]
    for pump in pumps:
      pump.start()
    running.append((proc, pumps, sink))
  status = 0
  for proc, pumps, sink in running:
    for pump in pumps:  # the shell and everything that kept its output open are done with it
      pump.join()
    code = proc.wait()
    status = status or code
    if sink is not sys.stdout.buffer:
      sink.close()
    try:  # the connection closes: what is left in the shell's session goes with it
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  return status


def _copy(src: pathlib.Path, target: pathlib.Path, recurse: bool) -> None:
  if src.is_dir() and not recurse:
    raise Usage(f"{src}: not a regular file (pass --recurse to copy a directory)")
  if target.is_dir():
    target = target / src.name
  if not target.parent.is_dir():
    raise Usage(f"scp: {target.parent}: No such file or directory")
  if src.is_dir():
    shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
  else:
    shutil.copy2(src, target)


def scp(root: pathlib.Path, args: argparse.Namespace) -> int:
  *sources, dest = args.paths
  if not sources:
    raise Usage("scp needs SRC... and TPU:DEST")
  if ":" not in dest or any(":" in s for s in sources):
    raise Usage("the fake copies from this machine to the workers only: SRC... TPU:DEST")
  name, _, remote = dest.partition(":")
  base, config = _load(root, args.zone, name)
  if remote.startswith("/"):
    raise Usage(f"{remote}: the rehearsal's workers take paths inside their homes")
  remote = remote[2:] if remote.startswith("~/") else remote
  for worker in _workers(args.worker, config["workers"]):
    home = base / f"worker-{worker}"
    for src in sources:
      path = pathlib.Path(src)
      if not path.exists():
        raise Usage(f"{src}: No such file or directory")
      _copy(path, home / remote if remote else home, args.recurse)
  return 0


def describe(root: pathlib.Path, args: argparse.Namespace) -> int:
  _, config = _load(root, args.zone, args.tpu)
  resource = {"name": args.tpu, "acceleratorType": config["accelerator_type"], "state": "READY",
              "health": "HEALTHY", "networkEndpoints": [{"ipAddress": IP, "port": 8470}] * config["workers"]}
  if args.format == "json":
    print(json.dumps(resource, indent=2))
  elif args.format == "value(networkEndpoints[0].ipAddress)":
    print(resource["networkEndpoints"][0]["ipAddress"])
  else:
    raise Usage(f"--format={args.format!r} is not rehearsed (json, value(networkEndpoints[0].ipAddress))")
  return 0


def storage_cp(argv: Sequence[str]) -> int:
  """`gcloud storage cp [-r] SRC... DEST` between local paths and gs:// (see the module docstring)."""
  parser = argparse.ArgumentParser(prog="gcloud storage cp", exit_on_error=False, add_help=False)
  parser.add_argument("-r", "--recursive", action="store_true")
  parser.add_argument("paths", nargs="+")
  args = parser.parse_args(argv)
  *sources, dest = args.paths
  if not sources:
    raise Usage("storage cp needs SRC... and DEST")
  import fsspec  # pylint: disable=import-outside-toplevel  (the gcloud subcommands above need only the stdlib)
  gcs = fsspec.filesystem("gs")
  for src in sources:
    remote_src = src.startswith("gs://")
    if remote_src == dest.startswith("gs://"):
      raise Usage("the fake copies between this machine and a bucket only")
    name = src.rstrip("/").rsplit("/", 1)[-1]
    target = dest + name if dest.endswith("/") else dest
    if remote_src:
      files = [f for f in gcs.find(src) if not f.endswith("/")]
      if not files:
        raise Usage(f"{src}: no URLs matched")
      prefix = src[len("gs://"):].rstrip("/")
      if files != [prefix] and not args.recursive:
        raise Usage(f"{src} is a folder: pass -r")
      for f in files:
        local = pathlib.Path(target) / f[len(prefix) + 1:] if files != [prefix] else pathlib.Path(target)
        local.parent.mkdir(parents=True, exist_ok=True)
        gcs.get_file(f, str(local))
    else:
      path = pathlib.Path(src)
      if not path.exists():
        raise Usage(f"{src}: No such file or directory")
      if path.is_dir() and not args.recursive:
        raise Usage(f"{src} is a folder: pass -r")
      files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
      for f in files:
        gcs.put_file(str(f), target + ("/" + f.relative_to(path).as_posix() if path.is_dir() else ""))
  return 0


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="gcloud compute tpus tpu-vm", exit_on_error=False, add_help=False)
  commands = parser.add_subparsers(dest="subcommand", required=True)
  common = argparse.ArgumentParser(add_help=False, exit_on_error=False)
  common.add_argument("--zone")
  common.add_argument("--project")
  p = commands.add_parser("ssh", parents=[common], exit_on_error=False, add_help=False)
  p.add_argument("tpu")
  p.add_argument("--worker", default="0")
  p.add_argument("--command")
  p.add_argument("--output-directory")
  p.set_defaults(handler=ssh)
  p = commands.add_parser("scp", parents=[common], exit_on_error=False, add_help=False)
  p.add_argument("paths", nargs="+")
  p.add_argument("--worker", default="0")
  p.add_argument("--recurse", action="store_true")
  p.set_defaults(handler=scp)
  p = commands.add_parser("describe", parents=[common], exit_on_error=False, add_help=False)
  p.add_argument("tpu")
  p.add_argument("--format", default="json")
  p.set_defaults(handler=describe)
  return parser


# What each subcommand accepts, for tests that hold it to the real gcloud's reference.
FLAGS = {("compute", "tpus", "tpu-vm", "ssh"): ("--zone", "--project", "--worker", "--command", "--output-directory"),
         ("compute", "tpus", "tpu-vm", "scp"): ("--zone", "--project", "--worker", "--recurse"),
         ("compute", "tpus", "tpu-vm", "describe"): ("--zone", "--project", "--format"),
         ("storage", "cp"): ("--recursive",)}


def main(argv: Sequence[str]) -> int:
  root = os.environ.get(ROOT_VARIABLE)
  if root:
    with open(pathlib.Path(root) / "calls.jsonl", "a", encoding="utf-8") as log:
      log.write(json.dumps(list(argv)) + "\n")
  try:
    if list(argv[:2]) == ["storage", "cp"]:
      return storage_cp(argv[2:])
    if list(argv[:3]) != ["compute", "tpus", "tpu-vm"]:
      raise Usage(f"`{' '.join(argv)}` is not rehearsed (compute tpus tpu-vm ssh|scp|describe, storage cp)")
    if not root:
      raise Usage(f"set {ROOT_VARIABLE} to the directory of the rehearsal's slices")
    args = _parser().parse_args(argv[3:])
    return args.handler(pathlib.Path(root), args)
  except (Usage, argparse.ArgumentError) as e:
    print(f"fake gcloud: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
