"""Advantage estimators vs the plain-Python references (compaction + backward loop) and the registry."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from agent_r1_jax import rl
from agent_r1_jax.rl import advantages as adv_lib
from test_rl_reference import random_batch
from test_rl_reference import ref_advantages
from test_rl_reference import ref_gae
from test_rl_reference import ref_grpo

TOL = 1e-5
GAMMA, LAM = 0.97, 0.9
ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo")


@functools.partial(jax.jit, static_argnames=("name", "params"))
def _jit_advantages(name, rewards, mask, values, group_ids, params):
  return rl.compute_advantages(name, rewards, mask, values=values, group_ids=group_ids, params=params)


def test_registry_names_and_requirements():
  assert set(rl.ADVANTAGE_ESTIMATORS) == set(ESTIMATORS)
  assert rl.get_estimator("gae").needs_values
  assert not rl.get_estimator("grpo").needs_values and rl.get_estimator("grpo").needs_group_ids
  with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
    rl.get_estimator("ppo")
  r, _, m, _ = random_batch(0, batch=6, horizon=16)
  with pytest.raises(ValueError, match="needs critic `values`"):
    rl.compute_advantages("gae", r, m)
  with pytest.raises(ValueError, match="needs `group_ids`"):
    rl.compute_advantages("rloo", r, m)


@pytest.mark.parametrize("name,method", [(n, "scan") for n in ESTIMATORS]
                         + [("gae", "associative"), ("reinforce_plus_plus", "associative")])
def test_estimators_match_reference(name, method):
  params = adv_lib.AdvantageParams(gamma=GAMMA, lam=LAM, method=method)
  for seed in (0, 1):
    r, v, m, g = random_batch(seed)
    adv, ret = _jit_advantages(name, r, m, v, g, params)
    ref_adv, ref_ret = ref_advantages(name, r, m, v, g, GAMMA, LAM)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, atol=TOL, rtol=0)
    assert np.all(np.asarray(adv)[m == 0] == 0.0)
    if ref_ret is not None:
      np.testing.assert_allclose(np.asarray(ret), ref_ret, atol=TOL, rtol=0)


def test_direct_functions_match_reference_with_non_default_options():
  r, v, m, g = random_batch(3)
  adv, ret = jax.jit(rl.compute_gae, static_argnames=("whiten", "method"))(r, v, m, 1.0, 1.0, whiten=False)
  ref_adv, ref_ret = ref_gae(r, v, m, 1.0, 1.0, whiten=False)
  np.testing.assert_allclose(np.asarray(adv), ref_adv, atol=TOL, rtol=0)
  np.testing.assert_allclose(np.asarray(ret), ref_ret, atol=TOL, rtol=0)
  grpo = jax.jit(rl.compute_grpo, static_argnames=("norm_by_std",))(r, m, g, norm_by_std=False)
  np.testing.assert_allclose(np.asarray(grpo), ref_grpo(r, m, g, norm_by_std=False), atol=TOL, rtol=0)


def test_gae_hand_computed_case():
  adv, ret = rl.compute_gae(np.array([[0.0, 5.0, 1.0]]), np.array([[0.5, 9.0, 0.25]]),
                            np.array([[1, 0, 1]]), 0.5, 0.5, whiten=False)
  np.testing.assert_allclose(np.asarray(adv), [[-0.1875, 0.0, 0.75]], atol=1e-7)
  np.testing.assert_allclose(np.asarray(ret), [[0.3125, 0.0, 1.0]], atol=1e-7)


def test_group_ids_only_matter_up_to_relabelling():
  r, _, m, g = random_batch(4)
  relabelled = np.array([{3: 0, 17: 1, 400: 2, 9: 3, 123456: 4, 999_999: 5}[int(x)] for x in g], np.int32)
  for fn in map(jax.jit, (rl.compute_grpo, rl.compute_rloo, rl.compute_reinforce_pp_baseline)):
    np.testing.assert_array_equal(np.asarray(fn(r, m, g)), np.asarray(fn(r, m, relabelled)))


def test_bool_mask_equals_float_mask():
  r, v, m, _ = random_batch(5)
  a_float, _ = rl.compute_gae(r, v, m, GAMMA, LAM)
  a_bool, _ = rl.compute_gae(r, v, m.astype(bool), GAMMA, LAM)
  np.testing.assert_array_equal(np.asarray(a_float), np.asarray(a_bool))
