"""The pod rehearsal: `launch/tpu_pod.sh` drives a four-worker slice whose workers are local processes, through
docs/tpu.md's own commands, and the guide's every command is either run here or marked cloud-only.

What is real: the script and everything it sends to the workers (setup's copy of the checkout and its Python and
package checks; `stage` from a bucket and from this machine; `exec`; the retrieval server started detached on
worker 0 and reached from every worker; `run` and `evaluate` detached on every worker; `status`, `logs`, `stop`);
JAX multi-controller over the four processes (`jax.distributed`, Gloo collectives on CPU); the trainer, its orbax
checkpoints and the evaluation in a gs:// workdir on the local Cloud Storage emulator (tests/gcs_emulator.py);
`prepare_multihopqa`, the memory-mapped BM25 build and the HTTP retrieval server.

What stands in (tests/fake_gcloud.py): gcloud itself (workers are processes with a home directory each, every
worker's address is 127.0.0.1, and each worker's environment names the JAX coordinator where a real slice's
metadata server would; its `gcloud storage cp` goes to the emulator); the downloads, whose results the test puts
on worker 0 (a 1-layer Qwen2-architecture checkpoint under Qwen2.5-3B-Instruct's name, a synthetic world's questions
in the three releases' file formats, its passages as DPR's psgs_w100.tsv.gz); the VM image, which carries a
ready environment at the venv's path (a link to this interpreter's), so `setup` installs nothing in the rehearsal:
its provisioning of a Python for a worker whose python3 is 3.10 is tested separately, with a stand-in uv and curl;
and the TPU (JAX runs on each worker's CPU).

Preemption, rehearsed: once a checkpoint past step 0 is in the bucket, worker 2's whole process group is
SIGKILLed (its machine going away); the other three exit by themselves within the heartbeat timeout (shortened
with AGENT_R1_HEARTBEAT_TIMEOUT_S); `status` tells them apart; `stop` cleans up; the same `run` again resumes, and
the run ends with the metrics and the exported weights of an uninterrupted four-worker run of the same command.
Then `evaluate` on the four workers writes byte for byte what one process writes.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

import fake_gcloud
from gcs_emulator import running_emulator, use_in_this_process

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = "launch/tpu_pod.sh"
GUIDE = REPO / "docs" / "tpu.md"
FAKE = pathlib.Path(fake_gcloud.__file__).resolve()

# docs/tpu.md's names (section 0): the rehearsal answers to them.
TPU, ZONE, BUCKET_NAME = "agent-r1-v5e-32", "us-west4-a", "my-agent-r1-bucket"
BUCKET = f"gs://{BUCKET_NAME}"
WORKERS = 4
RUN = f"{BUCKET}/runs/grpo-qwen2.5-3b"
UNINTERRUPTED = f"{BUCKET}/runs/grpo-uninterrupted"
HEARTBEAT_S = 20
TOTAL_STEPS = 8  # after the first (compiling) step they take seconds: room for the kill to land mid-run

# The rehearsal's configuration: the guide's task (prepared multi-hop QA, the staged checkpoint, the retrieval server
# over HTTP) at a micro size; every step saves a checkpoint.
MICRO = ["--config=configs/grpo_multihopqa.py", "--config.data.source=multihopqa",
         "--config.data.prepared_dir=~/data/multihopqa", "--config.model.path=~/models/Qwen2.5-3B-Instruct",
         "--config.tool.retriever=http", "--config.mesh.fsdp=-1", "--config.sft.enabled=False",
         "--config.rollout.max_turns=2", "--config.rollout.max_new_tokens_per_turn=8", "--config.rollout.n_samples=2",
         "--config.trainer.batch_size=4", "--config.trainer.eval_num_examples=4", "--config.trainer.eval_batch_size=4",
         "--config.actor.micro_batch_size_per_device=1", "--config.trainer.progress_bar=False",
         f"--config.trainer.total_steps={TOTAL_STEPS}", "--config.trainer.save_every=1",
         "--config.trainer.eval_every=100", "--config.trainer.length_multiple=0",
         # A random policy earns the same reward on every sample (GRPO's advantages are then 0): the entropy
         # bonus gives every step a gradient, so the weights move and a resume has something to get wrong.
         "--config.actor.entropy_coef=0.01"]


# --------------------------------------------------------------------------------------------------------------
# docs/tpu.md's commands


@dataclasses.dataclass
class GuideCommand:
  text: str             # as written (continuations joined)
  words: list[str]      # after the guide's own variables are expanded
  marker: str | None    # "cloud-only", "recorded" or None (rehearsed)
  reason: str


_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
_MARKER = re.compile(r"^# (cloud-only|recorded): (.+)$")
_VARIABLE = re.compile(r"\$\{?([A-Z_][A-Z0-9_]*)\}?")
_ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$", re.S)
_CAPTURE = re.compile(r"^[A-Z_][A-Z0-9_]*=\$\((.*)\)$")
# What a variable the guide sets from a command's output stands for when its commands are read.
_OUTPUTS = {"RETRIEVER": "http://10.130.0.2:8000"}


def _logical_lines(block: str) -> list[str]:
  """The block's commands: comment lines dropped, backslash continuations and open quotes joined."""
  lines, pending = [], ""
  for line in block.splitlines():
    if not pending and (not line.strip() or line.lstrip().startswith("#")):
      continue
    pending = f"{pending}\n{line}" if pending else line
    if pending.endswith("\\"):
      pending = pending[:-1]
      continue
    try:
      shlex.split(pending)
    except ValueError:  # a quote still open
      continue
    lines.append(" ".join(pending.split("\n")).strip())
    pending = ""
  assert not pending, f"unfinished command in docs/tpu.md: {pending!r}"
  return lines


