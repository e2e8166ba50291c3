"""The trainer's numbers against independent references: the paper's PPO settings, the critic warm-up, the critic's
starting backbone, the seq-mean-token-sum-norm horizon, the mini-batch / epoch loop of `_update`, and every array
`prepare_batch` hands the learner (direct full forwards in float64 and the plain-Python RL references)."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from agent_r1_jax.learner import build
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.learner import updates as lrn
from agent_r1_jax.trainer import loop
from test_rl_reference import ref_gae
from test_rl_reference import ref_grpo
from test_trainer import _handmade_trajectory
from test_trainer import _with_padding
from test_trainer import micro_config

REPO = pathlib.Path(__file__).resolve().parent.parent
SCORES = (1.0, 0.0, 0.5, -1.0)  # one per row of `_handmade_trajectory`


def _shipped_config(algorithm: str, preset: str):
  """`configs/<algorithm>_multihopqa.py:<preset>` loaded the way `--config=FILE:PRESET` loads it."""
  spec = importlib.util.spec_from_file_location(f"shipped_{algorithm}", REPO / "configs" / f"{algorithm}_multihopqa.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)


def _snapshot(tree) -> list[np.ndarray]:
  """Host copies of every leaf (learner steps donate their inputs, so the device buffers may be reused)."""
  return [np.array(x) for x in jax.tree.leaves(tree)]


def _same(tree, snapshot: list[np.ndarray]) -> bool:
  leaves = jax.tree.leaves(tree)
  return len(leaves) == len(snapshot) and all(np.array_equal(np.asarray(a), b) for a, b in zip(leaves, snapshot))


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _scored(scores=SCORES) -> list[dict]:
  return [{"score": s} for s in scores]


# --------------------------------------------------------------------------------------------------
# 1. Config: the paper's PPO settings, critic_warmup only with a critic, registry-named fields.


@pytest.mark.parametrize("preset", sorted(config_lib.REAL_PRESETS))
def test_real_ppo_presets_pin_the_released_script_settings(preset):
  """Catches a drift of any PPO hyper-parameter of the paper's released scripts in configs/ppo_multihopqa.py:<real
  preset> (critic warm-up of 5 steps, constant critic lr 1e-5, actor lr 1e-6, k1 KL 0.001 in the reward, gamma =
  lambda = 1, clip 0.2, 128 prompts x 1 sample), and a critic optimizer that does not step at 1e-5 from its first
  update (e.g. critic.warmup_steps scaled into a linear warm-up from 0)."""
  c = _shipped_config("ppo", preset)
  assert c.preset == preset and c.algorithm.adv_estimator == "gae" and c.algorithm.use_critic
  assert c.trainer.critic_warmup == 5
  assert c.critic.warmup_steps == 0
  assert c.critic.lr == 1e-5 and c.actor.lr == 1e-6
  assert c.algorithm.use_kl_in_reward and not c.actor.use_kl_loss
  assert c.algorithm.kl_penalty == "kl" and c.algorithm.kl_coef == 0.001 and c.algorithm.kl_ctrl == "fixed"
  assert c.algorithm.gamma == 1.0 and c.algorithm.lam == 1.0
  assert c.actor.clip_ratio_low == 0.2 and c.actor.clip_ratio_high == 0.2
  assert c.trainer.batch_size == 128 and c.rollout.n_samples == 1
  c.dry_run = True  # validated as a plan: the weights are not here
  config_lib.validate(c)

  # The optimizers build_learner makes: Adam's first steps on a constant gradient move each weight by -lr * sign(g)
  # (bias-corrected m / sqrt(v) = sign(g)); zero weights see no weight decay; the gradient is below the clip norm.
  learner = build.build_learner(c, None, object(), logprob_temperature=1.0)
  g = {"w": jnp.asarray([1e-3, -2e-3, 5e-4, -1e-4], jnp.float32)}
  for tx, lr in ((learner.critic_tx, 1e-5), (learner.actor_tx, 1e-6)):
    params = {"w": jnp.zeros(4, jnp.float32)}
    state = tx.init(params)
    for _ in range(6):  # the first update and the next five: a constant lr, no warm-up ramp
      updates, state = tx.update(g, state, params)
      np.testing.assert_allclose(np.asarray(updates["w"]), -lr * np.sign(np.asarray(g["w"])), rtol=1e-3)


@pytest.mark.parametrize("preset", config_lib.PRESETS)
@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp_baseline", "reinforce_pp"])
def test_critic_free_algorithms_keep_critic_warmup_zero(algorithm, preset):
  """Catches a preset that freezes the actor of an algorithm that has no critic to warm up (its steps would train
  nothing)."""
  c = _shipped_config(algorithm, preset)
  assert not c.algorithm.use_critic
  assert c.trainer.critic_warmup == 0


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp_baseline", "reinforce_pp"])
def test_validate_refuses_critic_warmup_without_a_critic(algorithm):
  """Catches validate() accepting trainer.critic_warmup > 0 without a critic (a run whose first steps do nothing),
  or refusing it with a message that does not name the field to change."""
  c = micro_config(algorithm, **{"trainer.critic_warmup": 2})
  with pytest.raises(ValueError, match=r"trainer\.critic_warmup") as err:
    config_lib.validate(c)
  assert "critic_warmup=0" in str(err.value)
  config_lib.validate(micro_config("ppo", **{"trainer.critic_warmup": 2}))  # with a critic it is fine


# (field, a bad value, the valid names as the paper's code knows them, whether the field is a tuple of entries)
_REGISTRY_FIELDS = [
    ("algorithm.adv_estimator", "ppo", ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo")),
    ("algorithm.kl_penalty", "k1", ("kl", "abs", "mse", "low_var_kl")),
    ("algorithm.kl_ctrl", "constant", ("fixed", "adaptive")),
    ("algorithm.reward_style", "em", ("paper", "partial_credit")),
    ("actor.kl_loss_type", "k3", ("kl", "abs", "mse", "low_var_kl")),
    ("actor.loss_agg_mode", "mean", ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                     "seq-mean-token-sum-norm")),
    ("critic.loss_agg_mode", "sum", ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                     "seq-mean-token-sum-norm")),
    ("tool.tools", ("wiki_search", "web_search"), ("wiki_search", "python")),
    ("tool.retriever", "faiss", ("bm25", "dense", "http")),
    ("data.source", "nq", ("synthetic", "multihopqa")),
    ("data.val_sources", ("hotpotqa", "bamboogle"), ("hotpotqa", "2wikimultihopqa", "musique")),
]


@pytest.mark.parametrize("field,bad,valid", _REGISTRY_FIELDS, ids=[f[0] for f in _REGISTRY_FIELDS])
def test_validate_refuses_an_unknown_registry_name_naming_field_and_choices(field, bad, valid):
  """Catches a registry-named field that validate() lets through to fail later (deep in a build, or silently as a
  default), and a refusal whose one message does not name the field, the bad value and every valid name."""
  overrides = {field: bad}
  if field == "data.val_sources":
    overrides["data.source"] = "multihopqa"  # the validation sources are data sets of the real task
  c = micro_config("ppo", **overrides)
  with pytest.raises(ValueError) as err:
    config_lib.validate(c)
  message = str(err.value)
  assert field in message, message
  unknown = [b for b in bad if b not in valid] if isinstance(bad, tuple) else [bad]
  for name in unknown:
    assert repr(name) in message, message
  for name in valid:
    assert f"'{name}'" in message, message


# --------------------------------------------------------------------------------------------------
# 2, 3. critic_warmup freezes the actor for exactly its steps; the critic starts from the (warmed-up) actor.


def test_critic_warmup_freezes_the_actor_for_exactly_its_first_steps(tmp_path):
  """Catches an off-by-one in the critic warm-up (the actor already updated in step `critic_warmup` counting from
  1, as the loop numbers steps) and a warm-up that also freezes the critic: with trainer.critic_warmup=1, step 1
  leaves the actor and its optimizer state bit-identical while the critic moves, and step 2 moves the actor."""
  c = micro_config("ppo", **{"trainer.critic_warmup": 1, "trainer.total_steps": 2, "actor.warmup_steps": 0,
                             "critic.warmup_steps": 0, "rollout.max_turns": 1})
  trainer = loop.RLTrainer(c, tmp_path)
  actor0, actor_opt0 = _snapshot(trainer.state["actor"]), _snapshot(trainer.state["actor_opt"])
  critic0 = _snapshot(trainer.state["critic"])
  m1 = trainer.step(1)
  assert _same(trainer.state["actor"], actor0), "the actor moved in a critic warm-up step"
  assert _same(trainer.state["actor_opt"], actor_opt0), "the actor's optimizer stepped in a critic warm-up step"
  assert not _same(trainer.state["critic"], critic0), "the critic did not learn in its warm-up step"
  assert "critic/value_loss" in m1 and not any(k.startswith("actor/") for k in m1), sorted(m1)
  critic1 = _snapshot(trainer.state["critic"])
  m2 = trainer.step(2)
  assert not _same(trainer.state["actor"], actor0), "the actor did not learn after the critic warm-up"
  assert not _same(trainer.state["critic"], critic1)
  assert m2["actor/skipped"] == 0 and "actor/pg_loss" in m2


def _warmup_config(**overrides):
  """PPO on the micro world with a two-step supervised warm-up on the expert's trajectories only."""
  return micro_config("ppo", **{"sft.enabled": True, "sft.stages": "all:2:2", "sft.warmup_steps": 0, "sft.lr": 1e-2,
                                "sft.reading_worlds": 0, "sft.rag_questions": 0, "sft.multi_hop_worlds": 0,
                                **overrides})


