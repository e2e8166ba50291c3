"""Workdirs in Cloud Storage (`--workdir=gs://bucket/run`) against a local GCS emulator (tests/gcs_emulator.py).

The path helpers of agent_r1_jax/workdir.py behave the same on a local directory and in the bucket; a micro run
in the bucket is stopped by SIGTERM, resumed, and ends with the metrics, summary and exported weights of the same
run done locally without interruption; the evaluation CLI, in a process of its own, reads the bucket's run and
scores it as the local one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.evaluation import pipeline
from agent_r1_jax.trainer import actor_checkpoint, loop
from agent_r1_jax.trainer.metrics import MetricsWriter, read_metrics

from gcs_emulator import running_emulator, use_in_this_process
from test_trainer import micro_config

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def emulator_env():
  with running_emulator("bucket") as env:
    yield env


@pytest.fixture
def gcs(emulator_env, monkeypatch):
  """This process's clients on the emulator; returns its environment (for subprocesses)."""
  use_in_this_process(emulator_env, monkeypatch)
  return emulator_env


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
  """The same tests on a local directory and on a bucket directory (a fresh one per test)."""
  if request.param == "local":
    return str(tmp_path / "root")
  request.getfixturevalue("gcs")
  return f"gs://bucket/{request.node.name.replace('[', '-').replace(']', '')}"


# ---------------------------------------------------------------------------------------------------------
# The path helpers.


def test_text_round_trip_listing_exists_and_rmtree(root):
  path = workdir_lib.workdir_path(root)
  assert not path.exists()
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text('{"a": 1}\n')
  (path / "checkpoints" / "3").mkdir(parents=True, exist_ok=True)
  (path / "checkpoints" / "3" / "meta.json").write_text("three")
  assert (path / "config.json").read_text() == '{"a": 1}\n'
  assert (path / "config.json").is_file() and not (path / "config.json").is_dir()
  assert (path / "checkpoints").is_dir() and not (path / "missing.txt").exists()
  assert sorted(p.name for p in path.iterdir()) == ["checkpoints", "config.json"]
  assert [p.name for p in (path / "checkpoints").iterdir()] == ["3"]
  assert str(path / "config.json") == f"{root}/config.json"  # a bucket path keeps its gs:// spelling
  path.rmtree()
  assert not path.exists() and not (path / "config.json").exists()


def test_staged_dir_uploads_what_was_written_there(root, tmp_path):
  dst = workdir_lib.workdir_path(root) / "hf_export"
  with workdir_lib.staged_dir(dst) as local:
    assert isinstance(local, pathlib.Path)
    local.mkdir(parents=True, exist_ok=True)
    (local / "model.safetensors").write_bytes(bytes(range(256)) * 1000)
    (local / "sub").mkdir()
    (local / "sub" / "tokenizer.json").write_text("{}")
  assert (dst / "model.safetensors").read_bytes() == bytes(range(256)) * 1000
  assert (dst / "sub" / "tokenizer.json").read_text() == "{}"
  assert workdir_lib.is_remote(root) == (local != pathlib.Path(str(dst)))  # a local target is written in place


def test_local_mirror_fetches_then_uploads_only_changed_files(root):
  target = workdir_lib.workdir_path(root)
  target.mkdir(parents=True, exist_ok=True)
  (target / "metrics.jsonl").write_text("row 1\n")
  mirror = workdir_lib.LocalMirror(target, fetch=("metrics.jsonl", "absent.txt"))
  assert mirror.remote == workdir_lib.is_remote(root)
  with (mirror.local / "metrics.jsonl").open("a") as f:  # the append a bucket object cannot do
    f.write("row 2\n")
  (mirror.local / "tensorboard").mkdir(exist_ok=True)
  (mirror.local / "tensorboard" / "events").write_bytes(b"e1")
  mirror.sync()
  assert (target / "metrics.jsonl").read_text() == "row 1\nrow 2\n"
  assert (target / "tensorboard" / "events").read_bytes() == b"e1"
  if mirror.remote:  # an unchanged file is not uploaded again: a change made in the bucket meanwhile stays
    (target / "tensorboard" / "events").write_bytes(b"changed in the bucket")
    mirror.sync()
    assert (target / "tensorboard" / "events").read_bytes() == b"changed in the bucket"
  (mirror.local / "tensorboard" / "events").write_bytes(b"e1 e2")
  mirror.close()
  assert (target / "tensorboard" / "events").read_bytes() == b"e1 e2"


def test_metrics_writer_appends_truncates_on_resume_and_keeps_tensorboard(root):
  writer = MetricsWriter(root)
  for step in (1, 2, 3):
    writer.write(step, {"reward": step / 10})
  writer.close()
  assert [(r["step"], r["reward"]) for r in read_metrics(root)] == [(1, 0.1), (2, 0.2), (3, 0.3)]
  writer = MetricsWriter(root, start_step=3)  # resumed from step 2's checkpoint: step 3 is replayed
  writer.write(3, {"reward": 0.33})
  writer.close()
  assert [(r["step"], r["reward"]) for r in read_metrics(root)] == [(1, 0.1), (2, 0.2), (3, 0.33)]
  events = list((workdir_lib.workdir_path(root) / "tensorboard").iterdir())
  assert events and all(p.name.startswith("events.out.tfevents") for p in events)
  assert any(b"reward" in p.read_bytes() for p in events)  # the scalars' tag, written through on close