def guide_commands() -> tuple[list[GuideCommand], dict[str, str]]:
  """Every command of the guide's bash blocks, in order, and the names its first block defines."""
  blocks = _BLOCK.findall(GUIDE.read_text(encoding="utf-8"))
  names: dict[str, str] = dict(_OUTPUTS)
  commands = []
  for index, block in enumerate(blocks):
    match = _MARKER.match(block.splitlines()[0].strip())
    marker, reason = (match.group(1), match.group(2)) if match else (None, "")
    for text in _logical_lines(block):
      captured = _CAPTURE.match(text)  # NAME=$(COMMAND ...): the command is COMMAND
      words = shlex.split(_VARIABLE.sub(lambda m: names.get(m.group(1), m.group(0)),
                                        captured.group(1) if captured else text))
      if index == 0:  # the names: assignments only
        assert all(_ASSIGNMENT.match(w) for w in words), f"the names block holds a command: {text!r}"
        names.update(_ASSIGNMENT.match(w).groups() for w in words)
        continue
      commands.append(GuideCommand(text, words, marker, reason))
  return commands, names


# The words of a script invocation the rehearsal must reproduce: `run` and `evaluate` with their --config flags left
# out (the rehearsal's are its micro model's, the guide's are parsed and validated by
# test_the_guides_run_flags_parse_as_the_cli_parses_them), `retriever` without its --port and --workers (the
# rehearsal's own free port, and two server processes on a 2-core machine).
def rehearsal_core(words: list[str]) -> tuple[str, ...]:
  if words[:1] == [SCRIPT] and len(words) > 1:
    if words[1] in ("run", "evaluate"):
      return tuple(w for w in words if not w.startswith("--config"))
    if words[1] == "retriever":
      return tuple(w for w in words if not w.startswith(("--port=", "--workers=")))
  return tuple(words)


# --------------------------------------------------------------------------------------------------------------
# The slice