def _backbone_equals_actor(state) -> None:
  actor, critic = state["actor"]["model"], state["critic"]["model"]
  assert jax.tree.structure(actor) == jax.tree.structure(critic)
  pairs = zip(jax.tree_util.tree_leaves_with_path(actor), jax.tree.leaves(critic))
  for (path, a), b in pairs:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_critic_backbone_is_the_actor_at_construction_and_after_warmup(tmp_path):
  """Catches a critic that starts from its own random backbone, or from the actor as it was before the supervised
  warm-up (the tiny preset's critic must judge the policy RL starts from), and a warm-up that re-initialises the
  value head: at construction and after `warmup`, every backbone leaf of the critic equals the actor's, the value
  head keeps its initial values, and the two models do not share buffers."""
  trainer = loop.RLTrainer(_warmup_config(), tmp_path)
  _backbone_equals_actor(trainer.state)
  head = {k: np.array(trainer.state["critic"][k][...]) for k in ("value_kernel", "value_bias")}
  before = _snapshot(trainer.state["actor"]["model"])
  trainer.warmup(None)
  assert not _same(trainer.state["actor"]["model"], before), "the warm-up did not train the actor"
  _backbone_equals_actor(trainer.state)
  for k, v in head.items():
    np.testing.assert_array_equal(np.asarray(trainer.state["critic"][k][...]), v, err_msg=k)
  assert np.any(head["value_kernel"] != 0)
  # A copy, not an alias: the actor's update donates its buffers, which must not be the critic's.
  pointers = lambda tree: {x.addressable_shards[0].data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)}
  assert not pointers(trainer.state["actor"]["model"]) & pointers(trainer.state["critic"]["model"])
  # And the reference policy (KL in the reward) is the warmed-up actor too.
  for a, r in zip(jax.tree.leaves(trainer.state["actor"]), jax.tree.leaves(trainer.state["ref"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(r))


# --------------------------------------------------------------------------------------------------
# 4. The horizon H of seq-mean-token-sum-norm.


def _sgd_learner(trainer) -> lrn.Learner:
  """The trainer's loss settings (as build_learner made them from the config) with SGD(1): an update is -gradient."""
  l = trainer.learner
  return lrn.Learner(l.actor_graphdef, optax.sgd(1.0), l.actor_cfg, critic_graphdef=l.critic_graphdef,
                     critic_tx=optax.sgd(1.0), critic_cfg=l.critic_cfg)


def _steps(learner, state, batch):
  """(actor params, actor metrics, critic params, critic metrics) after one SGD step on `batch` as one micro-batch."""
  actor, _, am = learner.actor_step(_copy(state["actor"]), learner.actor_tx.init(state["actor"]), batch, num_micro=1)
  critic, _, cm = learner.critic_step(_copy(state["critic"]), learner.critic_tx.init(state["critic"]), batch,
                                      num_micro=1)
  return actor, am, critic, cm


def _hand_advantages(traj) -> np.ndarray:
  """Arbitrary advantages on the action tokens (their sum is far from 0, unlike whitened ones)."""
  action = traj.action_mask.astype(np.float64)
  r = action.shape[1]
  return action * (1.0 + np.arange(r)[None, :] * 0.1) * np.array([[1.0], [-2.0], [0.5], [3.0]])


def _hand_case(trainer, traj):
  """A prepared batch with hand-set advantages and returns 0.25 above the old values, and the SGD steps' outputs."""
  batch, _ = trainer.prepare_batch(traj, _scored())
  batch["advantages"] = jnp.asarray(_hand_advantages(traj), jnp.float32)
  batch["returns"] = batch["old_values"] + 0.25 * batch["advantage_mask"]
  return _steps(_sgd_learner(trainer), trainer.state, batch)


def _expected_sum_norm_losses(traj, horizon: int) -> tuple[float, float]:
  """(PPO loss, value loss) of `_hand_case` by hand: at ratio 1 the token loss is -A_t, the value loss
  0.5 * 0.25^2; each summed over the masked tokens and divided by rows * H."""
  action, adv = traj.action_mask, _hand_advantages(traj)
  b, r = action.shape
  rows = sum(1 for i in range(b) if action[i].any())
  pg = sum(-adv[i, t] for i in range(b) for t in range(r) if action[i, t]) / (rows * horizon)
  value = sum(0.5 * 0.25 ** 2 for i in range(b) for t in range(r) if action[i, t]) / (rows * horizon)
  return pg, value


@pytest.mark.slow
def test_seq_mean_token_sum_norm_is_the_same_at_every_padded_width(tmp_path):
  """Catches a default horizon H equal to the batch's padded response width (which trimming / length buckets vary)
  instead of rollout.max_response_length: the same rows padded to R = 10 and R = 22 columns give the same actor and
  critic loss and gradient, and both losses equal the hand-computed sum over masked tokens / (rows * 384)."""
  c = micro_config("ppo", **{"actor.loss_agg_mode": "seq-mean-token-sum-norm",
                             "critic.loss_agg_mode": "seq-mean-token-sum-norm", "trainer.length_multiple": 0})
  trainer = loop.RLTrainer(c, tmp_path)
  narrow_traj, wide_traj = _handmade_trajectory(), _with_padding(_handmade_trajectory(), 0, 12)
  assert narrow_traj.response_length == 10 and wide_traj.response_length == 22
  narrow, wide = _hand_case(trainer, narrow_traj), _hand_case(trainer, wide_traj)
  expected_pg, expected_v = _expected_sum_norm_losses(narrow_traj, c.rollout.max_response_length)
  assert c.rollout.max_response_length == 384
  for actor, am, critic, cm in (narrow, wide):
    np.testing.assert_allclose(float(am["actor/pg_loss"]), expected_pg, rtol=1e-4)
    np.testing.assert_allclose(float(cm["critic/value_loss"]), expected_v, rtol=1e-4)
  for key in ("actor/grad_norm", "critic/grad_norm"):
    metrics_n, metrics_w = (narrow[1], wide[1]) if key.startswith("actor") else (narrow[3], wide[3])
    assert float(metrics_n[key]) > 1e-6, key
    np.testing.assert_allclose(float(metrics_n[key]), float(metrics_w[key]), rtol=1e-4, err_msg=key)
  for new_n, new_w in ((narrow[0], wide[0]), (narrow[2], wide[2])):  # the updates are the negated gradients
    for a, b in zip(jax.tree.leaves(new_n), jax.tree.leaves(new_w)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_seq_mean_token_sum_norm_divides_by_rows_times_the_configured_horizon(tmp_path):
  """Catches algorithm.loss_agg_horizon not reaching the learner's denominator (actor or critic), and a
  denominator counting tokens instead of rows: with H = 100 both losses are the hand-computed sums / (rows * 100)."""
  c = micro_config("ppo", **{"actor.loss_agg_mode": "seq-mean-token-sum-norm",
                             "critic.loss_agg_mode": "seq-mean-token-sum-norm", "algorithm.loss_agg_horizon": 100})
  trainer = loop.RLTrainer(c, tmp_path)
  traj = _handmade_trajectory()
  _, am, _, cm = _hand_case(trainer, traj)
  expected_pg, expected_v = _expected_sum_norm_losses(traj, 100)
  np.testing.assert_allclose(float(am["actor/pg_loss"]), expected_pg, rtol=1e-4)
  np.testing.assert_allclose(float(cm["critic/value_loss"]), expected_v, rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# 5. _update: epochs x mini-batches, critic then actor, against a hand-written loop.


def test_update_matches_a_hand_written_epoch_and_mini_batch_loop(tmp_path):
  """Catches any change in what `_update` feeds the learner (permutation keys, which rows form a mini-batch, the
  number of micro-batches, critic-before-actor order, a skipped or repeated mini-batch or epoch), in how its metrics
  are averaged, and an actor updated during the critic warm-up: two PPO steps of 2 epochs x 2 mini-batches with
  trainer.critic_warmup=1 equal a plain loop calling critic_step / actor_step one mini-batch at a time. The second
  epoch sees ratios outside [0.8, 1.2] (clip fraction > 0), so the loop really runs PPO's clipped regime."""
  c = micro_config("ppo", **{"trainer.critic_warmup": 1, "trainer.batch_size": 4, "actor.num_mini_batches": 2,
                             "actor.ppo_epochs": 2, "actor.micro_batch_size_per_device": 1,
                             "critic.micro_batch_size_per_device": 1, "actor.lr": 3e-2, "actor.warmup_steps": 0,
                             "critic.lr": 1e-3, "critic.warmup_steps": 0})
  trainer = loop.RLTrainer(c, tmp_path)
  batch, _ = trainer.prepare_batch(_handmade_trajectory(), _scored())
  rows, mini_rows, num_micro = 4, 2, 2  # micro-batches of 1 row x 1 batch device
  key = jax.random.key(11)
  learner = trainer.learner
  ref = {k: _copy(trainer.state[k]) for k in ("actor", "actor_opt", "critic", "critic_opt")}
  actor0 = _snapshot(trainer.state["actor"])

  def reference_update(step):
    records = []
    for epoch in range(c.actor.ppo_epochs):
      perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 1000 + epoch), rows))
      for k in range(rows // mini_rows):
        idx = np.sort(perm[k * mini_rows:(k + 1) * mini_rows])
        # the rows, gathered on the host and placed as the trainer places a batch (same compiled programs)
        mini = {name: jax.device_put(np.asarray(v)[idx], trainer.batch_sharding) for name, v in batch.items()}
        ref["critic"], ref["critic_opt"], m = learner.critic_step(ref["critic"], ref["critic_opt"], mini,
                                                                  num_micro=num_micro)
        record = {k2: float(v) for k2, v in m.items()}
        if step > c.trainer.critic_warmup:  # steps 1..critic_warmup train the critic only
          ref["actor"], ref["actor_opt"], m = learner.actor_step(ref["actor"], ref["actor_opt"], mini,
                                                                 num_micro=num_micro)
          record.update({k2: float(v) for k2, v in m.items()})
        records.append((epoch, record))
    return records

  def averaged(records):
    keys = {k for _, r in records for k in r}
    out = {}
    for k in keys:
      values = [r[k] for _, r in records if k in r]
      out[k] = sum(values) if k.endswith("/skipped") else sum(values) / len(values)
    return out

  for step in (1, 2):
    got = trainer._update(step, batch, key)
    records = reference_update(step)
    expected = averaged(records)
    assert set(got) == set(expected), (step, sorted(got), sorted(expected))
    for k, v in expected.items():
      np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-7, err_msg=f"step {step}: {k}")
    for name in ("actor", "critic", "actor_opt", "critic_opt"):
      for a, b in zip(jax.tree.leaves(trainer.state[name]), jax.tree.leaves(ref[name])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7, err_msg=f"step {step}: {name}")
    if step == 1:
      assert _same(trainer.state["actor"], actor0) and not any(k.startswith("actor/") for k in got)
  epoch1 = [r["actor/clip_fraction"] for e, r in records if e == 0]
  epoch2 = [r["actor/clip_fraction"] for e, r in records if e == 1]
  assert epoch1[0] == 0.0  # the first actor update starts at ratio 1
  assert max(epoch2) > 0.0, epoch2
  assert got["actor/skipped"] == 0 and got["critic/skipped"] == 0


# --------------------------------------------------------------------------------------------------
# 6. prepare_batch after one update, against direct forwards and the plain-Python references.


def _direct_logprobs(graphdef, params, batch, temperature: float) -> np.ndarray:
  """log softmax(logits / temperature)[token] of every response token from one full forward, float64."""
  model = nnx.merge(graphdef, params)
  ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"])
  logits = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)), np.float64) / temperature
  b, r = np.asarray(batch["response_ids"]).shape
  p = ids.shape[1] - r
  out = np.zeros((b, r))
  for i in range(b):
    for j in range(r):
      row = logits[i, p + j - 1]
      top = row.max()
      out[i, j] = row[ids[i, p + j]] - (top + np.log(np.exp(row - top).sum()))
  return out


