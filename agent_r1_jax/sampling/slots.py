"""Decode slots: a fixed set of N cache rows that episodes stream through, driven by the slot engine's
jitted programs (the device half of the slot engine; `rollout.slot_engine` is the host loop).

Shapes (all static, so each program compiles once per bucket):
  N   slots (global rows: `slots_per_device` x the devices along the mesh's batch axes, data x fsdp); a process
      passes and gets back its own n = N / processes rows (`SlotDecoder.slots`), rows [i n, (i + 1) n) being
      process i's (`multihost.global_rows`);
  S   cache slots per row (`Sampler.max_cache_length`);  V vocabulary;  K stop window (`stop_sequences.pack`);
  Tb  extension bucket of the longest row appended in one call (`buckets.slot_extend_bucket`);
  C   `decode_chunk`, tokens per row per decode call.

State (`SlotState`): the KV cache `[N, S]`, next-token logits `[N, V]`, and each row's stop window `[N, K]` (its
last K tokens of the current turn, -1 before the turn's first). A slot holds one episode at a time; its cache row
is the episode's context written from slot 0: prompt, then sampled turns and observations in order, so a row's
cursor always equals its real-token count (no left padding).

Programs: `slot_programs` (extend, decode chunk); this module places their inputs and reads their outputs.

Multi-process (multi-controller JAX, a mesh spanning every process): `init`, `extend` and `decode` are collective
programs. Every process must call them in the same order with the same static shapes: the same N and C, and for
`extend` the same bucket Tb, which is why `SlotDecoder.extend` takes the longest row over all processes
(`extend_length`, agreed by the caller or reduced here). A process with nothing to do still joins a call: an
extend whose local rows are all empty and not reset, a decode whose local budgets are all 0, leave its rows
untouched. Episode numbers passed to `decode` must be global (unique over processes) for the keys below to be.

Randomness is keyed by episode and position (`slot_programs`), so an episode samples the same tokens whichever
slot it runs in, whichever other episodes share the batch, and however its turns are cut into chunks.

Worked example of slot reuse (N = 2, C = 4, three episodes): episode 0 is prefilled into slot 0 and episode 1
into slot 1 (one extend, both rows reset); after some chunks slot 1's episode ends, and the next extend resets
row 1 and appends episode 2's prompt at slots [0, p2) while row 0, waiting for its tool, appends nothing; row 1's
old keys/values beyond p2 stay in memory but are invalid, and are overwritten as episode 2 grows.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from agent_r1_jax.models.kv_cache import KVCache, kv_axes
from agent_r1_jax.models.paged_attention import layout_of
from agent_r1_jax.models.paged_kv_cache import PagedKVCache, pool_axes
from agent_r1_jax.sampling import buckets, multihost
from agent_r1_jax.sampling.paging import PagePool, PagingConfig
from agent_r1_jax.sampling.params import SamplingParams
from agent_r1_jax.sampling.sampler import Sampler
from agent_r1_jax.sampling.slot_programs import (compiled_slot_programs, decode_chunk_jit, init_jit, init_paged_jit,
                                                 init_paged_state, init_state, slot_extend_jit)


@dataclasses.dataclass
class SlotState:
  """The slots' device state plus the host's account of each row's fill.

  Attributes:
    cache: KV cache over N rows (`KVCache`).
    last_logits: float32 `[N, V]`, each row's next-token logits.
    window: int32 `[N, K]`, each row's last K tokens of its current turn (-1 before the turn's first).
    host_lengths: int64 `[n]`, real tokens in each of this process's rows (= its cursor; checked against the
      device after a chunk).
  """

  cache: KVCache
  last_logits: jax.Array
  window: jax.Array
  host_lengths: np.ndarray


@dataclasses.dataclass(frozen=True)
class Chunk:
  """One decode call's output (numpy), over this process's n rows (N with one process).

  tokens int32 `[n, C]` (pad after a row's count), logprobs float32 `[n, C]` (0 after it), counts int32 `[n]`
  tokens sampled this chunk, stop_reasons int32 `[n]` (`StopReason`: NONE = the turn goes on), lengths int32 `[n]`
  real tokens in each cache row after the chunk.
  """

  tokens: np.ndarray
  logprobs: np.ndarray
  counts: np.ndarray
  stop_reasons: np.ndarray
  lengths: np.ndarray


def batch_devices(mesh: Mesh | None) -> int:
  """Devices a batch row is split over: data x fsdp of the mesh (1 without one); tensor devices share rows."""
  if mesh is None:
    return 1
  shape = dict(mesh.shape)
  return shape.get("data", 1) * shape.get("fsdp", 1)


class SlotDecoder:
  """N decode slots over a `Sampler`'s model, stops, pad id, cache size, cache dtype and mesh.

  Args:
    sampler: the lockstep sampler whose settings the slots share (its programs are not used).
    slots_per_device: rows per batch device; N = slots_per_device x `batch_devices(sampler.mesh)`.
    decode_chunk: C, tokens per row per `decode` call.
    paging: a paged KV cache (`models.paged_kv_cache`; its pages accounted for in `pages`, a `PagePool`), or None
      for the dense `[N, S]` cache. Paged: `extend` and `decode` give each row the pages its new tokens need
      (a RuntimeError if its device has too few free: the caller reserves first, `reserve`); a reset row keeps its
      pages (rewritten from position 0) until `trim` returns them; the page table goes to the device with every
      call.

  Attributes:
    slots: n, the rows this process passes to `extend` / `decode` and gets back: N, or with a mesh spanning P
      processes N / P (slots_per_device x this process's batch devices); every process must use the same
      slots_per_device and decode_chunk.
    global_slots: N, the rows of the device state.
    slots_per_device: N / D, the rows each batch device holds (D = data x fsdp devices).

  Compaction: a call computes only the rows that take part (extend: rows appending or reset; decode: rows with a
  budget). Each device gathers its own taking-part rows into m = the power of two >= the most any device has,
  runs the program on those D m rows and scatters them back (`take_rows` / `put_rows`; no communication); when m
  would exceed half the slots per device, the call runs over all N rows instead, so the gathered copy never adds
  more than half a cache. `compact_width` is this choice; m must be the same on every process (it is a shape),
  which is why `extend` and `decode` take the busiest device's count over all processes (`busiest`).
  """

  def __init__(self, sampler: Sampler, *, slots_per_device: int, decode_chunk: int,
               paging: PagingConfig | None = None):
    for name, value in (("slots_per_device", slots_per_device), ("decode_chunk", decode_chunk)):
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    self.sampler = sampler
    self.global_slots = int(slots_per_device) * batch_devices(sampler.mesh)
    processes = jax.process_count() if sampler.mesh is not None else 1
    if self.global_slots % processes:
      raise ValueError(f"the mesh {dict(sampler.mesh.shape)} has {batch_devices(sampler.mesh)} batch devices "
                       f"(data x fsdp), which do not split evenly over {processes} processes; put the processes "
                       "along the data/fsdp axes")
    self.slots = self.global_slots // processes
    self.slots_per_device = int(slots_per_device)
    self.local_devices = self.slots // self.slots_per_device
    self.decode_chunk = int(decode_chunk)
    self._kv_heads = sampler.config.num_key_value_heads
    self.paging, self.pages = paging, None
    if paging is not None:
      platform = sampler.mesh.devices.flat[0].platform if sampler.mesh is not None else jax.default_backend()
      self.backend = paging.resolved_backend(platform)
      self.pages = PagePool(paging, slots=self.slots, slots_per_device=self.slots_per_device,
                            max_length=sampler.max_cache_length)
    # The sampler's placement (under its mesh: rows over the batch axes, replicated stops and key) and stops.
    # pylint: disable-next=protected-access
    self._run, self._rows, self._same, self._stops = sampler._run, sampler._batch, sampler._replicated, sampler._stops

  def compact_width(self, busiest: int) -> int:
    """m, the rows per device a call computes when the busiest device has `busiest` rows taking part: the power
    of two >= busiest (at least 1) if at most half of `slots_per_device`, else `slots_per_device` (no gather)."""
    m = buckets.pow2_bucket(busiest, 1)
    return m if 2 * m <= self.slots_per_device else self.slots_per_device

  def busiest(self, taking_part: np.ndarray) -> int:
    """The most rows taking part (bool `[n]`) on any of this process's batch devices."""
    return int(np.asarray(taking_part, bool).reshape(self.local_devices, self.slots_per_device).sum(1).max())

  def _selection(self, taking_part: np.ndarray, busiest: int | None) -> tuple[np.ndarray, np.ndarray] | None:
    """None (a call over every row), or (`index` int32 `[local devices, m]`: per device, its taking-part rows then
    others, none repeated; `rows` int64 `[local devices x m]`: the same as this process's row numbers)."""
    if busiest is None:
      busiest = int(multihost.agreed_max([self.busiest(taking_part)])[0])
    elif busiest < self.busiest(taking_part):
      raise ValueError(f"busiest={busiest} is below this process's busiest device ({self.busiest(taking_part)} "
                       "rows); pass the max over all processes (or None to compute it)")
    m = self.compact_width(busiest)
    if m == self.slots_per_device:
      return None
    per_device = np.asarray(taking_part, bool).reshape(self.local_devices, self.slots_per_device)
    # A stable sort puts each device's taking-part rows first, in slot order; the rest fill the bucket.
    index = np.argsort(~per_device, axis=1, kind="stable")[:, :m].astype(np.int32)
    rows = (index + self.slots_per_device * np.arange(self.local_devices)[:, None]).reshape(-1)
    return index, rows

  def init(self) -> SlotState:
    """Every slot empty: no valid cache slot, lengths and cursors 0, windows -1."""
    s = self.sampler
    config = s.config
    if self.pages is not None:
      cache, logits, window = self._run(init_paged_jit, **self._paged_shape())
      return SlotState(cache, logits, window, np.zeros(self.slots, np.int64))
    cache, logits, window = self._run(
        init_jit, rows=self.global_slots, max_length=s.max_cache_length, layers=config.num_hidden_layers,
        kv_width=config.num_key_value_heads * config.head_dim, vocab=config.vocab_size,
        window=self._stops.shape[1], cache_dtype=s.cache_dtype, kv_heads=config.num_key_value_heads)
    return SlotState(cache, logits, window, np.zeros(self.slots, np.int64))

  def _paged_shape(self) -> dict:
    """`init_paged_state`'s static arguments: the pool over every device's pages."""
    s = self.sampler
    return dict(config=s.config, rows=self.global_slots, pages=self.pages.pages_per_device * batch_devices(s.mesh),
                pages_per_row=self.pages.pages_per_row, page_size=self.pages.page_size,
                layout=layout_of(self.backend), backend=self.backend, window=self._stops.shape[1], cache_dtype=s.cache_dtype)

  def _with_pages(self, state: SlotState, tokens: np.ndarray, taking_part: np.ndarray) -> KVCache | PagedKVCache:
    """The state's cache, with (paged) each row taking part grown to hold `tokens[b]` tokens and the page table
    sent along."""
    if self.pages is None:
      return state.cache
    for b in np.flatnonzero(taking_part & (tokens > self.pages.held * self.pages.page_size)):
      self.pages.grow(int(b), int(tokens[b]))
    return dataclasses.replace(state.cache, page_table=self._rows(self.pages.table.copy()))

  def reserve(self, slot: int, tokens: int) -> bool:
    """Paged: whether `slot` now holds pages for `tokens` tokens (taken if its device has them free; False, and
    nothing taken, if not). Dense: True."""
    if self.pages is None:
      return True
    if self.pages.shortfall(slot, tokens):
      return False
    self.pages.grow(slot, tokens)
    return True

  def trim(self, slot: int, tokens: int) -> None:
    """Paged: `slot` keeps only the pages of its first `tokens` tokens (0: all go back). Dense: nothing."""
    if self.pages is not None:
      self.pages.shrink(slot, tokens)

  def extend(self, params, state: SlotState, rows: Sequence[Sequence[int]], reset: np.ndarray, *,
             extend_length: int | None = None, busiest: int | None = None) -> SlotState:
    """Empties the rows with `reset` (bool `[n]`), then appends `rows[b]` (ragged ids; empty = nothing) to row b.

    A collective call under a multi-process mesh (see the module docstring).

    Args:
      extend_length: the longest row over all processes (its bucket is the program's shape), agreed by the
        caller; default: this process's longest with one process, else one cross-process max.
      busiest: the most rows appending or reset on any batch device of any process (the compaction's width;
        see the class docstring), agreed by the caller; default: computed, with one cross-process max.

    Raises ValueError (before any device work) when a row would overflow the cache, holds an id outside the
    vocabulary, or is longer than `extend_length`.
    """
    # Copies: on CPU the transfer may alias host memory and read it after this call returns (extend does not wait
    # for its result), while the caller reuses its arrays (a mesh run read a reset flag the engine had cleared).
    reset = np.array(reset, bool)
    if len(rows) != self.slots or reset.shape != (self.slots,):
      raise ValueError(f"extend needs one id list and one reset flag per slot ({self.slots}), got {len(rows)} "
                       f"and {reset.shape}")
    lengths = np.where(reset, 0, state.host_lengths)
    added = np.asarray([len(r) for r in rows], np.int64)
    vocab, cap = self.sampler.config.vocab_size, self.sampler.max_cache_length
    for b, row in enumerate(rows):
      if len(row) and (min(row) < 0 or max(row) >= vocab):
        raise ValueError(f"slot {b}: token ids must be in [0, {vocab}), got {list(row)}")
      if lengths[b] + added[b] > cap:
        raise ValueError(f"slot {b} would overflow the KV cache: {lengths[b]} slots used + {added[b]} new tokens > "
                         f"max_cache_length={cap}")
    longest = int(added.max())
    if extend_length is None:
      extend_length = int(multihost.agreed_max([longest])[0])
    elif not isinstance(extend_length, (int, np.integer)) or extend_length < longest:
      raise ValueError(f"extend_length={extend_length!r} is smaller than this process's longest row ({longest}); "
                       "pass the max over all processes (or None to compute it)")
    tb = buckets.slot_extend_bucket(int(extend_length))
    cache = self._with_pages(state, lengths + added, added > 0)
    ids = np.full((self.slots, tb), self.sampler.pad_id, np.int32)
    mask = np.zeros((self.slots, tb), np.int32)
    for b, row in enumerate(rows):
      ids[b, :len(row)] = row
      mask[b, :len(row)] = 1
    selection = self._selection((added > 0) | reset, busiest)
    index = None
    if selection is not None:
      index, taken = selection
      reset, ids, mask, index = reset[taken], ids[taken], mask[taken], self._rows(index)
    cache, logits = self._run(slot_extend_jit, self.sampler.graphdef, params, cache, state.last_logits,
                              self._rows(reset), self._rows(ids), self._rows(mask), index, kv_heads=self._kv_heads)
    return SlotState(cache, logits, state.window, lengths + added)

  def lower(self, params, *, extend_length: int, sampling: SamplingParams, only: str | None = None,
            busiest: int | None = None) -> dict[str, jax.stages.Lowered] | jax.stages.Lowered:
    """The extend and decode-chunk programs over the N global slots, lowered for abstract inputs without running
    anything (`params` may be `jax.ShapeDtypeStruct`s with shardings, e.g. `Sampler.abstract_prepared`), placed
    as the running decoder places them: `.compile().memory_analysis()` sizes a run. `extend_length`: the longest
    append of the rollout (a prompt or an observation; its bucket is the program's shape). With `only`
    ("slot_extend" or "decode_chunk"), that program alone. With `busiest`, the programs compacted to
    `compact_width(busiest)` rows per device (default: over every slot)."""
    s, config = self.sampler, self.sampler.config
    n = self.global_slots
    # pylint: disable-next=protected-access
    placed = s._abstract
    if self.pages is not None:
      cache, logits, window = jax.eval_shape(functools.partial(init_paged_state, **self._paged_shape()))
      tensor = dict(s.mesh.shape).get("tensor", 1) if s.mesh else 1
      names = pool_axes(cache.layout, config.num_key_value_heads, tensor)
      cache = dataclasses.replace(cache, pools=tuple(tuple(placed(a.shape, a.dtype, names) for a in layer)
                                                     for layer in cache.pools),
                                  page_table=placed(cache.page_table.shape, jnp.int32, ("batch", None)),
                                  lengths=placed((n,), jnp.int32, ("batch",)))
    else:
      cache, logits, window = jax.eval_shape(functools.partial(
          init_state, rows=n, max_length=s.max_cache_length, layers=config.num_hidden_layers,
          kv_width=config.num_key_value_heads * config.head_dim, vocab=config.vocab_size, window=self._stops.shape[1],
          cache_dtype=s.cache_dtype, kv_heads=config.num_key_value_heads))
      kv_names = kv_axes(config.num_key_value_heads, dict(s.mesh.shape).get("tensor", 1) if s.mesh else 1)
      cache = KVCache(k=tuple(placed(a.shape, a.dtype, kv_names) for a in cache.k),
                      v=tuple(placed(a.shape, a.dtype, kv_names) for a in cache.v),
                      valid=placed(cache.valid.shape, bool, ("batch", None)), lengths=placed((n,), jnp.int32, ("batch",)),
                      cursor=placed((n,), jnp.int32, ("batch",)))
    rows = lambda shape, dtype: placed(shape, dtype, ("batch",) + (None,) * (len(shape) - 1))  # noqa: E731
    logits, window = rows(logits.shape, logits.dtype), rows(window.shape, window.dtype)
    tb = buckets.slot_extend_bucket(int(extend_length))
    key = jax.eval_shape(lambda: jax.random.key(0))
    m = self.slots_per_device if busiest is None else self.compact_width(busiest)
    index = None if m == self.slots_per_device else rows((self.global_slots // self.slots_per_device, m), jnp.int32)
    r = n if index is None else index.shape[0] * m  # the rows a call computes
    lowerings = {
        "slot_extend": lambda: slot_extend_jit.lower(s.graphdef, params, cache, logits, rows((r,), bool),
                                                     rows((r, tb), jnp.int32), rows((r, tb), jnp.int32), index,
                                                     kv_heads=self._kv_heads),
        "decode_chunk": lambda: decode_chunk_jit.lower(
            s.graphdef, params, cache, logits, window, rows((r,), jnp.int32), rows((r,), bool), rows((r,), jnp.int32),
            placed(self._stops.shape, jnp.int32, (None, None)), placed(key.shape, key.dtype, ()), index,
            sampling=sampling, chunk=self.decode_chunk, pad_id=s.pad_id, kv_heads=self._kv_heads),
    }
    with jax.set_mesh(s.mesh) if s.mesh is not None else contextlib.nullcontext():
      if only is not None:
        return lowerings[only]()
      return {name: lower() for name, lower in lowerings.items()}

  def decode(self, params, state: SlotState, budgets: np.ndarray, fresh: np.ndarray, episodes: np.ndarray,
             sampling: SamplingParams, rng: jax.Array, *, busiest: int | None = None) -> tuple[SlotState, Chunk]:
    """One chunk of up to C tokens per row (this process's n rows; a collective call under a multi-process mesh:
    every process calls it, with all budgets 0 when it has nothing to decode).

    Args:
      budgets: int `[n]`, tokens row b may still sample in its current turn (0 = inactive this chunk).
      fresh: bool `[n]`, row b's turn starts with this chunk (its stop window is emptied).
      episodes: int `[n]`, the global episode each row holds (its key; any value for inactive rows).
      rng: the rollout's PRNG key, the same on every process (see the module docstring for how it is split).
      busiest: the most rows with a budget on any batch device of any process (the compaction's width), agreed
        by the caller; default: computed, with one cross-process max.
    """
    budgets = np.asarray(budgets)
    if budgets.shape != (self.slots,) or not np.issubdtype(budgets.dtype, np.integer) or (budgets < 0).any():
      raise ValueError(f"budgets must be integers >= 0 of shape ({self.slots},), got {budgets!r}")
    over = np.flatnonzero(state.host_lengths + budgets > self.sampler.max_cache_length)
    if over.size:
      b = int(over[0])
      raise ValueError(f"slot {b} would overflow the KV cache: {state.host_lengths[b]} slots used + budget "
                       f"{budgets[b]} > max_cache_length={self.sampler.max_cache_length}")
    if not isinstance(sampling, SamplingParams):
      raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    fresh, episodes = np.array(fresh, bool), np.array(episodes, np.int32)  # copies, as in `extend`
    if fresh.shape != (self.slots,) or episodes.shape != (self.slots,):
      raise ValueError(f"fresh and episodes must have shape ({self.slots},), got {fresh.shape} and {episodes.shape}")
    budgets = budgets.astype(np.int32)
    cache = self._with_pages(state, state.host_lengths + np.minimum(budgets, self.decode_chunk), budgets > 0)
    selection = self._selection(budgets > 0, busiest)
    index, taken = (None, slice(None)) if selection is None else (self._rows(selection[0]), selection[1])
    out = self._run(decode_chunk_jit, self.sampler.graphdef, params, cache, state.last_logits, state.window,
                    self._rows(budgets[taken]), self._rows(fresh[taken]), self._rows(episodes[taken]),
                    self._same(self._stops), self._same(rng), index, sampling=sampling, chunk=self.decode_chunk,
                    pad_id=self.sampler.pad_id, kv_heads=self._kv_heads)
    cache, logits, window, *rows_out = out
    tokens, logprobs, counts, reasons, lengths = (multihost.local_rows(x) for x in rows_out)
    if selection is not None:  # back to slot order: rows that took no part sampled nothing and kept their length
      full = (np.full((self.slots, self.decode_chunk), self.sampler.pad_id, np.int32),
              np.zeros((self.slots, self.decode_chunk), np.float32), np.zeros(self.slots, np.int32),
              np.zeros(self.slots, np.int32), state.host_lengths.astype(np.int32))
      for whole, part in zip(full, (tokens, logprobs, counts, reasons, lengths)):
        whole[taken] = part
      tokens, logprobs, counts, reasons, lengths = full
    chunk = Chunk(tokens, logprobs, counts, reasons, lengths)
    host_lengths = state.host_lengths + chunk.counts
    if not np.array_equal(chunk.lengths, host_lengths):
      raise RuntimeError(f"slot cache lengths {chunk.lengths} disagree with the host's {host_lengths}")
    return SlotState(cache, logits, window, host_lengths), chunk


__all__ = ["Chunk", "SlotDecoder", "SlotState", "batch_devices", "compiled_slot_programs"]