def _executable(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return path


def _gcloud_wrapper(bin_dir: pathlib.Path) -> pathlib.Path:
  bin_dir.mkdir(parents=True, exist_ok=True)
  return _executable(bin_dir / "gcloud", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} "$@"\n')


def _script_env(root: pathlib.Path, gcloud: pathlib.Path, **extra: str) -> dict[str, str]:
  """This machine's environment for the script: the stand-in gcloud, and no JAX or launch settings of the test's."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "AGENT_R1_", "XLA_"))}
  env.update(GCLOUD=str(gcloud), FAKE_GCLOUD_ROOT=str(root), **extra)
  return env


class Pod:
  """A stand-in slice and the script's invocations against it (each recorded)."""

  def __init__(self, root: pathlib.Path, homes: list[pathlib.Path], env: dict[str, str]):
    self.root, self.homes, self.env = root, homes, env
    self.ran: list[list[str]] = []

  def sh(self, *words: str, check: bool = True, timeout: float = 900, **env: str) -> subprocess.CompletedProcess:
    argv = [SCRIPT, *words]
    result = subprocess.run(["bash", *argv], cwd=REPO, env={**self.env, **env}, capture_output=True, text=True,
                            timeout=timeout)
    self.ran.append(argv)
    if check:
      assert result.returncode == 0, f"{shlex.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result

  def logs_dir(self, worker: int) -> pathlib.Path:
    return self.homes[worker] / "agent_r1_logs"

  def exit_status(self, worker: int, job: str) -> str | None:
    path = self.logs_dir(worker) / f"{job}.exit"
    return path.read_text().strip() if path.exists() else None

  def alive(self, worker: int, job: str) -> bool:
    """Whether a process of the job's session is alive (zombies, which this machine's init may leave unreaped for a
    while, are not)."""
    return bool(_group_members(int((self.logs_dir(worker) / f"{job}.pid").read_text())))

  def kill_everything(self) -> None:
    """SIGKILL to every job's session on every worker (the test's clean-up, whatever state it ended in)."""
    for home in self.homes:
      for pid_file in (home / "agent_r1_logs").glob("*.pid"):
        try:
          os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
          pass

  def wait(self, what: str, done, *, backstop_s: float = 900) -> None:
    """Polls `done()` (a backstop turns a hang into a failure; nothing here is timed)."""
    deadline = time.monotonic() + backstop_s
    while not done():
      if time.monotonic() > deadline:
        tails = "".join(f"\n--- worker {w}\n" + (self.logs_dir(w) / "train.log").read_text()[-1500:]
                        for w in range(len(self.homes)) if (self.logs_dir(w) / "train.log").exists())
        pytest.fail(f"still waiting for {what}{tails}")
      time.sleep(0.25)

  def wait_finished(self, job: str) -> None:
    workers = range(len(self.homes))
    self.wait(f"{job} to end on every worker",
              lambda: all(self.exit_status(w, job) is not None and not self.alive(w, job) for w in workers))
    codes = [self.exit_status(w, job) for w in range(len(self.homes))]
    assert codes == ["0"] * len(self.homes), "".join(
        f"\n--- worker {w} (exit {c})\n" + (self.logs_dir(w) / f"{job}.log").read_text()[-3000:]
        for w, c in enumerate(codes))


def _group_members(pgid: int) -> list[int]:
  """The live (not zombie) processes of process group `pgid`, from /proc."""
  members = []
  for stat_file in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat_file.read_text().rsplit(")", 1)[1].split()
    except OSError:  # the process ended while we looked
      continue
    if int(fields[2]) == pgid and fields[0] != "Z":  # fields after the command: state, ppid, pgrp, ...
      members.append(int(stat_file.parent.name))
  return members


def _per_worker(output: str) -> dict[int, list[str]]:
  lines: dict[int, list[str]] = {}
  for line in output.splitlines():
    match = re.match(r"^worker (\d+): (.*)$", line)
    if match:
      lines.setdefault(int(match.group(1)), []).append(match.group(2))
  return lines


# --------------------------------------------------------------------------------------------------------------
# What the cloud-only downloads would leave on worker 0


def _stand_ins(home: pathlib.Path, world) -> None:
  """~/models/Qwen2.5-3B-Instruct, ~/raw (the three releases' formats) and ~/data/psgs_w100.tsv.gz on worker 0."""
  import transformers  # pylint: disable=import-outside-toplevel
  from reference_models import random_hf_checkpoint  # pylint: disable=import-outside-toplevel

  tokenizer = transformers.AutoTokenizer.from_pretrained(world.tokenizer_dir)
  model = home / "models" / "Qwen2.5-3B-Instruct"
  random_hf_checkpoint(model, vocab=len(tokenizer), hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1,
                       tie=True, max_positions=4096)
  tokenizer.save_pretrained(model)

  passages = [json.loads(line) for line in world.corpus_path.read_text().splitlines()]
  text = {}
  for p in passages:
    title, body = p["contents"].split("\n", 1)
    text[title.strip('"')] = body
  questions = {s: [json.loads(line) for line in world.split_path(s).read_text().splitlines()]
               for s in ("train", "validation", "test")}

  def hotpot(q):
    return {"_id": q["id"], "question": q["question"], "answer": q["answers"][0], "type": "bridge", "level": "medium",
            "supporting_facts": [[t, 0] for t in q["supporting_titles"]],
            "context": [[t, [text[t]]] for t in q["supporting_titles"]]}

  def musique(q):
    return {"id": f"2hop__{q['id']}", "question": q["question"], "answer": q["answers"][0], "answer_aliases": [],
            "answerable": True, "question_decomposition": [],
            "paragraphs": [{"idx": i, "title": t, "paragraph_text": text[t], "is_supporting": True}
                           for i, t in enumerate(q["supporting_titles"])]}

  raw = home / "raw"
  (raw / "2wiki" / "data").mkdir(parents=True)
  (raw / "musique" / "data").mkdir(parents=True)
  train = questions["train"]
  (raw / "hotpot_train_v1.1.json").write_text(json.dumps([hotpot(q) for q in train[:12]]))
  (raw / "hotpot_dev_distractor_v1.json").write_text(json.dumps([hotpot(q) for q in questions["validation"]]))
  (raw / "2wiki" / "data" / "train.json").write_text(json.dumps([{**hotpot(q), "evidences": []} for q in train[12:]]))
  (raw / "2wiki" / "data" / "dev.json").write_text(
      json.dumps([{**hotpot(q), "evidences": []} for q in questions["test"][:4]]))
  (raw / "musique" / "data" / "musique_ans_v1.0_dev.jsonl").write_text(
      "".join(json.dumps(musique(q)) + "\n" for q in questions["test"][4:]))

  tsv = io.StringIO()
  writer = csv.writer(tsv, delimiter="\t", lineterminator="\n")
  writer.writerow(["id", "text", "title"])
  for i, p in enumerate(passages, start=1):
    title, body = p["contents"].split("\n", 1)
    writer.writerow([i, body, title.strip('"')])
  (home / "data").mkdir()
  with gzip.open(home / "data" / "psgs_w100.tsv.gz", "wt", encoding="utf-8") as f:
    f.write(tsv.getvalue())


# --------------------------------------------------------------------------------------------------------------
# The rehearsal


@pytest.fixture(scope="module")
def emulator_env():
  with running_emulator(BUCKET_NAME) as env:
    yield env


def _comparable(rows):
  return [{k: v for k, v in r.items() if not k.startswith("time/") and "time_" not in k} for r in rows]


@pytest.mark.slow
def test_pod_rehearsal(emulator_env, monkeypatch, tmp_path, synthetic_world, request):
  """Defects caught: a command of the guide that fails or was never run; code that does not reach the workers; a
  run that dies with the ssh session or leaves no per-worker log; a kill that hangs the survivors or that status
  cannot tell from a failure; a resume that does not replay the uninterrupted run (metrics or weights differ: the
  data shard, the random keys or the optimizer state of any worker restored wrongly); evaluation on four workers
  that differs from one process's; a stop that leaves a process behind."""
  use_in_this_process(emulator_env, monkeypatch)
  from agent_r1_jax import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer.actor_checkpoint import checkpoint_steps  # pylint: disable=import-outside-toplevel

  def bucket(path: str):
    """`path` in the bucket as it is now: the workers keep writing, and the gcsfs instance epath holds (not
    `fsspec.filesystem("gs")`: epath makes its own, with other arguments) caches listings."""
    path = workdir_lib.workdir_path(path)
    path._backend.fs(os.fspath(path)).invalidate_cache()  # pylint: disable=protected-access
    return path

  root, bin_dir = tmp_path / "slices", tmp_path / "image-bin"
  root.mkdir()
  gcloud = _gcloud_wrapper(bin_dir)
  image = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "TOKENIZERS_PARALLELISM": "false",
           **{k: v for k, v in os.environ.items() if k.startswith("JAX_PERSISTENT_CACHE") or k == "JAX_COMPILATION_CACHE_DIR"},
           **emulator_env}
  homes = fake_gcloud.create_slice(root, ZONE, TPU, workers=WORKERS, accelerator_type="v5litepod-32", env=image)
  for home in homes:  # the image's ready environment at the venv's path
    (home / "agent_r1_venv").symlink_to(sys.prefix)
  world = synthetic_world(num_train=24, num_validation=4, num_test=8, hop_mix=(("bridge", 1.0),))
  _stand_ins(homes[0], world)
  pod = Pod(root, homes, _script_env(root, gcloud))
  request.addfinalizer(pod.kill_everything)

  # 2. setup: the checkout on every worker, the venv's Python and packages checked.
  out = _per_worker(pod.sh("setup", TPU, ZONE).stdout)
  assert sorted(out) == list(range(WORKERS))
  for w, lines in out.items():
    assert f"ready: Python 3.11" in lines[-1] and f"agent_r1_jax from {homes[w]}/agent_r1_jax/agent_r1_jax" in lines[-1]
  assert (homes[3] / "agent_r1_jax" / SCRIPT).read_bytes() == (REPO / SCRIPT).read_bytes()

  # 3. the model: worker 0 to the bucket, the bucket to every worker.
  pod.sh("exec", TPU, ZONE, "--worker=0", "--", "gcloud", "storage", "cp", "-r", "~/models/Qwen2.5-3B-Instruct",
         f"{BUCKET}/models/")
  pod.sh("stage", TPU, ZONE, f"{BUCKET}/models/Qwen2.5-3B-Instruct", "models/Qwen2.5-3B-Instruct")
  model_files = sorted(p.name for p in (homes[0] / "models" / "Qwen2.5-3B-Instruct").iterdir())
  for home in homes:
    assert sorted(p.name for p in (home / "models" / "Qwen2.5-3B-Instruct").iterdir()) == model_files
  assert "model.safetensors" in model_files

  # 4. the data sets: prepared on worker 0, through the bucket to every worker.
  prepared = pod.sh("exec", TPU, ZONE, "--worker=0", "--", "python", "-m", "agent_r1_jax.data.prepare_multihopqa",
                    "--hotpotqa_train=~/raw/hotpot_train_v1.1.json",
                    "--hotpotqa_dev=~/raw/hotpot_dev_distractor_v1.json",
                    "--twowiki_train=~/raw/2wiki/data/train.json", "--twowiki_dev=~/raw/2wiki/data/dev.json",
                    "--musique_dev=~/raw/musique/data/musique_ans_v1.0_dev.jsonl",
                    "--tokenizer=~/models/Qwen2.5-3B-Instruct", "--output_dir=~/data/multihopqa")
  assert "split train: 24 examples" in prepared.stdout, prepared.stdout
  pod.sh("exec", TPU, ZONE, "--worker=0", "--", "gcloud", "storage", "cp", "-r", "~/data/multihopqa",
         f"{BUCKET}/data/")
  pod.sh("stage", TPU, ZONE, f"{BUCKET}/data/multihopqa", "data/multihopqa")
  assert all((home / "data" / "multihopqa").is_dir() for home in homes)

  # 5. wiki18's stand-in: the index built on worker 0 and kept in the bucket, the server started.
  pod.sh("exec", TPU, ZONE, "--worker=0", "--", "gunzip", "~/data/psgs_w100.tsv.gz")
  pod.sh("exec", TPU, ZONE, "--worker=0", "--", "python", "-m", "agent_r1_jax.retrieval.build_index",
         "--kind=bm25_mmap", "--corpus=~/data/psgs_w100.tsv", "--out=~/data/wiki18_bm25")
  pod.sh("exec", TPU, ZONE, "--worker=0", "--", "gcloud", "storage", "cp", "-r", "~/data/wiki18_bm25",
         f"{BUCKET}/data/")
  port = fake_gcloud._free_port()  # pylint: disable=protected-access
  retriever = pod.sh("retriever", TPU, ZONE, "--index=~/data/wiki18_bm25", "--workers=2", f"--port={port}")
  assert retriever.stdout == f"http://127.0.0.1:{port}\n", retriever.stdout + retriever.stderr
  reached = _per_worker(retriever.stderr)
  for w in range(WORKERS):
    assert f"reaches http://127.0.0.1:{port}: bm25, {len(world.corpus_path.read_text().splitlines())} passages" in reached[w]
  flags = [*MICRO, f"--config.tool.server_url=http://127.0.0.1:{port}"]
  run_env = {"RUN_ENV": f"AGENT_R1_HEARTBEAT_TIMEOUT_S={HEARTBEAT_S}"}

  # The reference: the same run, uninterrupted, on the same four workers.
  pod.sh("run", TPU, ZONE, f"--workdir={UNINTERRUPTED}", *flags, **run_env)
  pod.wait_finished("train")

  # 7. The run, detached: the ssh session is long gone while it trains.
  launched = pod.sh("run", TPU, ZONE, f"--workdir={RUN}", *flags, **run_env)
  assert len(_per_worker(launched.stdout)) == WORKERS and all(pod.alive(w, "train") for w in range(WORKERS))
  record = json.loads((bucket(RUN) / "launches.jsonl").read_text().splitlines()[-1])
  assert record["argv"] == [SCRIPT, "run", TPU, ZONE, f"--workdir={RUN}", *flags] and record["tpu"] == TPU

  # A preemption mid-run: once a checkpoint past step 0 is in the bucket, worker 2 goes away with its whole session.
  # (Not "step 1's" checkpoint: with max_to_keep=3 it may be gone again before a poll of the bucket sees it.)
  pod.wait("a checkpoint past step 0", lambda: max(checkpoint_steps(bucket(RUN)), default=0) >= 1)
  os.killpg(int((pod.logs_dir(2) / "train.pid").read_text()), signal.SIGKILL)
  pod.wait("the other workers to exit on their own",
           lambda: all(pod.exit_status(w, "train") is not None for w in (0, 1, 3)))
  assert not (bucket(RUN) / "hf_export").exists(), "the kill came after the run had finished"

  # 8. Watch: status tells the dead worker from the ones that failed; logs show each worker's end.
  status = _per_worker(pod.sh("status", TPU, ZONE).stdout)
  assert status[2][0].startswith("train: died (no exit status"), status
  for w in (0, 1, 3):
    assert re.match(r"train: failed \(exit \d+", status[w][0]), status
  progress = next(line for line in status[0] if line.startswith("run "))
  assert re.search(r"checkpoints 0( \d+)+$", progress), progress
  logs = _per_worker(pod.sh("logs", TPU, ZONE, "train", "--worker=0", "--lines=50").stdout)
  assert list(logs) == [0] and len(logs[0]) == 50

  # 9. Clean up and start the same command again: it resumes.
  stopped = _per_worker(pod.sh("stop", TPU, ZONE).stdout)
  assert all("train: failed" in " ".join(stopped[w]) for w in (0, 1, 3)) and "died" in stopped[2][0]
  pod.sh("run", TPU, ZONE, f"--workdir={RUN}", *flags, **run_env)
  pod.wait_finished("train")
  resumed_log = (pod.logs_dir(0) / "train.log").read_text()
  assert re.search(r"resuming from \S+ at step [1-9]", resumed_log), resumed_log[-3000:]
  run_dir, reference = bucket(RUN), bucket(UNINTERRUPTED)
  rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  reference_rows = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == list(range(1, TOTAL_STEPS + 1))
  assert _comparable(rows) == _comparable(reference_rows)
  assert all(r["actor/grad_norm"] > 0 for r in rows)  # every step moved the weights
  exported = sorted(p.name for p in (reference / "hf_export").iterdir())
  assert "model.safetensors" in exported and sorted(p.name for p in (run_dir / "hf_export").iterdir()) == exported
  for name in exported:
    assert (run_dir / "hf_export" / name).read_bytes() == (reference / "hf_export" / name).read_bytes(), name
  assert (homes[0] / "models" / "Qwen2.5-3B-Instruct" / "model.safetensors").read_bytes() != (
      run_dir / "hf_export" / "model.safetensors").read_bytes()  # training changed the staged weights
  status = _per_worker(pod.sh("status", TPU, ZONE).stdout)
  assert all(status[w][0].startswith("train: finished") for w in range(WORKERS)), status

  # 10. Evaluate on every worker; the same evaluation in one process (on worker 0) writes the same files.
  pod.sh("evaluate", TPU, ZONE, f"--workdir={RUN}")
  pod.wait_finished("evaluate")
  for w in range(WORKERS):  # four JAX processes, not four independent ones
    assert f"Rank {w} is connected to {WORKERS - 1} peer ranks" in (pod.logs_dir(w) / "evaluate.log").read_text()
  one = f"{RUN}/eval_one_process"
  pod.sh("exec", TPU, ZONE, "--worker=0", "--", "env", "AGENT_R1_DISTRIBUTED=off", "python", "-m",
         "agent_r1_jax.evaluate", f"--workdir={RUN}", f"--out_dir={one}")
  run_dir = bucket(RUN)
  written = sorted(p.name for p in (run_dir / "eval").iterdir())
  assert {"table.md", "results.json", "records.jsonl", "trajectories.html"} <= set(written)
  assert sorted(p.name for p in bucket(one).iterdir()) == written
  for name in written:
    assert (run_dir / "eval" / name).read_bytes() == (bucket(one) / name).read_bytes(), name
  table = (run_dir / "eval" / "table.md").read_text()
  for method in ("Agent (RL)", "Base Tool Call", "Naive RAG", "No Retrieval"):
    assert f"| {method} |" in table, table
  records = [json.loads(line) for line in (run_dir / "eval" / "records.jsonl").read_text().splitlines()]
  assert any("Doc 1 (Title:" in json.dumps(r) for r in records if r.get("method") == "naive_rag")  # the server's

  # 11. Stop everything: no process of any job is left on any worker.
  pod.sh("stop", TPU, ZONE, "train", "evaluate", "retriever")
  for w in range(WORKERS):
    for job in ("train", "evaluate", "retriever"):
      if (pod.logs_dir(w) / f"{job}.pid").exists():
        assert not pod.alive(w, job), (w, job)

  # Every command of the guide outside its cloud-only and recorded blocks ran here, as written.
  commands, _ = guide_commands()
  ran = {rehearsal_core(argv) for argv in pod.ran}
  missing = [c.text for c in commands if c.marker is None and rehearsal_core(c.words) not in ran]
  assert not missing, "docs/tpu.md commands the rehearsal did not run:\n" + "\n".join(missing)