def _direct_values(graphdef, params, batch) -> np.ndarray:
  """V(s) before every response token: the critic's full-sequence values at the preceding position, float64."""
  critic = nnx.merge(graphdef, params)
  ids, mask = batch["input_ids"], batch["attention_mask"]
  values = np.asarray(critic(ids, mask), np.float64)
  r = batch["response_ids"].shape[1]
  p = ids.shape[1] - r
  return values[:, p - 1:p + r - 1]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
@pytest.mark.slow
def test_prepare_batch_after_an_update_matches_direct_forwards_and_references(algorithm, tmp_path):
  """Catches, in prepare_batch: old or reference log-probs read at the wrong positions, at the wrong temperature,
  from the wrong parameters (e.g. the reference equal to the current actor, or swapped); a KL penalty with the
  wrong sign, coefficient, estimator, tokens (observations) or on the wrong side; a score off the last action
  token; values read off by one position; and advantages / returns that differ from the paper's estimators (GAE
  over action tokens with gamma = lambda = 1 then whitened; GRPO's group normalisation)."""
  c = micro_config(algorithm, **{"actor.warmup_steps": 0, "actor.lr": 1e-2, "critic.warmup_steps": 0})
  trainer = loop.RLTrainer(c, tmp_path)
  traj = _handmade_trajectory()
  first, _ = trainer.prepare_batch(traj, _scored())
  trainer._update(1, first, jax.random.key(5))  # the actor moves away from the frozen reference

  captured = {}
  advantages_fn = trainer._advantages

  def spy(name, rewards, mask, **kwargs):
    captured["rewards"] = np.asarray(rewards)
    return advantages_fn(name, rewards, mask, **kwargs)

  trainer._advantages = spy
  scores = (0.5, 1.0, -1.0, 0.0)
  batch, metrics = trainer.prepare_batch(traj, _scored(scores))

  real = traj.response_mask.astype(bool)  # response positions whose token the forward attends to
  action = traj.action_mask.astype(np.float64)
  temperature = c.rollout.temperature
  logp = _direct_logprobs(trainer.actor_graphdef, trainer.state["actor"], batch, temperature)
  ref_logp = _direct_logprobs(trainer.actor_graphdef, trainer.state["ref"], batch, temperature)
  np.testing.assert_allclose(np.asarray(batch["old_logprobs"])[real], logp[real], atol=2e-5)
  np.testing.assert_allclose(np.asarray(batch["ref_logprobs"])[real], ref_logp[real], atol=2e-5)
  assert np.max(np.abs(logp - ref_logp)[action > 0]) > 1e-3  # the update really separated actor and reference

  # Token rewards: the score on each row's last action token, minus beta * (logp - ref_logp) on action tokens.
  b, r = action.shape
  rewards = np.zeros((b, r))
  for i in range(b):
    last = max(t for t in range(r) if action[i, t])
    rewards[i, last] = scores[i]
    if c.algorithm.use_kl_in_reward:
      for t in range(r):
        if action[i, t]:
          rewards[i, t] -= c.algorithm.kl_coef * (logp[i, t] - ref_logp[i, t])
  np.testing.assert_allclose(captured["rewards"], rewards, atol=1e-6)
  if c.algorithm.use_kl_in_reward:
    row_means = [sum(logp[i, t] - ref_logp[i, t] for t in range(r) if action[i, t]) / action[i].sum()
                 for i in range(b)]
    np.testing.assert_allclose(float(metrics["kl_in_reward"]), np.mean(row_means), rtol=1e-3, atol=1e-7)

  adv, ret = np.asarray(batch["advantages"], np.float64), np.asarray(batch["returns"], np.float64)
  if algorithm == "ppo":
    values = _direct_values(trainer.learner.critic_graphdef, trainer.state["critic"], batch)
    np.testing.assert_allclose(np.asarray(batch["old_values"])[real], values[real], atol=2e-5)
    expected_adv, expected_ret = ref_gae(rewards, values, action, c.algorithm.gamma, c.algorithm.lam)
    np.testing.assert_allclose(ret[action > 0], expected_ret[action > 0], atol=1e-4)
  else:
    expected_adv = ref_grpo(rewards, action, traj.group_ids)
  np.testing.assert_allclose(adv, expected_adv, atol=1e-4)
  assert np.all(adv[action == 0] == 0)
