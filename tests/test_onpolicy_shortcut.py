"""The on-policy learner shortcut (#32): an update of one epoch and one mini-batch holds its own forward's
log-probs fixed as the old ones (ratio exp(logp - sg(logp)) = 1) instead of a separate pass before it.

1. Learner level, tiny float32 model: the loss, every gradient leaf, the metrics and the parameters after one
   AdamW step equal those of the update fed old log-probs from the separate pass (`Learner.logprobs`).
2. Trainer level: a default GRPO step runs no old-log-prob pass (spied on `Learner.logprobs`), reports the
   drift and entropy the pass would have given, and ends with the parameters of the same step run with the
   shortcut off; with several mini-batches, several epochs or the KL penalty in the reward the pass runs and
   the update reads its output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax import rl
from agent_r1_jax.models import Qwen2ForCausalLM
from agent_r1_jax.learner import updates as lrn
from agent_r1_jax.learner import optimizer as optimizer_lib
from agent_r1_jax.trainer import loop
from agent_r1_jax.trainer import rollout_step
from test_learner import _batch
from test_learner import _config
from test_trainer import micro_config

NUM_MICRO = 2
LR = 1e-3


def _learner(graphdef) -> lrn.Learner:
  """Every term of the actor loss on: clipped PG with dual clip, k3 KL to the reference, an entropy bonus."""
  cfg = lrn.ActorLossConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01)
  return lrn.Learner(graphdef, optimizer_lib.make_optimizer(lr=LR, warmup_steps=0, weight_decay=0.01, grad_clip=0.0), cfg)


def _two_batches(learner, params, seed: int):
  """(batch with old log-probs from the separate pass, batch for the shortcut), plus the pass's outputs.

  The advantages take both signs, so the dual-clip branch (A < 0) is in the loss. The shortcut's batch has no
  `old_logprobs` (a read of it would fail) and carries sampler log-probs that differ from the policy's.
  """
  base = _batch(seed)
  rng = np.random.default_rng(seed + 100)
  action = np.asarray(base["loss_mask"])
  sampler = jnp.asarray(rng.normal(-3.0, 0.5, action.shape) * action, jnp.float32)
  old, entropy = learner.logprobs(params, base, num_micro=NUM_MICRO)
  recomputed = {**base, "old_logprobs": old}
  shortcut = {k: v for k, v in base.items() if k != "old_logprobs"}
  shortcut.update(sampler_logprobs=sampler, action_mask=jnp.asarray(action))
  assert np.any(np.asarray(base["advantages"]) < 0) and np.any(np.asarray(base["advantages"]) > 0)
  return recomputed, shortcut, (np.asarray(old), np.asarray(entropy), np.asarray(sampler), action)


def _loss_and_grads(learner, params, batch, onpolicy: bool):
  """Loss value and gradient of the whole batch as one micro-batch (`actor_loss` divided by its denominator)."""
  cfg = learner.actor_cfg
  denominator = rl.loss_denominator(batch["loss_mask"], cfg.loss_agg_mode, cfg.horizon)
  fn = lambda p: lrn.actor_loss(p, learner.actor_graphdef, batch, denominator, cfg, onpolicy=onpolicy)[0]
  return jax.value_and_grad(fn)(params)


@pytest.mark.slow
def test_shortcut_gives_the_loss_gradients_metrics_and_update_of_the_recomputed_old_logprobs():
  """Catches an on-policy update whose gradient is not the recomputed one's: old log-probs without the
  stop-gradient (the ratio is then the constant 1 and the PG gradient vanishes), a ratio that is not 1, a
  tie of the clip's max that drops half the gradient, or metrics that differ from the separate pass's."""
  graphdef, params = nnx.split(Qwen2ForCausalLM(_config(), rngs=nnx.Rngs(7)))
  learner = _learner(graphdef)
  recomputed, shortcut, (old, entropy, sampler, action) = _two_batches(learner, params, seed=5)

  loss_r, grads_r = _loss_and_grads(learner, params, recomputed, onpolicy=False)
  loss_s, grads_s = _loss_and_grads(learner, params, shortcut, onpolicy=True)
  np.testing.assert_allclose(float(loss_s), float(loss_r), rtol=1e-6, atol=1e-7)
  norm = float(optax_norm(grads_r))
  assert norm > 1e-3, norm  # a real gradient, not one that vanished on both sides
  for (path, g_s), g_r in zip(jax.tree_util.tree_leaves_with_path(grads_s), jax.tree.leaves(grads_r)):
    np.testing.assert_allclose(np.asarray(g_s), np.asarray(g_r), rtol=1e-5, atol=1e-6 * norm,
                               err_msg=jax.tree_util.keystr(path))

  # Without the KL and entropy terms the gradient is the PG term's alone: it must be non-zero (the ratio's
  # gradient survives the stop-gradient) and equal the recomputed one's.
  pg_only = lrn.Learner(graphdef, learner.actor_tx, lrn.ActorLossConfig())
  _, pg_r = _loss_and_grads(pg_only, params, recomputed, onpolicy=False)
  _, pg_s = _loss_and_grads(pg_only, params, shortcut, onpolicy=True)
  pg_norm = float(optax_norm(pg_r))
  assert pg_norm > 1e-3, pg_norm
  np.testing.assert_allclose(float(optax_norm(pg_s)), pg_norm, rtol=1e-5)

  copy = lambda tree: jax.tree.map(jnp.copy, tree)  # actor_step donates its parameters and optimizer state
  new_r, _, m_r = learner.actor_step(copy(params), learner.actor_tx.init(params), recomputed, num_micro=NUM_MICRO)
  new_s, _, m_s = learner.actor_step(copy(params), learner.actor_tx.init(params), shortcut, num_micro=NUM_MICRO,
                                     onpolicy=True)
  for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/approx_kl"):
    np.testing.assert_allclose(float(m_s[key]), float(m_r[key]), rtol=1e-5, atol=1e-7, err_msg=key)
  assert float(m_s["actor/clip_fraction"]) == 0.0 and float(m_r["actor/clip_fraction"]) == 0.0
  moved = 0.0
  for (path, a), b, p in zip(jax.tree_util.tree_leaves_with_path(new_s), jax.tree.leaves(new_r),
                             jax.tree.leaves(params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-7, err_msg=jax.tree_util.keystr(path))
    moved = max(moved, float(np.max(np.abs(np.asarray(b) - np.asarray(p)))))
  assert moved > 0.5 * LR, moved  # the step really moved the weights

  # The drift and entropy the skipped pass gave, from its outputs by a plain loop over action tokens.
  on = action > 0
  drift = max(abs(float(old[i, t]) - float(sampler[i, t])) for i, t in zip(*np.nonzero(on)))
  mean_entropy = sum(float(entropy[i, t]) for i, t in zip(*np.nonzero(on))) / on.sum()
  np.testing.assert_allclose(float(m_s["logprob_drift_max"]), drift, rtol=1e-5)
  np.testing.assert_allclose(float(m_s["entropy"]), mean_entropy, rtol=1e-5)
  assert "logprob_drift_max" not in m_r and "entropy" not in m_r


def optax_norm(tree) -> jax.Array:
  """Global L2 norm of a gradient tree."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


