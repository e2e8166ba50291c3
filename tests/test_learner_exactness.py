"""Micro-batched actor and critic updates against an independently written full-batch objective, for every
loss aggregation mode: the objective below is one full forward of the whole mini-batch with the PPO clipped loss
(asymmetric + dual clip), the k3 KL loss, the entropy bonus and the clipped value loss written out, aggregated as
the four modes are defined (rows without a masked token take no part); `jax.grad` of it and one SGD(1) step must
equal `Learner.actor_step` / `critic_step` with 1, 2 and 4 micro-batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agent_r1_jax import rl
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM, Qwen2ValueModel
from agent_r1_jax.learner import updates as lrn
from test_learner import B, P, R, V, _batch

HORIZON = 11          # H of seq-mean-token-sum-norm, deliberately not R (= 7)
TEMPERATURE = 0.7
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
KL_COEF, ENTROPY_COEF = 0.05, 0.01
CLIP_VALUE = 0.5
EMPTY_ROWS = (3, 7)   # no masked token; with 4 micro-batches (rows k, k+4) micro-batch 3 is entirely empty


def _exactness_batch() -> dict[str, jax.Array]:
  """`test_learner._batch` with two rows masked out entirely and old log-probs spread around the initial policy's
  (~ -log 48) so every branch of the clipped loss is taken: ratios in [0.8, 1.2], below and above it, and > 3."""
  batch = dict(_batch(7))
  rng = np.random.default_rng(17)
  batch["old_logprobs"] = jnp.asarray(rng.normal(-np.log(48.0), 1.0, (B, R)), jnp.float32)
  for name in ("loss_mask", "advantage_mask", "advantages"):
    batch[name] = batch[name].at[jnp.asarray(EMPTY_ROWS)].set(0.0)
  return batch


def _aggregate(x: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
  """The four modes as defined: token mean; mean over non-empty rows of row means; of row sums; of row sums / H."""
  tokens = jnp.sum(mask, axis=1)
  rows = jnp.sum(tokens > 0)
  row_sums = jnp.sum(x * mask, axis=1)
  if mode == "token-mean":
    return jnp.sum(row_sums) / jnp.sum(tokens)
  if mode == "seq-mean-token-mean":
    return jnp.sum(jnp.where(tokens > 0, row_sums / jnp.maximum(tokens, 1.0), 0.0)) / rows
  if mode == "seq-mean-token-sum":
    return jnp.sum(row_sums) / rows
  if mode == "seq-mean-token-sum-norm":
    return jnp.sum(row_sums) / (rows * HORIZON)
  raise KeyError(mode)


def _actor_objective(params, graphdef, batch, mode):
  """PPO clipped surrogate + KL_COEF * k3(pi, ref) - ENTROPY_COEF * entropy of the whole batch, one full forward."""
  model = nnx.merge(graphdef, params)
  logits = model(batch["input_ids"], batch["attention_mask"]).astype(jnp.float32)
  z = logits[:, P - 1:P + R - 1] / TEMPERATURE  # position P + j - 1 predicts response token j
  log_softmax = jax.nn.log_softmax(z, axis=-1)
  logp = jnp.take_along_axis(log_softmax, batch["response_ids"][..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(log_softmax) * log_softmax, axis=-1)
  adv, mask = batch["advantages"], batch["loss_mask"]
  ratio = jnp.exp(logp - batch["old_logprobs"])
  pg = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - CLIP_LOW, 1.0 + CLIP_HIGH))
  pg = jnp.where(adv < 0, jnp.minimum(pg, -adv * CLIP_C), pg)
  d = batch["ref_logprobs"] - logp
  kl = jnp.exp(d) - d - 1.0
  parts = {"actor/pg_loss": _aggregate(pg, mask, mode), "actor/kl_loss": _aggregate(kl, mask, mode),
           "actor/entropy": _aggregate(entropy, mask, mode)}
  total = parts["actor/pg_loss"] + KL_COEF * parts["actor/kl_loss"] - ENTROPY_COEF * parts["actor/entropy"]
  return total, (parts, ratio)


def _critic_objective(params, graphdef, batch, mode):
  """0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2) of the whole batch, one full forward."""
  critic = nnx.merge(graphdef, params)
  values = critic(batch["input_ids"], batch["attention_mask"])[:, P - 1:P + R - 1]
  old, ret = batch["old_values"], batch["returns"]
  clipped = jnp.clip(values, old - CLIP_VALUE, old + CLIP_VALUE)
  loss = 0.5 * jnp.maximum(jnp.square(values - ret), jnp.square(clipped - ret))
  value_loss = _aggregate(loss, batch["advantage_mask"], mode)
  return value_loss, ({"critic/value_loss": value_loss}, clipped != values)


def _learner(role: str, mode: str):
  config = Qwen2Config.tiny(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2)
  actor_graphdef, actor_params = nnx.split(Qwen2ForCausalLM(config, rngs=nnx.Rngs(1)))
  sgd = optax.sgd(1.0)  # the update is exactly -gradient
  actor_cfg = lrn.ActorLossConfig(clip_ratio_low=CLIP_LOW, clip_ratio_high=CLIP_HIGH, clip_ratio_c=CLIP_C,
                                  loss_agg_mode=mode, entropy_coef=ENTROPY_COEF, use_kl_loss=True,
                                  kl_loss_coef=KL_COEF, kl_loss_type="low_var_kl", temperature=TEMPERATURE,
                                  horizon=HORIZON, logits_chunk_size=3)
  if role == "actor":
    return lrn.Learner(actor_graphdef, sgd, actor_cfg), actor_graphdef, actor_params
  critic_graphdef, critic_params = nnx.split(Qwen2ValueModel(config, rngs=nnx.Rngs(2)))
  learner = lrn.Learner(actor_graphdef, sgd, actor_cfg, critic_graphdef=critic_graphdef, critic_tx=sgd,
                        critic_cfg=lrn.CriticLossConfig(clip_range_value=CLIP_VALUE, loss_agg_mode=mode,
                                                        horizon=HORIZON))
  return learner, critic_graphdef, critic_params


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("mode", rl.LOSS_AGG_MODES)
def test_micro_batched_update_equals_the_full_batch_objective(role, mode):
  """Catches any micro-batching that is not exactly the full-batch gradient (a per-micro-batch denominator, a
  micro-batch mean of means, an empty row or empty micro-batch counted or turning into NaN), and any loss term that
  differs from its definition (clip bounds swapped, dual clip missing, KL direction, entropy sign, the horizon H,
  the temperature, the response offset): with SGD(1) the learner's new parameters must equal params - grad of the
  objective written here, with 1, 2 and 4 micro-batches (4 include an empty one), and its loss metrics the
  objective's terms."""
  learner, graphdef, params = _learner(role, mode)
  batch = _exactness_batch()
  objective = _actor_objective if role == "actor" else _critic_objective
  grad_fn = jax.jit(jax.grad(objective, has_aux=True), static_argnums=(1, 3))
  grads, (parts, branch) = grad_fn(params, graphdef, batch, mode)
  expected = jax.tree.map(lambda p, g: p - g, params, grads)
  mask = np.asarray(batch["loss_mask" if role == "actor" else "advantage_mask"]) > 0
  if role == "actor":  # every branch of the clipped surrogate is exercised on masked tokens
    ratio, adv = np.asarray(branch)[mask], np.asarray(batch["advantages"])[mask]
    assert np.any((ratio > 1 - CLIP_LOW) & (ratio < 1 + CLIP_HIGH)) and np.any(ratio < 1 - CLIP_LOW)
    assert np.any(ratio > 1 + CLIP_HIGH) and np.any((ratio > CLIP_C) & (adv < 0))
  else:
    assert 0 < np.mean(np.asarray(branch)[mask]) < 1  # some values clipped, some not
  moved = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
  assert moved > 1e-3
  step = learner.actor_step if role == "actor" else learner.critic_step
  for num_micro in (1, 2, 4):
    new, _, metrics = step(jax.tree.map(jnp.copy, params), learner.actor_tx.init(params), batch, num_micro=num_micro)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(new), jax.tree.leaves(expected)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5,
                                 err_msg=f"{num_micro} micro-batches: {jax.tree_util.keystr(path)}")
    for key, value in parts.items():
      np.testing.assert_allclose(float(metrics[key]), float(value), rtol=1e-5, atol=1e-6,
                                 err_msg=f"{num_micro} micro-batches: {key}")
    assert float(metrics[f"{role}/skipped"]) == 0.0
