"""Two trainer processes on 127.0.0.1 (launch/local_multiprocess.sh): a 2-host pod in miniature.

Both processes step through rollout, learner updates, orbax checkpoints and the HF export on one mesh that
spans them; a second launch resumes from the saved step. Only process 0 writes metrics and exports. The export
is checked tensor for tensor against the same run's final checkpoint exported by one process, and in
transformers; the resumed run's metrics against an uninterrupted two-process run.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

MICRO = ["--config=configs/grpo_multihopqa.py", "--config.mesh.fsdp=-1", "--config.sft.enabled=False",
         "--config.model.hidden_size=32", "--config.model.intermediate_size=64",
         "--config.model.num_hidden_layers=1", "--config.model.num_attention_heads=2",
         "--config.model.num_key_value_heads=1", "--config.rollout.max_turns=2",
         "--config.rollout.max_new_tokens_per_turn=8", "--config.rollout.n_samples=2",
         "--config.trainer.batch_size=2", "--config.trainer.eval_num_examples=2",
         "--config.trainer.eval_batch_size=2", "--config.actor.micro_batch_size_per_device=1",
         "--config.trainer.progress_bar=False", "--config.data.synthetic.num_train=24",
         "--config.data.synthetic.num_validation=4", "--config.data.synthetic.num_test=4"]


def _launch(workdir: pathlib.Path, total_steps: int, logs: pathlib.Path) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHON=sys.executable, LOG_DIR=str(logs), JAX_PLATFORMS="cpu", XLA_FLAGS="",
             DEVICES_PER_PROCESS="1")
  # Evaluation at every step, so a run stopped at step 2 (its last step evaluates) and one going on to step 3
  # log the same keys.
  args = ["bash", "launch/local_multiprocess.sh", "2", *MICRO, f"--workdir={workdir}",
          f"--config.trainer.total_steps={total_steps}", "--config.trainer.eval_every=1"]
  return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=420)


def _failure(run: subprocess.CompletedProcess, logs: pathlib.Path) -> str:
  return run.stderr[-3000:] + "".join(p.read_text()[-2000:] for p in logs.glob("*.log"))


def _comparable(rows):
  return [{k: v for k, v in r.items() if not k.startswith("time/") and "time_" not in k} for r in rows]


def _tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
  return load_file(str(directory / "model.safetensors"))


def _check_export_against_checkpoint(workdir: pathlib.Path, tmp_path: pathlib.Path) -> None:
  """The two-process hf_export holds, tensor for tensor, what one process exports from the run's final
  checkpoint (restored by orbax, not gathered by the export), and transformers computes our logits from it."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.evaluation import policy as policy_lib  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.models import save_hf_checkpoint  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.learner import build  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer import task as task_lib  # pylint: disable=import-outside-toplevel

  c = policy_lib.read_workdir_config(workdir)
  c.mesh.fsdp = 1  # this process: one device
  arch = build.model_config(c, vocab_size=len(task_lib.build_task(c).tokenizer))
  graphdef, params, step = policy_lib.restore_actor(workdir, c, arch, build.build_mesh(c))
  assert step == 3
  model = nnx.merge(graphdef, params)
  save_hf_checkpoint(model, tmp_path / "single")

  exported, single = _tensors(workdir / "hf_export"), _tensors(tmp_path / "single")
  assert sorted(exported) == sorted(single)
  for name, value in single.items():
    assert exported[name].shape == value.shape, name
    np.testing.assert_array_equal(exported[name], value, err_msg=name)

  hf = transformers.AutoModelForCausalLM.from_pretrained(workdir / "hf_export", dtype=torch.float32).eval()
  rng = np.random.default_rng(0)
  ids = rng.integers(0, arch.vocab_size, (3, 10)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, :4] = 0  # left padding
  mask[2, :7] = 0
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()
  ours = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_two_process_training_checkpoints_exports_and_resumes(tmp_path):
  """Defects caught: a cross-process gather in the HF export that writes one process's shard twice or leaves
  one out (the export differs from the checkpoint's parameters), an export transformers cannot load or computes
  differently, metrics written by a process other than 0, and a resume that does not replay the uninterrupted
  run exactly (the data shard, the PRNG key or the optimizer state of either process restored wrongly)."""
  straight, straight_logs = tmp_path / "straight", tmp_path / "straight_logs"
  uninterrupted = _launch(straight, 3, straight_logs)
  assert uninterrupted.returncode == 0, _failure(uninterrupted, straight_logs)

  workdir, logs = tmp_path / "run", tmp_path / "logs"
  first = _launch(workdir, 2, logs)
  assert first.returncode == 0, _failure(first, logs)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["0", "2"]
  assert (workdir / "hf_export" / "model.safetensors").exists()
  second = _launch(workdir, 3, logs)
  assert second.returncode == 0, _failure(second, logs)
  assert "resuming from" in second.stdout and "at step 2" in second.stdout
  steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2, 3]  # one writer: process 0, and the resumed run appended step 3 only

  # Resume is exact across processes: steps 1..3 equal the uninterrupted two-process run's.
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  straight_rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in straight_rows] == [1, 2, 3]
  assert _comparable(rows) == _comparable(straight_rows)

  assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {
      p.name for p in (workdir / "hf_export").iterdir()}
  _check_export_against_checkpoint(workdir, tmp_path)