# --------------------------------------------------------------------------------------------------
# The trainer's choice.


class _Spy:
  """Wraps a trainer's `Learner.logprobs` and `actor_step`, recording whose log-probs were computed (the
  actor's or the reference's, by identity with the trainer's state) and what each actor update was fed."""

  def __init__(self, trainer):
    self.trainer, self.logprob_calls, self.updates = trainer, [], []
    self._logprobs, self._actor_step = trainer.learner.logprobs, trainer.learner.actor_step
    trainer.learner.logprobs, trainer.learner.actor_step = self.logprobs, self.actor_step

  def logprobs(self, params, batch, **kwargs):
    state = self.trainer.state
    whose = "actor" if params is state["actor"] else "ref" if params is state.get("ref") else "other"
    out = self._logprobs(params, batch, **kwargs)
    self.logprob_calls.append((whose, np.asarray(out[0])))
    return out

  def actor_step(self, params, opt_state, batch, **kwargs):
    self.updates.append({"onpolicy": kwargs.get("onpolicy", False),
                         "old_logprobs": np.asarray(batch["old_logprobs"]) if "old_logprobs" in batch else None,
                         "params": jax.tree.map(np.array, params), "batch": dict(batch)})
    return self._actor_step(params, opt_state, batch, **kwargs)

  def actor_passes(self) -> list[np.ndarray]:
    return [out for whose, out in self.logprob_calls if whose == "actor"]


def _trainer(tmp_path, algorithm: str = "grpo", **overrides):
  c = micro_config(algorithm, **{"actor.warmup_steps": 0, "rollout.engine": "lockstep", **overrides})
  return loop.RLTrainer(c, tmp_path)


@pytest.fixture
def distinct_scores(monkeypatch):
  """Row i of every scored batch scores i, so every group's rewards differ and the update's gradient is
  non-zero whatever the random policy samples (its real scores are often all alike, on some machines at every
  seed tried: a vacuous comparison)."""
  real = rollout_step.evaluation.score_batch

  def score_batch(traj, **kwargs):
    return [dict(s, score=float(i)) for i, s in enumerate(real(traj, **kwargs))]
  monkeypatch.setattr(rollout_step.evaluation, "score_batch", score_batch)


