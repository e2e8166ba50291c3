"""The paged KV cache (`models.paged_kv_cache`, `models.paged_attention`, `sampling.paging`) on a tiny random Qwen2.

References, independent of the paged code: the model's full forward without any cache over each row's whole context
(the logits of every new token must be those at its position), and the dense `KVCache` path. The kernels are checked
on the inputs our code hands them: the Pallas paged decode kernels run in interpret mode on CPU (the GPU kernel in
Pallas' interpreter, the TPU one under `pltpu.force_tpu_interpret_mode()`); the TPU Ragged Paged Attention kernel
does not run in interpret mode in this JAX, so its own reference function `ref_ragged_paged_attention` is given
exactly the arguments our code passes the kernel (padded head width, kv_lens, cu_q_lens, our page tables).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.models.paged_kv_cache import NULL_PAGE, PagedKVCache, init_pools
from agent_r1_jax.sampling.paging import PagePool, PagingConfig

VOCAB, PAGE = 61, 4


def model(head_dim: int = 16) -> Qwen2ForCausalLM:
  config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim)
  return Qwen2ForCausalLM(config, rngs=nnx.Rngs(1))


def churned_pool(slots: int, pages_per_device: int, max_length: int) -> PagePool:
  """A pool whose free stack is out of order: pages were taken and given back in a scrambled order."""
  pool = PagePool(PagingConfig(page_size=PAGE, pages_per_device=pages_per_device), slots=slots,
                  slots_per_device=slots, max_length=max_length)
  rng = np.random.default_rng(0)
  for slot in range(slots):
    pool.grow(slot, int(rng.integers(1, 4)) * PAGE)
  for slot in rng.permutation(slots):
    pool.release(int(slot))
  return pool


class Episodes:
  """Rows of random tokens fed in steps of ragged appends; `contexts[b]` is row b's whole context so far."""

  def __init__(self, rows: int, seed: int = 0):
    self.rng = np.random.default_rng(seed)
    self.contexts = [[] for _ in range(rows)]

  def step(self, counts):
    width = max(max(counts), 1)
    ids = np.zeros((len(counts), width), np.int32)
    mask = np.zeros((len(counts), width), np.int32)
    for b, n in enumerate(counts):
      new = self.rng.integers(0, VOCAB, n).tolist()
      ids[b, :n], mask[b, :n] = new, 1
      self.contexts[b] += new
    return jnp.asarray(ids), jnp.asarray(mask)


def full_forward_logits(m, context: list[int]) -> np.ndarray:
  """`[len, V]` logits of every position of `context`, from the model without a cache."""
  return np.asarray(m(jnp.asarray([context]), jnp.ones((1, len(context)), jnp.int32))[0])


def jitted(m):
  """`m(ids, mask, cache=cache)` as one compiled program (the cache's layout and backend are static)."""
  graphdef, params = nnx.split(m)
  run = jax.jit(lambda p, ids, mask, cache: nnx.merge(graphdef, p)(ids, mask, cache=cache))
  return lambda ids, mask, cache: run(params, ids, mask, cache)


def paged_cache(m, pool: PagePool, layout: str, backend: str) -> PagedKVCache:
  pools = init_pools(m.config, pool.pages_per_device, PAGE, layout, jnp.float32,
                     128 if backend == "ragged_paged" else 1)
  return PagedKVCache(pools, jnp.asarray(pool.table), jnp.zeros(pool.table.shape[0], jnp.int32), layout, backend)