def test_missing_package_or_unknown_scheme_is_one_clear_error(monkeypatch, tmp_path):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a))
  with pytest.raises(ValueError, match=r"gs://bucket/run needs the gcsfs package.*pip install -r requirements"):
    workdir_lib.workdir_path("gs://bucket/run")
  # The trainer says so before it prepares anything (its synthetic world would take a while).
  with pytest.raises(ValueError, match="needs the gcsfs package"):
    loop.train(micro_config("grpo"), "gs://bucket/run")
  with pytest.raises(ValueError, match=r"s3:// is not supported; use a local directory or gs://bucket/dir"):
    workdir_lib.workdir_path("s3://bucket/run")
  assert workdir_lib.workdir_path(tmp_path / "x") == tmp_path / "x"  # local paths need no package


# ---------------------------------------------------------------------------------------------------------
# A run in the bucket: SIGTERM, resume, evaluation from another process.


def _comparable(rows):
  return [{k: v for k, v in r.items() if not k.startswith("time/") and "time_" not in k} for r in rows]


def _eval_cli(workdir: str, env: dict[str, str]) -> subprocess.CompletedProcess:
  """`python -m agent_r1_jax.evaluate --workdir=...` in a process of its own (on the session's XLA cache, which
  conftest names in the environment)."""
  env = dict(os.environ, **env)
  return subprocess.run([sys.executable, "-m", "agent_r1_jax.evaluate", f"--workdir={workdir}", "--methods=agent",
                         "--num_examples=2", "--batch_size=2", "--samples_per_dataset=1"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_bucket_run_resumes_after_sigterm_like_an_uninterrupted_local_run(gcs, tmp_path, monkeypatch):
  """Defects caught: anything of a run written to a local path named like the bucket (config, metrics,
  checkpoints, summary, samples, curves, export: read back from the bucket here), a resume that does not find
  the bucket's checkpoint or metrics (the rows would restart or differ), metrics rows lost on SIGTERM or not
  uploaded with a checkpoint, and an evaluation that cannot read the bucket's run from another process."""
  config = micro_config("grpo", **{"trainer.total_steps": 4, "trainer.eval_every": 4, "trainer.save_every": 3,
                                   "trainer.export_hf": True})
  local = tmp_path / "local"
  loop.train(config, local)

  bucket = "gs://bucket/run"
  original_step = loop.RLTrainer.step

  def step_then_sigterm(self, step):
    metrics = original_step(self, step)
    if step == 2:
      os.kill(os.getpid(), signal.SIGTERM)  # the real signal; the loop saves step 2 and exits
    return metrics

  monkeypatch.setattr(loop.RLTrainer, "step", step_then_sigterm)
  first = loop.train(config, bucket)
  assert first.preempted and first.step == 2
  assert actor_checkpoint.checkpoint_steps(bucket) == [0, 2]
  assert [r["step"] for r in read_metrics(bucket)] == [1, 2]  # synced by the SIGTERM save, not left local
  in_bucket_before = {}

  def step_seeing_the_bucket(self, step):  # what a hard kill before this step would leave in the bucket
    in_bucket_before[step] = [r["step"] for r in read_metrics(bucket)]
    return original_step(self, step)

  monkeypatch.setattr(loop.RLTrainer, "step", step_seeing_the_bucket)
  second = loop.train(config, bucket)
  assert not second.preempted and second.step == 4
  # Rows reach the bucket with each checkpoint (step 3's), not only every 60 s or at the end: a rerun after a
  # kill resumes from the checkpoint and finds every row before it.
  assert in_bucket_before[3] == [1, 2] and in_bucket_before[4] == [1, 2, 3]

  remote = workdir_lib.workdir_path(bucket)
  assert actor_checkpoint.checkpoint_steps(bucket) == [0, 2, 3, 4]
  assert _comparable(read_metrics(bucket)) == _comparable(read_metrics(local))
  for name in ("summary.json", "samples.jsonl", "config.json"):
    assert (remote / name).read_text() == (local / name).read_text(), name
  assert (remote / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  exported = sorted(p.name for p in (local / "hf_export").iterdir())
  assert sorted(p.name for p in (remote / "hf_export").iterdir()) == exported and "model.safetensors" in exported
  for name in exported:  # the same final policy, byte for byte
    assert (remote / "hf_export" / name).read_bytes() == (local / "hf_export" / name).read_bytes(), name
  assert len(list((remote / "tensorboard").iterdir())) == 2  # one event file per process that trained

  proc = _eval_cli(bucket, gcs)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads((remote / "eval" / "results.json").read_text())
  pipeline.run(workdir=str(local), hf_checkpoint=None, base_hf_checkpoint=None, step=None, methods=["agent"],
               datasets=[], out_dir=None, num_examples=2, batch_size=2, samples_per_dataset=1, seed=0)  # the CLI's
  want = json.loads((local / "eval" / "results.json").read_text())
  assert got["policy"] == f"{bucket} step 4" and want["policy"] == f"{local} step 4"
  assert got["methods"] == want["methods"]
