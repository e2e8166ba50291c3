"""Two trainer processes on 127.0.0.1 (launch/local_multiprocess.sh): a 2-host pod in miniature.

Both processes step through rollout, learner updates, orbax checkpoints and the HF export on one mesh that
spans them; a second launch resumes from the saved step. Only process 0 writes metrics and exports.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent

MICRO = ["--config=configs/grpo_multihopqa.py", "--config.mesh.fsdp=-1", "--config.sft.enabled=False",
         "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.model.num_hidden_layers=1", "--config.model.num_attention_heads=2",
         "--config.model.num_key_value_heads=1", "--config.rollout.max_turns=2",
         "--config.rollout.max_new_tokens_per_turn=8", "--config.rollout.n_samples=2",
         "--config.trainer.batch_size=2", "--config.trainer.eval_num_examples=2",
         "--config.trainer.eval_batch_size=2", "--config.actor.micro_batch_size=2",
         "--config.trainer.progress_bar=False", "--config.data.synthetic.num_train=24",
         "--config.data.synthetic.num_validation=4", "--config.data.synthetic.num_test=4"]


def _launch(workdir: pathlib.Path, total_steps: int, logs: pathlib.Path) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHON=sys.executable, LOG_DIR=str(logs), JAX_PLATFORMS="cpu", XLA_FLAGS="",
             DEVICES_PER_PROCESS="1")
  args = ["bash", "launch/local_multiprocess.sh", "2", *MICRO, f"--workdir={workdir}",
          f"--config.trainer.total_steps={total_steps}"]
  return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=420)


def test_two_process_training_checkpoints_exports_and_resumes(tmp_path):
  workdir, logs = tmp_path / "run", tmp_path / "logs"
  first = _launch(workdir, 2, logs)
  assert first.returncode == 0, first.stderr[-3000:] + "".join(p.read_text()[-2000:] for p in logs.glob("*.log"))
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["0", "2"]
  assert (workdir / "hf_export" / "model.safetensors").exists()
  second = _launch(workdir, 3, logs)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "resuming from" in second.stdout and "at step 2" in second.stdout
  steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2, 3]  # one writer: process 0, and the resumed run appended step 3 only