def run_schedule(m, layout: str, backend: str, schedule, *, pages_per_device: int, max_length: int,
                 refill: dict[int, int] | None = None, tol: float = 1e-5, before=contextlib.nullcontext,
                 jit: bool = True) -> int:
  """Feeds `schedule` (per step, tokens appended per row) through a paged cache whose pages the `PagePool` hands out;
  every new token's logits must equal the full forward's at its position (one full forward per episode, at its
  end: the model is causal). `refill` {step: row}: the row's episode ends before that step (its pages go back, its
  length is reset) and a new one starts in the freed pages. Returns the fewest free pages seen after a step."""
  rows = len(schedule[0])
  pool = churned_pool(rows, pages_per_device, max_length)
  cache = paged_cache(m, pool, layout, backend)
  episodes = Episodes(rows)
  forward = jitted(m) if jit else (lambda ids, mask, cache: m(ids, mask, cache=cache))
  got = [[] for _ in range(rows)]  # per row, the new tokens' logits of the current episode, in order
  least_free = pool.free(0)

  def check(b):
    want = full_forward_logits(m, episodes.contexts[b])
    np.testing.assert_allclose(np.concatenate(got[b]), want, atol=tol, rtol=tol, err_msg=f"row {b} ({backend})")

  for step, counts in enumerate(schedule):
    if refill and step in refill:
      row = refill[step]
      check(row)
      pool.release(row)
      episodes.contexts[row], got[row] = [], []
      cache = dataclasses.replace(cache, lengths=cache.lengths.at[row].set(0))
    for b, n in enumerate(counts):
      if n:
        pool.grow(b, len(episodes.contexts[b]) + n)
    cache = dataclasses.replace(cache, page_table=jnp.asarray(pool.table))
    least_free = min(least_free, pool.free(0))
    ids, mask = episodes.step(counts)
    with before():
      logits, cache = forward(ids, mask, cache)
    for b, n in enumerate(counts):
      got[b].append(np.asarray(logits[b, :n]))
    assert np.asarray(cache.lengths).tolist() == [len(c) for c in episodes.contexts]
  for b in range(rows):
    check(b)
  return least_free


# Per step, tokens appended per row: prompts of different lengths, single-token decode steps (rows that take no
# part: 0), a ragged append (an observation) and more decode.
SCHEDULE = [(5, 11, 1), (1, 1, 1), (1, 0, 1), (7, 1, 0), (1, 1, 1), (1, 1, 9)]


@pytest.mark.parametrize("layout", ["combined", "head_major"])
def test_paged_logits_equal_the_full_forward_with_refills_and_a_full_pool(layout):
  """Pages out of order (a churned free stack), rows of different lengths, a refill of row 1 after its episode ends,
  and a pool with exactly the pages the rows end up holding (full: no page left)."""
  # After step 5 the rows hold 16, 15 and 13 tokens: 4 + 4 + 4 pages, every page of the pool. Row 1's episode then
  # ends and a new one starts in its pages.
  schedule = SCHEDULE + [(0, 3, 0), (1, 1, 1)]
  least_free = run_schedule(model(), layout, "xla", schedule, pages_per_device=13, max_length=20, refill={6: 1})
  assert least_free == 0, "the schedule was meant to fill the pool"


def test_churned_pool_hands_out_pages_out_of_order():
  pool = churned_pool(3, 13, 20)
  for b in range(3):
    pool.grow(b, 16)
  held = pool.table[pool.table != NULL_PAGE]
  assert sorted(held.tolist()) == list(range(1, 13))  # every page once
  assert any(np.any(np.diff(row) != 1) for row in pool.table), "pages came in order"


def test_paged_logits_equal_the_dense_cache():
  """The same appends through the dense `KVCache` and the paged cache give the same logits (float32: 1e-5)."""
  from agent_r1_jax.models.kv_cache import KVCache  # pylint: disable=import-outside-toplevel
  m = model()
  pool = churned_pool(3, 20, 48)
  paged, dense = paged_cache(m, pool, "combined", "xla"), KVCache.init(m.config, 3, 48)
  episodes, forward = Episodes(3), jitted(m)
  for counts in SCHEDULE:
    for b, n in enumerate(counts):
      if n:
        pool.grow(b, len(episodes.contexts[b]) + n)
    paged = dataclasses.replace(paged, page_table=jnp.asarray(pool.table))
    ids, mask = episodes.step(counts)
    got, paged = forward(ids, mask, paged)
    want, dense = forward(ids, mask, dense)
    np.testing.assert_allclose(np.asarray(got) * np.asarray(mask)[..., None],
                               np.asarray(want) * np.asarray(mask)[..., None], atol=1e-5, rtol=0)