def test_an_on_policy_step_runs_no_old_logprob_pass_and_matches_the_step_with_the_pass(tmp_path, distinct_scores):
  """Catches the shortcut not taken where it applies (the pass still runs), drift / entropy metrics missing or
  not the pass's values, and a shortcut step that trains differently from the same step with the pass."""
  on = _trainer(tmp_path / "on")
  off = _trainer(tmp_path / "off", **{"actor.reuse_onpolicy_logprobs": False})
  spy_on, spy_off = _Spy(on), _Spy(off)
  m_on, m_off = on.step(1), off.step(1)

  assert spy_on.actor_passes() == [] and [w for w, _ in spy_on.logprob_calls] == ["ref"]
  assert [u["onpolicy"] for u in spy_on.updates] == [True] and spy_on.updates[0]["old_logprobs"] is None
  assert len(spy_off.actor_passes()) == 1 and [u["onpolicy"] for u in spy_off.updates] == [False]

  # The metrics the skipped pass gave, recomputed here by that pass on the parameters the update saw.
  seen = spy_on.updates[0]
  batch = seen["batch"]
  logp, entropy = (np.asarray(x) for x in on.learner.logprobs(seen["params"], batch, num_micro=1))
  action = np.asarray(batch["action_mask"]) > 0
  assert action.any()
  np.testing.assert_allclose(m_on["logprob_drift_max"],
                             np.abs(logp - np.asarray(batch["sampler_logprobs"]))[action].max(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(m_on["entropy"], entropy[action].mean(), rtol=1e-5)

  # Same rollout (same seed), so the same update: metrics and parameters as with the separate pass.
  for key in ("reward", "logprob_drift_max", "entropy", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
    np.testing.assert_allclose(m_on[key], m_off[key], rtol=1e-4, atol=1e-6, err_msg=key)
  assert m_on["actor/grad_norm"] > 0
  # Adam's first step is about lr * g / (|g| + eps) per element, so where |g| is near eps a last-bit difference
  # between the two paths' gradients moves the update visibly: on a 2-core AMD EPYC (no AVX-512) one element of
  # 50,336 differed by 1.09e-6. A different update (another objective, stale log-probs) moves most elements by
  # O(lr) = O(1e-3); so: at most 0.1% of elements beyond 1e-6, none beyond 1e-5.
  for a, b in zip(jax.tree.leaves(on.state["actor"]), jax.tree.leaves(off.state["actor"])):
    diff = np.abs(np.asarray(a) - np.asarray(b))
    assert diff.max() <= 1e-5 and np.mean(diff > 1e-6) <= 1e-3, (diff.max(), np.mean(diff > 1e-6))


@pytest.mark.parametrize("algorithm,overrides", [
    ("grpo", {"actor.num_mini_batches": 2}),
    ("grpo", {"actor.ppo_epochs": 2}),
    ("reinforce_pp", {}),  # k1 KL in the reward: the rewards read the old log-probs before the update
], ids=["two_mini_batches", "two_epochs", "kl_in_reward"])
def test_the_old_logprob_pass_runs_where_the_update_is_not_on_policy(algorithm, overrides, tmp_path):
  """Catches the shortcut taken where the old log-probs must come from before the update: a later mini-batch or
  epoch would otherwise take ratios against already-updated parameters (always 1: no clipping), and the KL
  penalty in the reward would have nothing to read. The pass runs on the actor, every update reads its output
  and none is on-policy; asking `_update` for an on-policy update here is refused."""
  trainer = _trainer(tmp_path, algorithm, **overrides)
  assert trainer.c.actor.reuse_onpolicy_logprobs  # the default is on; these configs must still not use it
  spy = _Spy(trainer)
  metrics = trainer.step(1)
  passes = spy.actor_passes()
  assert len(passes) == 1
  expected_updates = trainer.c.actor.ppo_epochs * trainer.c.actor.num_mini_batches
  assert len(spy.updates) == expected_updates
  for update in spy.updates:
    assert not update["onpolicy"] and update["old_logprobs"] is not None
    # Each mini-batch's old log-probs are rows of the pass's output (mini-batches are sorted row subsets).
    rows = {tuple(np.round(r, 6)) for r in passes[0]}
    assert all(tuple(np.round(r, 6)) in rows for r in update["old_logprobs"])
  assert np.isfinite(metrics["logprob_drift_max"]) and np.isfinite(metrics["entropy"])
  with pytest.raises(ValueError, match="not an on-policy update"):
    trainer._update(2, {"input_ids": jnp.zeros((4, 4), jnp.int32)}, jax.random.key(0), onpolicy=True)