# --------------------------------------------------------------------------------------------------------------
# The guide's commands, read without running them


def test_every_guide_command_is_rehearsed_cloud_only_or_recorded():
  """Defects caught: a guide command in an unmarked block that the rehearsal cannot run (only the script's verbs
  run against the stand-in slice), a marker without its reason, a recorded dry run whose command is not the one that
  wrote the report, and the walk-through out of the order the issue asks for."""
  commands, names = guide_commands()
  assert (names["TPU"], names["ZONE"], names["BUCKET"]) == (TPU, ZONE, BUCKET)
  for c in commands:
    if c.marker is None:
      assert c.words[0] == SCRIPT, f"an unmarked guide command the rehearsal cannot run: {c.text}"
    else:
      assert len(c.reason) > 20, f"say why: {c.marker}: {c.reason}"
    if c.marker == "recorded":
      log = REPO / c.reason.split()[0]
      assert log.is_file(), c.reason
      recorded = shlex.split(log.with_suffix(".cmd").read_text())
      report = f"--config.dry_run_report={log.with_suffix('.json').relative_to(REPO)}"
      assert report in recorded and [w for w in recorded if w != report] == c.words, (c.text, recorded)
  rehearsed = [c.words[1] for c in commands if c.marker is None]
  order = ["setup", "stage", "retriever", "run", "status", "logs", "stop", "evaluate"]
  assert [v for v in dict.fromkeys(rehearsed) if v in order] == order, rehearsed