def _reference_rpa(monkeypatch):
  """`ragged_paged_attention` replaced by the kernel's own reference (same arguments, block sizes dropped)."""
  from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa  # pylint: disable=import-outside-toplevel
  calls = []

  def reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, sm_scale, num_kv_pages_per_block,
                num_queries_per_block):
    rpa.static_validate_inputs(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=sm_scale,
                               num_kv_pages_per_block=num_kv_pages_per_block,
                               num_queries_per_block=num_queries_per_block)
    calls.append(kv_pages.shape)
    return rpa.ref_ragged_paged_attention(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=sm_scale)

  monkeypatch.setattr(rpa, "ragged_paged_attention", reference)
  return calls


@pytest.mark.parametrize("head_dim,combined_heads", [(16, 4), (64, 2), (128, 4)])
def test_ragged_paged_kernel_inputs_mean_what_the_kernel_reads(monkeypatch, head_dim, combined_heads):
  """Appends and decode steps with backend ragged_paged: the kernel's reference function, fed what our code feeds
  the kernel, gives the full forward's logits. The pages hold 128-lane heads: two KV heads of 64 packed into one
  (2 combined key/value heads), heads of 16 zero-padded (8 would not divide K = 2), heads of 128 as they are."""
  calls = _reference_rpa(monkeypatch)
  m = model(head_dim)
  run_schedule(m, "combined", "ragged_paged", SCHEDULE, pages_per_device=20, max_length=48, refill={4: 0}, jit=False)
  assert calls and all(shape[-1] == 128 and shape[2] == combined_heads for shape in calls)


@pytest.mark.parametrize("backend", ["pallas_gpu_decode", "pallas_tpu_decode"])
def test_pallas_paged_decode_kernels_in_interpret_mode(backend):
  """Decode steps (T = 1) through the Pallas paged decode kernels in interpret mode match the full forward (GPU
  kernel: float32 1e-5; the TPU kernel's interpreter computes in lower precision: bf16 tolerance); appends go
  through the XLA path."""
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=import-outside-toplevel
  before = pltpu.force_tpu_interpret_mode if backend == "pallas_tpu_decode" else contextlib.nullcontext
  tol = 1e-5 if backend == "pallas_gpu_decode" else 2e-2
  run_schedule(model(), "head_major", backend, SCHEDULE, pages_per_device=20, max_length=64, tol=tol, before=before)


def test_page_pool_accounting():
  """grow takes only missing pages from the slot's own device, shrink/release give back the tail, a shortfall is
  reported before anything is taken, and freed pages are handed out first."""
  pool = PagePool(PagingConfig(page_size=4, pages_per_device=7), slots=4, slots_per_device=2, max_length=24)
  assert pool.pages_per_row == 6 and pool.free(0) == pool.free(2) == 6
  pool.grow(0, 9)  # 3 pages of device 0
  assert pool.table[0, :3].tolist() == [1, 2, 3] and pool.free(0) == 3 and pool.free(2) == 6
  assert pool.shortfall(1, 20) == 2 and pool.shortfall(1, 12) == 0
  with pytest.raises(RuntimeError, match="more pages"):
    pool.grow(1, 20)
  assert pool.free(0) == 3 and pool.held[1] == 0  # nothing taken
  pool.shrink(0, 4)
  assert pool.table[0].tolist() == [1, 0, 0, 0, 0, 0] and pool.free(0) == 5
  pool.grow(1, 8)
  assert pool.table[1, :2].tolist() == [2, 3]  # the pages just given back, last freed first
  pool.grow(2, 24)
  assert pool.free(2) == 0 and pool.free(0) == 3
  with pytest.raises(ValueError, match="exceed"):
    pool.grow(3, 25)
  with pytest.raises(ValueError, match="cannot hold one episode"):
    PagePool(PagingConfig(page_size=4, pages_per_device=6), slots=2, slots_per_device=2, max_length=24)
  assert PagePool(PagingConfig(page_size=4), slots=2, slots_per_device=2, max_length=24).pages_per_device == 13
