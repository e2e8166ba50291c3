"""The final policy export with tied embeddings, against transformers; and an exact resume of PPO with the adaptive
KL controller after a hard kill between two periodic checkpoints."""

from __future__ import annotations

import math
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM, save_hf_checkpoint
from agent_r1_jax.trainer import loop
from agent_r1_jax.trainer.metrics import read_metrics

from test_trainer import micro_config

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
VOCAB = 96


# ---------------------------------------------------------------------------------------------------------
# Export of a tied-embedding model.


def _random_tied_model() -> Qwen2ForCausalLM:
  """A tiny tied Qwen2 whose every parameter (biases and norms included, which start at 0 / 1) is random, so a
  tensor exported under the wrong name or layout changes the logits."""
  config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                       rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=True)
  model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  flat = nnx.to_flat_state(state)
  keys = jax.random.split(jax.random.key(1), len(flat))
  new = []
  for key, (path, var) in zip(keys, flat):
    value = var.get_value()
    noise = jax.random.normal(key, value.shape, value.dtype)
    is_norm = any("norm" in str(p) for p in path)
    new.append((path, var.replace(1.0 + 0.2 * noise if is_norm else 0.08 * noise)))
  return nnx.merge(graphdef, nnx.from_flat_state(new))


def _left_padded_batch():
  """Three rows of 9 columns: full, left-padded by 3, left-padded by 6."""
  rng = np.random.RandomState(3)
  ids = rng.randint(0, VOCAB, (3, 9)).astype(np.int32)
  mask = np.ones((3, 9), np.int32)
  mask[1, :3] = 0
  mask[2, :6] = 0
  ids[mask == 0] = 0
  return ids, mask


def test_tied_embedding_export_loads_in_transformers_with_the_same_logits(tmp_path):
  """Defects caught: an export of a tied model that writes an `lm_head.weight` tensor (transformers would then
  either ignore it or load a head that is not the embedding), a config.json without `tie_word_embeddings`
  (transformers would initialise a fresh random head), and any name/layout error of a tensor (logits differ)."""
  import safetensors  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  model = _random_tied_model()
  assert not hasattr(model, "lm_head")  # our tied model holds the embedding only
  out = tmp_path / "export"
  save_hf_checkpoint(model, out)

  with safetensors.safe_open(str(out / "model.safetensors"), "np") as f:
    names = set(f.keys())
    embed = f.get_tensor("model.embed_tokens.weight")
  assert "lm_head.weight" not in names
  np.testing.assert_array_equal(embed, np.asarray(model.model.embed[...]))  # [V, D], HF's layout

  hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  assert type(hf).__name__ == "Qwen2ForCausalLM" and hf.config.tie_word_embeddings
  # Tied: the head's weight is the embedding's tensor itself, not a copy.
  assert hf.lm_head.weight is hf.model.embed_tokens.weight

  ids, mask = _left_padded_batch()
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)  # what HF generation passes with left padding
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()
  ours = np.asarray(model(jax.numpy.asarray(ids), jax.numpy.asarray(mask)))
  assert ours.dtype == np.float32 and ours.shape == theirs.shape == (3, 9, VOCAB)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# PPO + adaptive KL: a hard kill after step 3 (checkpoints every 2 steps), then a resume.

TARGET_KL, HORIZON, INIT_COEF = 1e-6, 10.0, 0.001


def ppo_adaptive_config():
  """Micro PPO, KL in the reward with an adaptive coefficient that moves 4% per step (rows=2, horizon=10), a
  checkpoint every 2 steps, 5 steps."""
  return micro_config("ppo", **{"algorithm.kl_ctrl": "adaptive", "algorithm.target_kl": TARGET_KL,
                                "algorithm.kl_horizon": HORIZON, "algorithm.kl_coef": INIT_COEF,
                                "trainer.save_every": 2, "trainer.total_steps": 5, "trainer.eval_every": 100})


# Run in a subprocess: trains with ppo_adaptive_config and dies with os._exit (no SIGTERM handler, no final save,
# no cleanup) right after step 3's metrics row is written, once step 2's asynchronous checkpoint is on disk.
_KILLED_RUN = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from agent_r1_jax.trainer import loop
from test_export_resume import ppo_adaptive_config

trainers = []
original_step = loop.RLTrainer.step

def step(self, s):
  trainers.append(self)
  return original_step(self, s)

class KilledAfterStep3(loop.MetricsWriter):
  def write(self, s, metrics):
    row = super().write(s, metrics)
    if s == 3:
      trainers[-1].checkpointer.wait()
      os._exit(17)
    return row

loop.RLTrainer.step = step
loop.MetricsWriter = KilledAfterStep3
loop.train(ppo_adaptive_config(), sys.argv[2])
raise SystemExit("not killed")
"""


def _comparable(rows):
  return [{k: v for k, v in r.items() if not k.startswith("time/") and "time_" not in k} for r in rows]


@pytest.mark.slow
def test_ppo_adaptive_kl_resumes_exactly_after_a_hard_kill_between_checkpoints(tmp_path, capsys):
  """Defects caught: the KL coefficient not checkpointed or not restored (the resumed run would restart it at
  kl_coef and steps 3..5 would differ), the controller's update rule wrong (the logged coefficients would not
  follow Ziegler et al.'s recursion), step 3 replayed with other randomness or data than the uninterrupted run,
  and the orphaned step-3 row of the killed run left in metrics.jsonl (a duplicated or stale step)."""
  config = ppo_adaptive_config()
  straight = tmp_path / "straight"
  loop.train(config, straight)
  rows = read_metrics(straight)
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]

  # The logged coefficient is the one used at that step: it starts at kl_coef and then follows
  # beta <- beta * (1 + clip(kl / target - 1, -0.2, 0.2) * rows / horizon), rows = 2 per step.
  coefs = [r["kl_coef"] for r in rows]
  assert coefs[0] == INIT_COEF
  for before, after, row in zip(coefs, coefs[1:], rows):
    error = min(max(row["kl_in_reward"] / TARGET_KL - 1.0, -0.2), 0.2)
    assert math.isclose(after, before * (1.0 + error * 2 / HORIZON), rel_tol=1e-12), (before, after, row)
  assert len(set(coefs)) == 5  # it moved at every step, so a coefficient lost on resume shows

  killed = tmp_path / "killed"
  proc = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(TESTS), str(killed)], cwd=REPO,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 17, proc.stderr[-3000:]
  # What the kill left: checkpoints of steps 0 and 2, and a metrics row for step 3 that no checkpoint covers.
  assert sorted(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit()) == [0, 2]
  assert [r["step"] for r in read_metrics(killed)] == [1, 2, 3]

  capsys.readouterr()
  result = loop.train(config, killed)
  assert not result.preempted and result.step == 5
  assert "at step 2" in capsys.readouterr().out  # resumed from step 2's checkpoint, so step 3 ran again
  resumed = read_metrics(killed)
  assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]  # one row per step: the orphaned row 3 was replaced
  assert _comparable(resumed) == _comparable(rows)
