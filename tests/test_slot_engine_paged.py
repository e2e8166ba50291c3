"""The slot engine on the paged KV cache (`sampling.paging`) against the lockstep driver (dense cache), greedy, on
the steered tiny policy of `test_slot_engine`: episodes of different lengths, slots refilled as episodes end, and
pools small enough that turns wait for pages and episodes are preempted (their pages given back and their context
recomputed); on one device and on a (data 2, fsdp 2, tensor 2) mesh. The two-process run is in
`test_slot_engine_multiprocess`.
"""

from __future__ import annotations

import jax
import pytest

from agent_r1_jax.rollout import run_episodes, run_slot_episodes
from agent_r1_jax.sampling import Sampler
from agent_r1_jax.sampling.paging import PagingConfig
from test_slot_engine import (GREEDY, GREEDY_PROMPTS, PAD, TOK, SteerEnv, assert_same_trajectories, build_policy,
                              make_sampler, rollout_config, stop_strings)


@pytest.fixture(scope="module")
def policy():
  return build_policy()


@pytest.fixture(scope="module")
def lockstep(policy):
  graphdef, params = policy
  config = rollout_config()
  return run_episodes(make_sampler(graphdef, config), params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY,
                      jax.random.key(0))


@pytest.mark.parametrize("slots,chunk,pages", [(3, 1, 0), (8, 2, 34), (2, 3, 34)])
def test_paged_greedy_equals_the_lockstep_driver(policy, lockstep, slots, chunk, pages):
  """A pool for every slot at full length (0), and pools of 33 pages of 8 tokens for 8 and 2 slots: one episode at
  the full cache length (264 tokens), so turns wait for pages and the engine preempts."""
  graphdef, params = policy
  config = rollout_config()
  got = run_slot_episodes(make_sampler(graphdef, config), params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY,
                          jax.random.key(0), slots_per_device=slots, decode_chunk=chunk,
                          paging=PagingConfig(page_size=8, pages_per_device=pages))
  assert_same_trajectories(got, lockstep, logprob_atol=2e-5)
  if pages:
    assert got.stats["preemptions"] > 0, "the small pool was meant to make the engine preempt"
  else:
    assert got.stats["preemptions"] == 0


def test_paged_slots_on_a_mesh_equal_the_lockstep_driver(policy, lockstep):
  """(data 2, fsdp 2, tensor 2): 2 slots on each of the 4 batch devices, each device with its own pool of 40 pages
  (a shard_map over the batch devices reads them; KV heads over tensor)."""
  from agent_r1_jax.models import make_mesh, state_shardings  # pylint: disable=import-outside-toplevel
  graphdef, params = policy
  config = rollout_config()
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  sharded = jax.device_put(params, state_shardings(params, mesh))
  sampler = Sampler(graphdef, max_cache_length=config.cache_length, pad_id=PAD, mesh=mesh,
                    stop_sequences=stop_strings.turn_stop_sequences(TOK, False))
  got = run_slot_episodes(sampler, sharded, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY, jax.random.key(0),
                          slots_per_device=2, decode_chunk=3, paging=PagingConfig(page_size=8, pages_per_device=40))
  assert got.stats["slots"] == 8
  assert_same_trajectories(got, lockstep, logprob_atol=2e-5)