def _parse_train_flags(words: list[str]):
  """The config `python -m agent_r1_jax.train` builds from these flags (absl + ml_collections, as the CLI defines
  them, then its check for overrides naming no field), validated."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.cli_config import unknown_override  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer import config as config_lib  # pylint: disable=import-outside-toplevel

  argv = ["train", *words]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  assert unknown_override(argv) is None, unknown_override(argv)
  values(argv)
  config_lib.validate(holder.value)
  return holder.value


def test_the_guides_run_flags_parse_as_the_cli_parses_them(monkeypatch):
  """The rehearsal runs `run` with its own --config flags; the guide's (the paper-scale ones) and the rehearsal's
  are each what the train CLI accepts. Defects caught: a misspelt field, a flag before --config, a value the
  config's validation refuses."""
  monkeypatch.chdir(REPO)
  runs = [c for c in guide_commands()[0] if c.marker is None and c.words[1] == "run"]
  assert runs
  for c in runs:
    config = _parse_train_flags(c.words[4:])
    assert (config.preset, config.data.source, config.tool.retriever) == ("qwen2.5-3b", "multihopqa", "http")
    assert config.model.path == "~/models/Qwen2.5-3B-Instruct" and config.data.prepared_dir == "~/data/multihopqa"
  config = _parse_train_flags([*MICRO, "--config.tool.server_url=http://127.0.0.1:8000"])
  assert config.trainer.save_every == 1 and config.data.source == "multihopqa"


