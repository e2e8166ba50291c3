"""Compacted slot calls: an extend or decode chunk computes only the rows taking part, gathered per device.

References: numpy indexing for the row gather/scatter; the same decoder calls run over every slot (compaction
off) for the programs; the lockstep driver for whole rollouts on a mesh with several slots per device.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from agent_r1_jax.models import make_mesh, state_shardings
from agent_r1_jax.rollout import run_episodes, run_slot_episodes, stop_strings
from agent_r1_jax.sampling import Sampler, SamplingParams
from agent_r1_jax.sampling.row_gather import put_rows, take_rows
from agent_r1_jax.sampling.slots import SlotDecoder
from test_slot_engine import (GREEDY_PROMPTS, PAD, TOK, SteerEnv, assert_same_trajectories, build_policy, ids,
                              make_sampler, rollout_config)

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def policy():
  return build_policy()


def test_take_and_put_rows_match_numpy_on_a_mesh():
  """8 rows over the 4 batch devices of a (data 2, fsdp 2, tensor 2) mesh: device d's local picks `rows[d]` are
  global rows 2 d + rows[d]; put_rows writes them back there and nowhere else; the result keeps the rows' sharding."""
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  x = np.arange(8 * 3 * 4, dtype=np.float32).reshape(8, 3, 4)
  rows = np.array([[1], [0], [1], [1]], np.int32)
  new = -np.arange(4 * 3 * 4, dtype=np.float32).reshape(4, 3, 4)
  names = ("batch", None, "act_kv_heads")
  batch = NamedSharding(mesh, P(("data", "fsdp")))
  with jax.set_mesh(mesh):
    placed_x, placed_rows = jax.device_put(x, batch), jax.device_put(rows, batch)
    taken = jax.jit(lambda a, r: take_rows(a, r, names))(placed_x, placed_rows)
    put = jax.jit(lambda a, r, v: put_rows(a, r, v, names))(placed_x, placed_rows, jax.device_put(new, batch))
  global_rows = 2 * np.arange(4) + rows[:, 0]
  np.testing.assert_array_equal(np.asarray(taken), x[global_rows])
  want = x.copy()
  want[global_rows] = new
  np.testing.assert_array_equal(np.asarray(put), want)
  assert put.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"), None, "tensor")), 3)


def test_selection_puts_each_devices_taking_part_rows_first_without_repeats(policy):
  graphdef, _ = policy
  config = rollout_config()
  decoder = SlotDecoder(make_sampler(graphdef, config), slots_per_device=16, decode_chunk=2)
  assert [decoder.compact_width(b) for b in (0, 1, 2, 3, 5, 8, 9, 16)] == [1, 1, 2, 4, 8, 8, 16, 16]
  rng = np.random.default_rng(0)
  for _ in range(20):
    taking = rng.random(16) < rng.random()
    selection = decoder._selection(taking, None)  # pylint: disable=protected-access
    k = int(taking.sum())
    if k > 8:
      assert selection is None
      continue
    index, rows = selection
    assert index.shape == (1, decoder.compact_width(k)) and len(set(rows.tolist())) == rows.size
    assert rows[:k].tolist() == np.flatnonzero(taking).tolist()


