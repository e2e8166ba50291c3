"""Learner: response log-probs against a direct computation, NaN skip, value-loss descent, SFT loss.

Exact micro-batch accumulation against a full-batch objective is in test_learner_exactness.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM, Qwen2ValueModel
from agent_r1_jax.learner import updates as lrn
from agent_r1_jax.learner import optimizer as optimizer_lib

P, R, B, V = 5, 7, 8, 48


def _config():
  return Qwen2Config.tiny(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)


def _batch(seed: int = 0) -> dict[str, jax.Array]:
  rng = np.random.default_rng(seed)
  prompt_len = rng.integers(1, P + 1, B)
  resp_len = rng.integers(1, R + 1, B)
  prompt_mask = (np.arange(P)[None] >= P - prompt_len[:, None]).astype(np.int32)
  resp_mask = (np.arange(R)[None] < resp_len[:, None]).astype(np.int32)
  action = resp_mask * (rng.random((B, R)) < 0.7)
  ids = rng.integers(0, V, (B, P + R)).astype(np.int32)
  return {
      "input_ids": jnp.asarray(ids),
      "attention_mask": jnp.asarray(np.concatenate([prompt_mask, resp_mask], 1)),
      "response_ids": jnp.asarray(ids[:, P:]),
      "loss_mask": jnp.asarray(action, jnp.float32),
      "advantage_mask": jnp.asarray(action, jnp.float32),
      "old_logprobs": jnp.asarray(rng.normal(-3.0, 0.3, (B, R)), jnp.float32),
      "ref_logprobs": jnp.asarray(rng.normal(-3.0, 0.3, (B, R)), jnp.float32),
      "advantages": jnp.asarray(rng.normal(size=(B, R)) * action, jnp.float32),
      "returns": jnp.asarray(rng.normal(size=(B, R)), jnp.float32),
      "old_values": jnp.asarray(rng.normal(size=(B, R)), jnp.float32),
  }


def test_response_logprobs_match_full_forward_gather():
  model = Qwen2ForCausalLM(_config(), rngs=nnx.Rngs(0))
  batch = _batch()
  logp, entropy = lrn.response_logprobs(model, batch, with_entropy=True)
  logits = np.asarray(model(batch["input_ids"], batch["attention_mask"]), np.float64)
  ids = np.asarray(batch["input_ids"])
  expected = np.zeros((B, R))
  expected_ent = np.zeros((B, R))
  for b in range(B):
    for j in range(R):
      row = logits[b, P + j - 1]
      lse = np.log(np.exp(row - row.max()).sum()) + row.max()
      expected[b, j] = row[ids[b, P + j]] - lse
      p = np.exp(row - lse)
      expected_ent[b, j] = -(p * (row - lse)).sum()
  np.testing.assert_allclose(np.asarray(logp), expected, atol=1e-5)
  np.testing.assert_allclose(np.asarray(entropy), expected_ent, atol=1e-5)


def test_non_finite_gradient_skips_the_update():
  """Catches a non-finite step that still touches the parameters or the AdamW state (moments, step count: a count
  that advances shifts the lr schedule and Adam's bias correction for every later step). One finite step first,
  so the state holds non-zero moments and a count of 1; then a NaN advantage on a masked token must leave every
  parameter and every optimizer-state leaf bit-identical."""
  graphdef, params = nnx.split(Qwen2ForCausalLM(_config(), rngs=nnx.Rngs(2)))
  tx = optimizer_lib.make_optimizer(lr=1e-2, warmup_steps=2, weight_decay=0.01, grad_clip=1.0)
  learner = lrn.Learner(graphdef, tx, lrn.ActorLossConfig())
  params, opt_state, m = learner.actor_step(params, tx.init(params), _batch(2), num_micro=2)
  assert float(m["actor/skipped"]) == 0.0
  batch = _batch(2)
  batch["advantages"] = batch["advantages"].at[0, 0].set(jnp.nan)
  batch["loss_mask"] = batch["loss_mask"].at[0, 0].set(1.0)
  before = jax.tree.map(np.array, params)
  before_opt = jax.tree.map(np.array, opt_state)
  counts = [x for x in jax.tree.leaves(before_opt) if np.issubdtype(x.dtype, np.integer)]
  assert counts and all(int(x) == 1 for x in counts)  # the step counts of the schedule and of Adam
  assert any(np.any(x != 0) for x in jax.tree.leaves(before_opt) if np.issubdtype(x.dtype, np.floating))
  p, o, m = learner.actor_step(params, opt_state, batch, num_micro=2)
  assert float(m["actor/skipped"]) == 1.0 and not np.isfinite(float(m["actor/grad_norm"]))
  assert jax.tree.structure(p) == jax.tree.structure(before)
  for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(before)):
    np.testing.assert_array_equal(np.asarray(a), b)
  assert jax.tree.structure(o) == jax.tree.structure(before_opt)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(o), jax.tree.leaves(before_opt)):
    np.testing.assert_array_equal(np.asarray(a), b, err_msg=jax.tree_util.keystr(path))


def test_value_loss_falls_on_a_fixed_batch():
  config = _config()
  graphdef, params = nnx.split(Qwen2ValueModel(config, rngs=nnx.Rngs(3)))
  tx = optimizer_lib.make_optimizer(lr=3e-3, warmup_steps=0, weight_decay=0.0, grad_clip=1.0)
  actor_graphdef, _ = nnx.split(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)))
  learner = lrn.Learner(actor_graphdef, tx, lrn.ActorLossConfig(), critic_graphdef=graphdef, critic_tx=tx,
                        critic_cfg=lrn.CriticLossConfig(clip_range_value=10.0))
  batch = _batch(3)
  opt = tx.init(params)
  losses = []
  for _ in range(15):
    batch["old_values"] = learner.values(params, batch)
    params, opt, m = learner.critic_step(params, opt, batch, num_micro=2)
    losses.append(float(m["critic/value_loss"]))
  assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.slow
def test_sft_loss_is_the_mean_nll_of_action_tokens_only():
  from agent_r1_jax.data.sft import SFTExample  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.warmup import sft  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(4)
  examples = [SFTExample(rng.integers(1, V, rng.integers(1, P + 1)).astype(np.int32),
                         rng.integers(1, V, n).astype(np.int32), (rng.random(n) < 0.6).astype(np.int32))
              for n in (3, 7, 5)]
  batch = sft.learner_batch(examples, P, R, pad_id=0)
  model = Qwen2ForCausalLM(_config(), rngs=nnx.Rngs(5))
  graphdef, params = nnx.split(model)
  jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
  got = float(sft.sft_loss(params, graphdef, jbatch))
  # The LM head in blocks of 3 positions (R is not a multiple: the last block is padded) gives the same loss
  # and gradient.
  chunked_loss, chunked_grad = jax.value_and_grad(sft.sft_loss)(params, graphdef, jbatch, logits_chunk_size=3)
  whole_loss, whole_grad = jax.value_and_grad(sft.sft_loss)(params, graphdef, jbatch)
  np.testing.assert_allclose(float(chunked_loss), float(whole_loss), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(chunked_grad), jax.tree.leaves(whole_grad)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
  # Reference: each example alone, unpadded, through the full forward; NLL of its action tokens.
  nll, count = 0.0, 0
  for ex in examples:
    ids = np.concatenate([ex.prompt_ids, ex.response_ids])[None]
    logits = np.asarray(model(jnp.asarray(ids), jnp.ones_like(jnp.asarray(ids))), np.float64)[0]
    p = len(ex.prompt_ids)
    for j, (tok, is_action) in enumerate(zip(ex.response_ids, ex.action_mask)):
      if is_action:
        row = logits[p + j - 1]
        nll -= row[tok] - (np.log(np.exp(row - row.max()).sum()) + row.max())
        count += 1
  np.testing.assert_allclose(got, nll / count, rtol=1e-5)