# The gcloud commands the guide and the stand-in use, held to the installed gcloud's own reference.
GCLOUD_COMMANDS = {("compute", "tpus", "tpu-vm", "create"), ("compute", "tpus", "tpu-vm", "delete"),
                   ("compute", "tpus", "queued-resources", "create"), ("compute", "tpus", "queued-resources", "describe"),
                   ("compute", "tpus", "queued-resources", "delete"), ("storage", "buckets", "create"),
                   ("storage", "cat"), ("storage", "cp"), *fake_gcloud.FLAGS}


def test_guide_and_stand_in_gcloud_flags_exist_in_gcloud():
  """Every flag the guide passes to gcloud, and every flag the stand-in accepts, is in the installed gcloud's --help
  for that command (skipped without gcloud). Defects caught: a misspelt or invented flag (the stand-in would take
  anything it was written to take)."""
  gcloud = shutil.which("gcloud")
  if gcloud is None:
    pytest.skip("gcloud is not installed here")
  wanted: dict[tuple[str, ...], set[str]] = {path: set() for path in GCLOUD_COMMANDS}
  for path, accepted in fake_gcloud.FLAGS.items():
    wanted[path].update(accepted)
  for c in guide_commands()[0]:
    words = [w for w in c.words if w != "--"]
    if c.words[0] == SCRIPT and "gcloud" in words:  # gcloud run on a worker through exec
      words = words[words.index("gcloud"):]
    if words[0] != "gcloud":
      continue
    path = next((p for p in GCLOUD_COMMANDS if tuple(words[1:1 + len(p)]) == p), None)
    assert path is not None, f"a gcloud command GCLOUD_COMMANDS does not list: {c.text}"
    wanted[path].update(w.split("=", 1)[0] for w in words if w.startswith("--"))
  ansi = re.compile(r"\x1b\[[0-9;]*m")
  for path, names in wanted.items():
    if not names:
      continue
    result = subprocess.run([gcloud, *path, "--help"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "PAGER": "cat"})
    assert result.returncode == 0, result.stderr
    reference = ansi.sub("", result.stdout)
    for name in names:
      assert re.search(re.escape(name) + r"\b", reference), f"gcloud {' '.join(path)} has no {name}"


# --------------------------------------------------------------------------------------------------------------
# The stand-in, the script's Python provisioning, its dry run, and the settings it relies on


def _slice(tmp_path: pathlib.Path, workers: int, path: str, **env: str) -> tuple[list[pathlib.Path], dict[str, str]]:
  root = tmp_path / "slices"
  root.mkdir()
  gcloud = _gcloud_wrapper(tmp_path / "local-bin")
  homes = fake_gcloud.create_slice(root, ZONE, TPU, workers=workers, accelerator_type="v5litepod-32",
                                   env={"PATH": path, "LANG": "C.UTF-8", **env})
  return homes, _script_env(root, gcloud)