def test_compacted_calls_equal_calls_over_every_slot(policy):
  """8 slots; prompts go into slots 1, 5, 6; then chunks decode slot 5 alone, then slots 1 and 6. The compacted
  decoder (calls over 4, 1 and 2 rows) gives the tokens, counts, reasons and cache of one whose every call runs all
  8 rows, and a row that takes no part in a call keeps its cache bit for bit."""
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  prepared = sampler.prepare(params)
  compact = SlotDecoder(sampler, slots_per_device=8, decode_chunk=4)
  full = SlotDecoder(sampler, slots_per_device=8, decode_chunk=4)
  full.compact_width = lambda busiest: full.slots_per_device  # compaction off
  prompts = [[] for _ in range(8)]
  for slot, text in ((1, GREEDY_PROMPTS[0]), (5, GREEDY_PROMPTS[1]), (6, GREEDY_PROMPTS[5])):
    prompts[slot] = ids(text)
  reset = np.array([bool(p) for p in prompts])
  states = {}
  for name, decoder in (("compact", compact), ("full", full)):
    states[name] = decoder.extend(prepared, decoder.init(), prompts, reset)
  assert compact._selection(reset, None)[0].shape == (1, 4)  # pylint: disable=protected-access
  episodes = np.arange(8)
  for active in ((5,), (1, 6)):
    budgets = np.zeros(8, np.int64)
    budgets[list(active)] = 6
    fresh = budgets > 0
    idle = [b for b in (1, 6) if b not in active]
    before = {b: np.asarray(states["compact"].cache.k[0][b]) for b in idle}
    chunks = {}
    for name, decoder in (("compact", compact), ("full", full)):
      states[name], chunks[name] = decoder.decode(prepared, states[name], budgets, fresh, episodes, GREEDY,
                                                  jax.random.key(0))
    got, want = chunks["compact"], chunks["full"]
    for field in ("tokens", "counts", "stop_reasons", "lengths"):
      np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=2e-5, rtol=0)
    assert (got.counts[list(active)] > 0).all() and (got.counts[[b for b in range(8) if b not in active]] == 0).all()
    for b in idle:
      np.testing.assert_array_equal(np.asarray(states["compact"].cache.k[0][b]), before[b])
  a, b = states["compact"].cache, states["full"].cache
  for name in ("valid", "lengths", "cursor"):
    np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)
  for layer in range(len(a.k)):
    valid = np.asarray(a.valid)
    np.testing.assert_allclose(np.asarray(a.k[layer])[valid], np.asarray(b.k[layer])[valid], atol=2e-5)
    np.testing.assert_allclose(np.asarray(a.v[layer])[valid], np.asarray(b.v[layer])[valid], atol=2e-5)
  np.testing.assert_allclose(np.asarray(states["compact"].last_logits), np.asarray(states["full"].last_logits),
                             atol=1e-4)


def test_compacted_slots_on_a_mesh_equal_the_lockstep_driver(policy):
  """4 slots on each of the 4 batch devices of a (data 2, fsdp 2, tensor 2) mesh, 8 greedy episodes: admission
  spreads them 2 per device, so every call is compacted to at most 2 rows per device; the episodes are the
  single-device lockstep driver's."""
  graphdef, params = policy
  config = rollout_config()
  want = run_episodes(make_sampler(graphdef, config), params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY,
                      jax.random.key(0))
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  sampler = Sampler(graphdef, max_cache_length=config.cache_length, pad_id=PAD, mesh=mesh,
                    stop_sequences=stop_strings.turn_stop_sequences(TOK, False))
  got = run_slot_episodes(sampler, jax.device_put(params, state_shardings(params, mesh)), SteerEnv(), TOK,
                          GREEDY_PROMPTS, config, GREEDY, jax.random.key(0), slots_per_device=4, decode_chunk=3)
  assert got.stats["slots"] == 16
  assert_same_trajectories(got, want, logprob_atol=2e-5)


def test_slot_extend_buckets_are_quarter_octaves():
  """Hand-listed sizes, and for every length up to 4096: the bucket holds it, pads it by at most a quarter (above
  the floor of 8), and is 2^k (1 + j / 4)."""
  from agent_r1_jax.sampling.buckets import slot_extend_bucket  # pylint: disable=import-outside-toplevel
  assert [slot_extend_bucket(t) for t in (0, 1, 8, 9, 11, 16, 17, 33, 65, 100, 1000, 1025)] == [
      8, 8, 8, 10, 12, 16, 20, 40, 80, 112, 1024, 1280]
  allowed = {(4 + j) << k for k in range(1, 12) for j in range(4)}
  for t in range(9, 4097):
    b = slot_extend_bucket(t)
    assert t <= b <= 1.25 * t and b in allowed, (t, b)
