"""The RL kernels under a (data=8) mesh of fake CPU devices give the single-device results."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from agent_r1_jax import rl
from test_rl_reference import random_batch
from test_rl_reference import ref_advantages

ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo")
GAMMA, LAM = 0.95, 0.9


@jax.jit
def _everything(rewards, values, mask, gids, logp, old_logp):
  params = rl.AdvantageParams(gamma=GAMMA, lam=LAM)
  advs = {name: rl.compute_advantages(name, rewards, mask, values=values, group_ids=gids, params=params)
          for name in ESTIMATORS}
  adv = advs["gae"][0]
  losses = {mode: (rl.compute_policy_loss(old_logp, logp, adv, mask, loss_agg_mode=mode),
                   rl.compute_value_loss(values + 0.1, values, advs["gae"][1], mask, loss_agg_mode=mode),
                   rl.compute_kl_loss(logp, old_logp, mask, loss_agg_mode=mode))
            for mode in rl.LOSS_AGG_MODES}
  grad = jax.grad(lambda x: rl.compute_policy_loss(old_logp, x, adv, mask).loss.value())(logp)
  return advs, rl.finalize(losses), grad


def test_data_parallel_mesh_matches_single_device():
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices; tests/conftest.py sets XLA_FLAGS for that")
  rewards, values, mask, gids = random_batch(11, batch=16, horizon=24)
  rng = np.random.default_rng(0)
  old_logp = rng.normal(-1.5, 1.0, mask.shape).astype(np.float32)
  logp = (old_logp + rng.normal(0.0, 0.3, mask.shape)).astype(np.float32)
  args = (rewards, values, mask, gids, logp, old_logp)

  single = _everything(*args)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  rows = NamedSharding(mesh, P("data"))
  sharded_args = [jax.device_put(a, rows) for a in args]
  sharded = _everything(*sharded_args)

  assert len(sharded[0]["gae"][0].sharding.device_set) == 8
  for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-6)
  # And both agree with the plain-Python reference (group statistics cross shard boundaries here).
  for name in ESTIMATORS:
    ref, _ = ref_advantages(name, rewards, mask, values, gids, GAMMA, LAM)
    np.testing.assert_allclose(np.asarray(sharded[0][name][0]), ref, atol=1e-5, rtol=0)