def _running(pid: int) -> bool:
  """Whether process `pid` exists and is not a zombie."""
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def test_the_stand_in_ends_what_a_session_leaves_behind_unless_it_left_the_session(tmp_path):
  """What makes the rehearsal's "detached" mean something: like a closed ssh connection, the stand-in ends what a
  command left running in its session, and only a process that left the session (setsid) outlives the call."""
  homes, env = _slice(tmp_path, 2, "/usr/bin:/bin")
  # The detached one writes its pid once it has left the session, and the command waits for that (as the launcher's
  # w_launch waits for its pid file): otherwise the call could end before setsid has run.
  command = ("sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > attached.pid; "
             "setsid sh -c 'echo $$ > detached.pid; exec sleep 300' > /dev/null 2>&1 < /dev/null & "
             "while [ ! -s detached.pid ]; do sleep 0.05; done")
  result = subprocess.run([env["GCLOUD"], "compute", "tpus", "tpu-vm", "ssh", TPU, f"--zone={ZONE}", "--worker=all",
                           f"--command={command}"], env=env, capture_output=True, text=True, timeout=60)
  pids = {name: [int((home / f"{name}.pid").read_text()) for home in homes] for name in ("attached", "detached")}
  try:
    assert result.returncode == 0, result.stderr
    assert not any(_running(pid) for pid in pids["attached"]), "a process left in the session outlived the call"
    assert all(_running(pid) for pid in pids["detached"]), "a process that left the session did not outlive it"
  finally:
    for pid in pids["detached"]:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


# A worker image whose python3 is Ubuntu 22.04's, and stand-ins for uv and for curl fetching uv's installer.
PYTHON310 = '#!/bin/sh\nif [ "$1" = --version ]; then echo "Python 3.10.12"; exit 0; fi\necho "python3 (3.10 stand-in): $*" >&2\nexit 1\n'
FAKE_UV = r"""#!/usr/bin/env bash
set -euo pipefail
printf '%s\n' "$*" >> "$HOME/uv.calls"
case "$1" in
  --version) echo "uv 0.9.9 (stand-in)" ;;
  venv) [[ "$2 $3 $4" == "--python 3.11 --seed" ]] || { echo "uv stand-in: unexpected $*" >&2; exit 2; }
        MAKE_VENV ;;
  *) echo "uv stand-in: unexpected $*" >&2; exit 2 ;;
esac
"""
# The uv installer as the stand-in curl serves it: uv into $UV_UNMANAGED_INSTALL, as the real installer puts it.
INSTALLER_CURL = r"""#!/usr/bin/env bash
[[ "$*" == "-LsSf https://astral.sh/uv/install.sh" ]] || { echo "curl stand-in: unexpected $*" >&2; exit 2; }
printf 'mkdir -p "$UV_UNMANAGED_INSTALL" && cp %q "$UV_UNMANAGED_INSTALL/uv" && echo "installed uv"\n' "$UV_SOURCE"
"""
OFFLINE_CURL = '#!/bin/sh\necho "curl: (6) Could not resolve host: astral.sh" >&2\nexit 6\n'


@pytest.mark.parametrize("case", ["uv on PATH", "uv's installer", "no network", "INSTALL_UV=0", "a fresh venv"])
def test_setup_on_a_worker_whose_python3_is_too_old(tmp_path, case):
  """setup on workers whose python3 is 3.10 either provisions a Python the pins allow or stops with one line per
  worker saying what to install. Defects caught: a venv made with the image's 3.10 (pip would fail deep in the
  resolver), uv asked for the wrong Python, a failed uv install that goes unnoticed, an error that does not say
  how to fix it, a failed package install that does not fail setup."""
  shims = tmp_path / "image-bin"
  shims.mkdir()
  _executable(shims / "python3", PYTHON310)
  # uv's venv: this interpreter's environment (the pins and libtpu: setup then installs nothing), or for "a fresh
  # venv" a real new one, into which pip, offline here, cannot install the package.
  make_venv = (f'{shlex.quote(sys.executable)} -m venv "$5"' if case == "a fresh venv"
               else f'ln -s {shlex.quote(sys.prefix)} "$5"')
  uv = _executable(tmp_path / "uv", FAKE_UV.replace("MAKE_VENV", make_venv))
  env = {}
  if case in ("uv on PATH", "a fresh venv"):
    shutil.copy(uv, shims / "uv")
  elif case == "uv's installer":
    _executable(shims / "curl", INSTALLER_CURL)
    env["UV_SOURCE"] = str(uv)
  else:
    _executable(shims / "curl", OFFLINE_CURL)
  if case == "a fresh venv":
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path), PIP_DISABLE_PIP_VERSION_CHECK="1")
  homes, script_env = _slice(tmp_path, 2, f"{shims}:/usr/bin:/bin", **env)
  if case == "INSTALL_UV=0":
    script_env["INSTALL_UV"] = "0"
  result = subprocess.run(["bash", SCRIPT, "setup", TPU, ZONE], cwd=REPO, env=script_env, capture_output=True,
                          text=True, timeout=600)
  out = _per_worker(result.stdout)
  assert sorted(out) == [0, 1], result.stdout + result.stderr
  if case in ("uv on PATH", "uv's installer"):
    assert result.returncode == 0, result.stdout + result.stderr
    for w, home in enumerate(homes):
      assert (home / "uv.calls").read_text().splitlines() == ["venv --python 3.11 --seed agent_r1_venv", "--version"]
      assert any(line.startswith("python: made agent_r1_venv with uv (uv 0.9.9 (stand-in)): Python 3.11")
                 for line in out[w]), out[w]
      assert out[w][-1].startswith("ready: Python 3.11") and f"{home}/agent_r1_jax/agent_r1_jax" in out[w][-1]
      if case == "uv's installer":
        assert (home / ".local" / "bin" / "uv").is_file() and "installed uv" in out[w]
  elif case == "a fresh venv":
    assert result.returncode != 0, result.stdout
    for w, home in enumerate(homes):
      assert (home / "agent_r1_venv" / "pyvenv.cfg").is_file()
      assert any(line.startswith("packages: installing the package with its tpu extra (missing: jax==0.10.2")
                 for line in out[w]), out[w]
      assert not any(line.startswith("ready:") for line in out[w])
  else:
    assert result.returncode != 0
    for w, home in enumerate(homes):
      errors = [line for line in out[w] if line.startswith("error:")]
      assert errors == [
          "error: python3 is 3.10.12 and agent_r1_jax needs Python >=3.11,<3.14: install uv (curl -LsSf "
          "https://astral.sh/uv/install.sh | sh) or python3.11 on this worker and rerun setup"], out[w]
      assert not (home / "agent_r1_venv").exists()
      assert any("Could not resolve host" in line for line in out[w]) == (case == "no network")


