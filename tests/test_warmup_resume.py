"""An interrupted warm-up resumes and ends exactly where an uninterrupted run ends.

SIGTERM at warm-up step k (inside the planned stages, or inside the second extra round of the read check, after
the first round and two checks) saves that step and stops the run; rerunning it resumes the warm-up from its
save and finishes RL. The resumed run's metrics, summary (read checks, held-out evaluations) and final weights
equal an uninterrupted run's. Ctrl-C on the CLI during the warm-up prints one line saying how to resume, no
traceback, and the rerun resumes.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from agent_r1_jax.trainer import loop, read_metrics
from agent_r1_jax.trainer.warmup_checkpoints import DIRECTORY, WarmupCheckpoints
from test_trainer import micro_config

REPO = pathlib.Path(__file__).resolve().parents[1]
# Planned stages of 4 steps, then (the 1-layer model reads nothing) two extra rounds of 3: steps 1-4, 5-7, 8-10.
WARMUP = {"sft.enabled": True, "sft.stages": "1:2:2,all:2:2", "sft.reading_worlds": 0, "sft.rag_questions": 0,
          "sft.multi_hop_worlds": 0, "sft.min_read_accuracy": 1.0, "sft.extra_stage": "all:3:2",
          "sft.extra_rounds": 2, "sft.save_every": 3, "trainer.export_hf": True}


def _comparable(rows: list[dict]) -> list[dict]:
  return [{k: v for k, v in row.items() if not k.startswith("time/") and "_s" not in k.split("/")[-1]}
          for row in rows]


def _weights(workdir: pathlib.Path) -> dict[str, np.ndarray]:
  return load_file(str(workdir / "hf_export" / "model.safetensors"))


def _summary(workdir: pathlib.Path) -> dict:
  import json  # pylint: disable=import-outside-toplevel
  return json.loads((workdir / "summary.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("uninterrupted")
  result = loop.train(micro_config("grpo", **WARMUP), workdir)
  assert result.step == 2 and not result.preempted
  return workdir


@pytest.mark.parametrize("stop_at", [3, 9])
def test_sigterm_in_the_warmup_saves_and_the_rerun_ends_as_an_uninterrupted_run(uninterrupted, tmp_path, monkeypatch,
                                                                                stop_at, capsys):
  saved = WarmupCheckpoints.after_step

  def signal_at(self, step, params, opt_state, *, phase_end):
    if step == stop_at:
      os.kill(os.getpid(), signal.SIGTERM)  # caught by Preemption: this step is saved, then the run stops
    saved(self, step, params, opt_state, phase_end=phase_end)

  monkeypatch.setattr(WarmupCheckpoints, "after_step", signal_at)
  stopped = loop.train(micro_config("grpo", **WARMUP), tmp_path)
  assert stopped.preempted and stopped.step == 0
  assert f"SIGTERM: saved warm-up step {stop_at} to" in capsys.readouterr().out
  assert not (tmp_path / "checkpoints" / "0").exists() and not read_metrics(tmp_path)
  monkeypatch.setattr(WarmupCheckpoints, "after_step", saved)

  resumed = loop.train(micro_config("grpo", **WARMUP), tmp_path)
  assert resumed.step == 2 and not resumed.preempted
  assert f"resuming the warm-up from {tmp_path / DIRECTORY} at its step {stop_at}" in capsys.readouterr().out
  assert _comparable(read_metrics(tmp_path)) == _comparable(read_metrics(uninterrupted))
  ours, theirs = _summary(tmp_path), _summary(uninterrupted)
  assert ours == theirs and len(ours["warmup_read_checks"]) == 3  # the checks after 0, 1 and 2 extra rounds
  ours, theirs = _weights(tmp_path), _weights(uninterrupted)
  assert ours.keys() == theirs.keys()
  for name, array in theirs.items():
    np.testing.assert_array_equal(ours[name], array, err_msg=name)
  assert not (tmp_path / DIRECTORY).exists() or not any((tmp_path / DIRECTORY).iterdir())  # dropped after step 0


def test_a_resume_without_replaying_the_batch_draws_would_differ(uninterrupted, tmp_path, monkeypatch):
  """Control: a resume that restores the saved step but does not replay the batch draws before it (the stream
  starts where a fresh phase's would) ends elsewhere, so the equality above is the replay's doing."""
  from agent_r1_jax.warmup import sft  # pylint: disable=import-outside-toplevel
  saved = WarmupCheckpoints.after_step

  def signal_at(self, step, params, opt_state, *, phase_end):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)
    saved(self, step, params, opt_state, phase_end=phase_end)

  monkeypatch.setattr(WarmupCheckpoints, "after_step", signal_at)
  assert loop.train(micro_config("grpo", **WARMUP), tmp_path).preempted
  monkeypatch.setattr(WarmupCheckpoints, "after_step", saved)
  monkeypatch.setattr(sft.BatchStream, "skip", lambda self: None)
  assert not loop.train(micro_config("grpo", **WARMUP), tmp_path).preempted
  ours, theirs = _weights(tmp_path), _weights(uninterrupted)
  assert any(not np.array_equal(ours[name], array) for name, array in theirs.items())


def test_ctrl_c_in_the_warmup_prints_one_line_and_the_rerun_resumes(tmp_path):
  args = [sys.executable, "-m", "agent_r1_jax.train", "--config=configs/grpo_multihopqa.py", f"--workdir={tmp_path}",
          "--config.sft.stages=all:100000:2", "--config.sft.save_every=1", "--config.sft.min_read_accuracy=0",
          "--config.sft.reading_worlds=0", "--config.sft.rag_questions=0", "--config.sft.multi_hop_worlds=0",
          "--config.model.hidden_size=32", "--config.model.intermediate_size=64", "--config.model.num_hidden_layers=1",
          "--config.model.num_attention_heads=2", "--config.model.num_key_value_heads=1",
          "--config.data.synthetic.num_train=24", "--config.data.synthetic.num_validation=4",
          "--config.data.synthetic.num_test=4", "--config.trainer.progress_bar=False"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  while not any((tmp_path / DIRECTORY).glob("[0-9]*")) and time.monotonic() < deadline and proc.poll() is None:
    time.sleep(0.5)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert "Traceback" not in err and "Traceback" not in out
  lines = [line for line in out.splitlines() if line.startswith("SIGINT")]
  assert len(lines) == 1 and "saved warm-up step" in lines[0] and "rerun the same command" in lines[0], out[-2000:]
  step = int(lines[0].split("saved warm-up step ")[1].split()[0])
  rerun = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  out = ""
  while time.monotonic() < deadline and rerun.poll() is None and "resuming the warm-up" not in out:
    out += rerun.stdout.readline()
  rerun.send_signal(signal.SIGINT)
  rest, err = rerun.communicate(timeout=120)
  assert f"resuming the warm-up from {tmp_path / DIRECTORY} at its step {step}" in out + rest, (out + rest)[-2000:]
  assert "Traceback" not in err