def test_requires_python_is_what_the_pins_declare():
  """pyproject.toml's requires-python admits exactly the Python versions every pin of requirements.txt admits
  (their installed metadata's Requires-Python), so pip on a stock TPU image's 3.10 stops at the interpreter."""
  import importlib.metadata as md  # pylint: disable=import-outside-toplevel
  import tomllib  # pylint: disable=import-outside-toplevel
  from packaging.specifiers import SpecifierSet  # pylint: disable=import-outside-toplevel

  ours = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
  pins = []
  for line in (REPO / "requirements.txt").read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
      name, version = line.split("==")
      assert md.version(name) == version, f"{name}: the installed version is not the pin"
      pins.append((name, SpecifierSet(md.metadata(name).get("Requires-Python") or "")))
  for minor in range(8, 17):
    version = f"3.{minor}.0"
    allowed = [name for name, spec in pins if version in spec]
    assert (version in ours) == (len(allowed) == len(pins)), (version, [n for n, s in pins if version not in s])
  assert "3.10.12" not in ours and "3.11.0" in ours


def test_heartbeat_timeout_reaches_jax_distributed(monkeypatch):
  """AGENT_R1_HEARTBEAT_TIMEOUT_S (the rehearsal's survivors exit within it) is what jax.distributed gets."""
  import jax  # pylint: disable=import-outside-toplevel
  from agent_r1_jax import distributed  # pylint: disable=import-outside-toplevel

  calls = []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda *a: None)
  explicit = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "1"}
  distributed.maybe_initialize({**explicit, "AGENT_R1_HEARTBEAT_TIMEOUT_S": "20"})
  distributed.maybe_initialize({"AGENT_R1_DISTRIBUTED": "on", "AGENT_R1_HEARTBEAT_TIMEOUT_S": "60"})
  distributed.maybe_initialize(explicit)
  assert [c.get("heartbeat_timeout_seconds") for c in calls] == [20, 60, None]
  with pytest.raises(ValueError, match="AGENT_R1_HEARTBEAT_TIMEOUT_S=0 must be >= 1"):
    distributed.maybe_initialize({**explicit, "AGENT_R1_HEARTBEAT_TIMEOUT_S": "0"})


def _bash_words(line: str) -> list[str]:
  """The words bash makes of `line` (quoting and escapes undone; nothing is run: the words are only listed)."""
  result = subprocess.run(["bash", "-c", 'eval "set -- $LINE"; printf "%s\\0" "$@"'], env={"LINE": line},
                          capture_output=True, text=True, timeout=10, check=True)
  return result.stdout.split("\0")[:-1]


def _remote_call(line: str) -> list[str]:
  """The worker function call at the end of a dry run's `--command=bash -c '...'`, as the worker's bash reads it."""
  command = next(a for a in _bash_words(line) if a.startswith("--command=")).split("=", 1)[1]
  shell, flag, script = _bash_words(command)
  assert (shell, flag) == ("bash", "-c")
  return _bash_words(script.rsplit("\n", 1)[1].split("cd; ", 1)[1])


def test_dry_run_prints_each_verbs_gcloud_commands_and_runs_nothing(tmp_path):
  """DRY_RUN=1 prints the gcloud commands and runs none; the train flags reach the workers' bash verbatim
  (spaces kept, $HOME and ~ not expanded here). Defects caught: a verb that runs something in a dry run, flags
  mangled by a quoting layer, the project or zone left off a call."""
  env = _script_env(tmp_path, tmp_path / "no-such-gcloud", DRY_RUN="1", PROJECT="my-proj")
  flags = ["--config=configs/grpo_multihopqa.py:qwen2.5-3b", "--workdir=gs://b/a b", "--config.seed=$HOME",
           "--config.model.path=~/models/x"]
  verbs = {"setup": [], "stage": ["gs://b/m", "models/m"], "exec": ["--worker=0", "--", "echo", "a b"],
           "retriever": ["--index=~/i"], "run": flags, "evaluate": ["--workdir=gs://b/a b"], "status": [],
           "logs": ["evaluate", "--worker=3"], "stop": ["retriever"]}
  launch = None
  for verb, args in verbs.items():
    result = subprocess.run(["bash", SCRIPT, verb, TPU, ZONE, *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, (verb, result.stderr)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith(env["GCLOUD"])]
    assert lines, verb
    for line in lines:
      argv = _bash_words(line)
      assert argv[1:4] == ["compute", "tpus", "tpu-vm"] and {f"--zone={ZONE}", "--project=my-proj"} <= set(argv)
    if verb == "run":
      launch = next(line for line in lines if "--worker=all" in line)
  assert not list(tmp_path.iterdir())  # no calls log: nothing ran
  assert _remote_call(launch) == ["w_launch", "train", "agent_r1_jax", "agent_r1_venv", "agent_r1_logs", "", "--",
                                  "-m", "agent_r1_jax.train", *flags]
