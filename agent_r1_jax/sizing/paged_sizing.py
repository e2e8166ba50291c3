"""The dry run's account of the slot engine's paged KV cache (`model.kv_cache`): what its kernel reads,
how many pages a chip holds, and how many episodes that is against the dense cache in the same HBM.

Length distributions (both stated with every figure; no measured length distribution at the paper's scale
exists in this project):

  worst case      `full_budget_episode`: the configured limits, every turn at its full budget, the estimate the
                  dry run already makes for the lockstep engine: a prompt of `rollout.max_prompt_length` tokens,
                  then turns of `max_new_tokens_per_turn` sampled tokens, each but the last followed by an
                  observation of the widest append (`dry_run.observation_tokens`), until `max_turns` turns or
                  `max_response_length` / the context limit; every slot at the same point of such an episode.
                  At the real presets (1024 + 4 x 1024 sampled + 3 x 1024 observed) decode steps see contexts
                  1024-8191 (mean 4608) and an episode ends holding 8192 tokens.
  assumed mean    ASSUMED_MEAN_CONTEXT tokens per episode, every slot: an ASSUMPTION, not a measurement, of a
                  multi-hop QA episode (a prompt with the tool schema, 2-3 turns of a few hundred tokens and 1-2
                  observations of ~500: the real presets' note that 2048 characters of retrieved English are ~500
                  tokens). It sizes how many episodes the pages hold, not the step estimate.

Pages (`PoolPlan`): a chip holds the pool beside everything else. The slot programs are compiled with the
configured pool; their peak (resident state included) less that pool, as the compiler lays it out, is what is
not pool (`non_pool_bytes`); the pages that fit are (budget - non_pool) / page bytes, where a page is
L x page_size x 2K' x hd' x bytes(cache) laid out by the target's compiler (`memory.resident_bytes` of the pool;
K' heads of width hd' as the pages store them, `models.paged_kv_cache.stored_heads`: Qwen2.5-0.5B's two 64-wide
heads packed into one of 128 lanes, so its pages hold exactly its keys and values). Episodes the pool
holds = (pages - 1, the null page) / ceil(context / page_size); the dense cache's at the same HBM =
(budget - non_pool) / the bytes of one dense row (every slot at the full cache length, its valid mask included),
both beside the same non-pool bytes (those of the configured slots' programs). What is not pool moves a little with
the pool's size (the compiler schedules each program anew: by 0.05 GiB between 129 and 7906 pages at 3B on a v6e),
so the pages that fit are an estimate to within a few dozen; the dry run at that `rollout.pages_per_device` checks it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_dict

from agent_r1_jax.models import Qwen2Config
from agent_r1_jax.models.kv_cache import kv_axes
from agent_r1_jax.models.paged_attention import HEAD_MULTIPLE, layout_of
from agent_r1_jax.models.paged_kv_cache import pool_axes, pool_shapes
from agent_r1_jax.models.sharding import logical_to_spec
from agent_r1_jax.rollout import RolloutConfig
from agent_r1_jax.sampling.paging import PagingConfig
from agent_r1_jax.sizing import memory, rollout_sizing, rpa_cost

_GIB = float(1 << 30)
ASSUMED_MEAN_CONTEXT = 2048  # tokens per episode: an assumption (module docstring), not a measurement


@dataclasses.dataclass(frozen=True)
class Episode:
  """An episode's decode steps (`decode_contexts[i]`: tokens in the row before step i) and appends (`extends`:
  (tokens before, tokens appended) per extend call, the prompt first)."""
  decode_contexts: np.ndarray
  extends: tuple[tuple[int, int], ...]

  @property
  def final_context(self) -> int:
    before, appended = self.extends[-1]
    return max(before + appended, int(self.decode_contexts[-1]) + 1 if len(self.decode_contexts) else 0)


def full_budget_episode(c: config_dict.ConfigDict, observation: int) -> Episode:
  """The worst case of the module docstring for `c.rollout`, with observations of `observation` tokens."""
  r = c.rollout
  limit = r.max_prompt_length + r.max_response_length
  limit = min(limit, r.max_context_length) if r.max_context_length else limit
  context, response, decode, extends = r.max_prompt_length, 0, [], [(0, r.max_prompt_length)]
  for turn in range(r.max_turns):
    sampled = min(r.max_new_tokens_per_turn, r.max_response_length - response, limit - context)
    if sampled <= 0:
      break
    decode.append(np.arange(context, context + sampled))
    context, response = context + sampled, response + sampled
    appended = min(observation, r.max_response_length - response, limit - context)
    if turn == r.max_turns - 1 or appended <= 0:
      break
    extends.append((context, appended))
    context, response = context + appended, response + appended
  return Episode(np.concatenate(decode) if decode else np.zeros(0, np.int64), tuple(extends))


def kernel_shape(arch: Qwen2Config, mesh_shape: dict[str, int], *, page_size: int, max_length: int,
                 cache_itemsize: int, compute_itemsize: int) -> rpa_cost.KernelShape:
  return rpa_cost.KernelShape.of(heads=arch.num_attention_heads, kv_heads=arch.num_key_value_heads,
                                 head_dim=arch.head_dim, tensor=mesh_shape.get("tensor", 1), page_size=page_size,
                                 pages_per_row=-(-max_length // page_size), kv_itemsize=cache_itemsize,
                                 q_itemsize=compute_itemsize)


def decode_cost(shape: rpa_cost.KernelShape, layers: int, rows: int, kv_lens) -> rpa_cost.Cost:
  """One decode step of `rows` rows per device, one query each, at `kv_lens` (a scalar for every row, or `[rows]`):
  the kernel's cost over every layer."""
  kv = np.broadcast_to(np.minimum(np.asarray(kv_lens, np.int64), shape.pages_per_row * shape.page_size), (rows,))
  return rpa_cost.call_cost(shape, np.ones(rows, np.int64), kv) * layers


def episode_decode_cost(shape: rpa_cost.KernelShape, layers: int, rows: int, episode: Episode) -> rpa_cost.Cost:
  """A decode step's kernel cost averaged over the episode's steps, every row at the same step (kv_len = its
  context + the token just written)."""
  contexts, counts = np.unique(episode.decode_contexts + 1, return_counts=True)
  total = rpa_cost.Cost()
  for kv, count in zip(contexts, counts):
    total = total + decode_cost(shape, layers, rows, kv) * int(count)
  return total * (1.0 / len(episode.decode_contexts))


def episode_extend_cost(shape: rpa_cost.KernelShape, layers: int, rows: int, width: int,
                        episode: Episode) -> rpa_cost.Cost:
  """An extend call's kernel cost averaged over the episode's appends, every row appending at the same point: the
  call gives each row `width` queries (its bucket) and kv_len = tokens before + width."""
  cap = shape.pages_per_row * shape.page_size
  total = rpa_cost.Cost()
  for before, _ in episode.extends:
    kv = np.full(rows, min(before + width, cap), np.int64)
    total = total + rpa_cost.call_cost(shape, np.full(rows, width, np.int64), kv) * layers
  return total * (1.0 / len(episode.extends))


def attended(shape: rpa_cost.KernelShape, layers: int, rows: int, kv_lens, *,
             heads: tuple[int, int] | None = None) -> float:
  """Bytes of the cache `rows` rows attend over at `kv_lens`, every layer: for `heads` = (K, hd) per device, the
  model's own keys and values (the logical must-read); with None, the pages' stored K' heads of width hd' (zero
  padding included where a width does not pack into the kernel's lanes)."""
  kv = np.broadcast_to(np.asarray(kv_lens, np.int64), (rows,))
  kv_heads, width = heads or (shape.kv_heads, shape.head_width)
  return layers * rpa_cost.attended_bytes(kv, kv_heads=kv_heads, head_width=width, kv_itemsize=shape.kv_itemsize)


@dataclasses.dataclass(frozen=True)
class DecodeCheck:
  """One decode step's bytes per device under a length distribution (`label`): the compiler's count outside the
  kernel, the kernel's (`rpa_cost`), and what the step must read: the sampling weights plus the cache the rows
  attend over, the model's K x hd (`must_read`) and as the pages store it, K' x hd' (`must_read_padded`: larger
  only where a head width is zero-padded)."""
  label: str
  compiler_bytes: float
  kernel_bytes: float
  kernel_flops: float
  must_read: float
  must_read_padded: float

  @property
  def total(self) -> float:
    return self.compiler_bytes + self.kernel_bytes

  def to_json(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "ratio": self.total / self.must_read,
            "ratio_padded": self.total / self.must_read_padded}


def decode_checks(shape: rpa_cost.KernelShape, arch: Qwen2Config, *, rows: int, compiler_bytes: float,
                  weights: float, episode: Episode, mean_context: int = ASSUMED_MEAN_CONTEXT,
                  tensor: int = 1) -> list[DecodeCheck]:
  """The decode program's bytes per step against its must-read, worst case (averaged over the episode's steps) and
  at the assumed mean context (every row at kv_len = mean_context); KV heads split over `tensor` as the pool's."""
  layers = arch.num_hidden_layers
  split = tensor if arch.num_key_value_heads % tensor == 0 else 1
  model = (arch.num_key_value_heads // split, arch.head_dim)  # the device's own KV heads
  kv = episode.decode_contexts + 1
  worst, mean_kv = episode_decode_cost(shape, layers, rows, episode), float(kv.mean())
  per_token = {w: attended(shape, layers, 1, 1, heads=w) for w in (model, None)}  # one position of one row
  checks = [DecodeCheck(f"worst case (every turn at its full budget; contexts {int(kv.min()) - 1}-{int(kv.max()) - 1}, "
                        f"mean {mean_kv - 1:.0f})", compiler_bytes, worst.bytes, worst.flops,
                        weights + rows * mean_kv * per_token[model], weights + rows * mean_kv * per_token[None])]
  at_mean = decode_cost(shape, layers, rows, mean_context)
  checks.append(DecodeCheck(f"assumed mean context {mean_context} (an assumption, not a measurement)",
                            compiler_bytes, at_mean.bytes, at_mean.flops,
                            weights + rows * mean_context * per_token[model],
                            weights + rows * mean_context * per_token[None]))
  return checks


def pool_bytes(arch: Qwen2Config, mesh, *, pages_per_device: int, page_size: int, layout: str, cache_dtype,
               backend: str) -> int:
  """Per-device bytes of every layer's pool with `pages_per_device` pages on each batch device, placed as the slot
  engine places it (`pool_axes`) and laid out by the mesh's compiler (`memory.resident_bytes`)."""
  sizes = dict(mesh.shape)
  pages = pages_per_device * sizes.get("data", 1) * sizes.get("fsdp", 1)
  names = pool_axes(layout, arch.num_key_value_heads, sizes.get("tensor", 1))
  shapes = pool_shapes(arch, pages, page_size, layout, HEAD_MULTIPLE.get(backend, 1))
  return memory.resident_bytes([_placed(s, cache_dtype, names, mesh) for s in shapes
                                for _ in range(arch.num_hidden_layers)])


def dense_row_bytes(arch: Qwen2Config, mesh, *, length: int, cache_dtype) -> int:
  """Per-device bytes one more row per batch device adds to the dense slot cache (`models.kv_cache.KVCache`: keys
  and values `[N, S, K hd]` per layer, the valid mask `[N, S]`, lengths and cursors), as the compiler lays it out."""
  sizes = dict(mesh.shape)
  devices = sizes.get("data", 1) * sizes.get("fsdp", 1)
  names = kv_axes(arch.num_key_value_heads, sizes.get("tensor", 1))

  def cache(rows: int) -> int:
    kv = [_placed((rows, length, arch.num_key_value_heads * arch.head_dim), cache_dtype, names, mesh)
          for _ in range(2 * arch.num_hidden_layers)]
    rest = [_placed((rows, length), np.bool_, ("batch", None), mesh)] + [
        _placed((rows,), np.int32, ("batch",), mesh) for _ in range(2)]
    return memory.resident_bytes(kv + rest)

  return cache(2 * devices) - cache(devices)


def _placed(shape, dtype, names, mesh) -> jax.ShapeDtypeStruct:
  spec = logical_to_spec(shape, names, mesh)
  return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(mesh, spec))


@dataclasses.dataclass(frozen=True)
class PoolPlan:
  """Pages and episodes per chip (module docstring), and the decode checks beside them.

  Attributes:
    slots_per_device: N, the slots the programs were compiled for.
    pages_per_device: the pool the programs were compiled with (the null page included).
    page_bytes: one page over every layer, per device, as the compiler lays it out.
    dense_row_bytes: one dense-cache row (every position of the cache) over every layer, per device, as laid out.
    non_pool_bytes: the largest slot program's peak (its resident state included) less its pool.
    budget_bytes: the HBM the compiler allows one device.
    full_context: the worst case's longest episode (tokens); mean_context: the assumed mean.
  """
  slots_per_device: int
  page_size: int
  pages_per_device: int
  page_bytes: int
  dense_row_bytes: int
  non_pool_bytes: float
  budget_bytes: float
  full_context: int
  mean_context: int
  checks: tuple[DecodeCheck, ...] = ()

  @property
  def free_bytes(self) -> float:
    return self.budget_bytes - self.non_pool_bytes

  @property
  def fit_pages(self) -> int:
    """The pages per device that fit beside everything else (the null page among them)."""
    return max(int(self.free_bytes // self.page_bytes), 0)

  def episodes(self, context: int, pages: int | None = None) -> int:
    """Episodes of `context` tokens that `pages` pages (default: `fit_pages`) hold at once, the null page aside."""
    pages = self.fit_pages if pages is None else pages
    return max(pages - 1, 0) // -(-context // self.page_size)

  @property
  def dense_episodes(self) -> int:
    """Dense-cache rows (each at the full cache length) that fit in the same HBM."""
    return max(int(self.free_bytes // self.dense_row_bytes), 0)

  def lines(self) -> list[str]:
    full, mean = self.full_context, self.mean_context
    out = [f"  paged KV cache: a page of {self.page_size} tokens takes {self.page_bytes / 2**20:.3f} MiB per chip over "
           f"every layer as the compiler lays it out; the slot programs over {self.slots_per_device} slots per chip "
           f"hold {self.non_pool_bytes / _GIB:.2f} GiB beside their pool (resident state included), leaving "
           f"{self.free_bytes / _GIB:.2f} GiB: {self.fit_pages} pages per chip fit "
           f"(--config.rollout.pages_per_device={self.fit_pages}; compiled with {self.pages_per_device})",
           f"  episodes per chip in that HBM: paged {self.episodes(full)} at the worst case's {full} tokens "
           f"({-(-full // self.page_size)} pages each), {self.episodes(mean)} at an assumed mean context of {mean} "
           f"tokens (an assumption, not a measurement); dense {self.dense_episodes} (every slot at the full cache, "
           f"{self.dense_row_bytes / 2**20:.1f} MiB each)"]
    held = self.episodes(full, self.pages_per_device)
    if held < self.slots_per_device:
      out.append(f"  the compiled pool of {self.pages_per_device} pages holds {held} episodes at {full} tokens, fewer "
                 f"than the {self.slots_per_device} slots: in the worst case episodes wait for pages (the step "
                 f"estimate assumes every slot decodes)")
    for check in self.checks:
      out.append(f"  decode_chunk, {check.label}: {check.total / _GIB:.2f} GiB per step = the compiler's count "
                 f"outside the kernel {check.compiler_bytes / _GIB:.2f} + the kernel's reads "
                 f"{check.kernel_bytes / _GIB:.2f} (its arithmetic, sizing.rpa_cost) / {check.must_read / _GIB:.2f} "
                 f"GiB it must read (weights + the cache attended) = {check.total / check.must_read:.2f}x; against "
                 f"the cache as the pages store it {check.must_read_padded / _GIB:.2f} GiB = "
                 f"{check.total / check.must_read_padded:.2f}x")
    return out

  def to_json(self) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(self).items() if k != "checks"}
    out.update(fit_pages=self.fit_pages, episodes_full=self.episodes(self.full_context),
               episodes_mean=self.episodes(self.mean_context), dense_episodes=self.dense_episodes,
               episodes_full_compiled=self.episodes(self.full_context, self.pages_per_device),
               checks=[c.to_json() for c in self.checks])
    return out




def add_kernel_cost(p, c: config_dict.ConfigDict, arch: Qwen2Config, mesh, decoder, *, width: int, rows: int,
                    observation: int) -> None:
  """Sets a paged slot program's (`report.ProgramMemory` `p`, compiled over `rows` rows per chip by `decoder`, a
  `sampling.slots.SlotDecoder`) kernel bytes and FLOPs per iteration, every row at the same point of the worst
  case's episode (appends of `width` tokens), and for "decode_chunk" the worst case's must-read. The kernel is
  counted where the pages are read by Ragged Paged Attention (a TPU); the XLA gather path is the compiler's own."""
  episode = full_budget_episode(c, observation)
  shape = kernel_shape(arch, dict(mesh.shape), page_size=decoder.paging.page_size,
                       max_length=decoder.sampler.max_cache_length,
                       cache_itemsize=jnp.dtype(c.rollout.cache_dtype).itemsize,
                       compute_itemsize=jnp.dtype(c.model.compute_dtype).itemsize)
  kernel = decoder.backend == "ragged_paged"
  layers = arch.num_hidden_layers
  if p.name.startswith("decode"):
    cost = episode_decode_cost(shape, layers, rows, episode)
    if p.name == "decode_chunk":
      worst = decode_checks(shape, arch, rows=rows, compiler_bytes=p.bytes_accessed or 0.0,
                            weights=memory.sampling_weight_bytes(c, arch, dict(mesh.shape)), episode=episode,
                            tensor=dict(mesh.shape).get("tensor", 1))[0]
      p.must_read, p.must_read_padded = worst.must_read, worst.must_read_padded
  else:
    cost = episode_extend_cost(shape, layers, rows, width, episode)
  p.kernel_bytes, p.kernel_flops = (cost.bytes, cost.flops) if kernel else (0.0, 0.0)


SLOT_PROGRAMS = ("slot_extend", "decode_chunk", "slot_extend_gathered", "decode_chunk_gathered")


def plan(c: config_dict.ConfigDict, arch: Qwen2Config, mesh, programs: list, *, budget_bytes: float,
         observation: int, remeasure) -> PoolPlan | None:
  """The `PoolPlan` of a paged slot engine run of `c` on `mesh` from its compiled slot `programs`
  (`report.ProgramMemory`); None without one. Where the compiler refused a slot program (its pool too large for
  the chip), `remeasure(pages_per_device)` compiles the slot programs again with the smallest pool (one episode at
  the full cache length) to measure what is not pool."""
  paging = (PagingConfig.from_config(c, platform=mesh.devices.flat[0].platform)
            if c.rollout.engine == "slots" else None)
  slot = [p for p in programs if p.name in SLOT_PROGRAMS]
  if paging is None or not slot:
    return None
  devices = mesh.devices.size
  slots = rollout_sizing.slots_per_device(c, devices, 1)
  max_length = RolloutConfig.from_config(c.rollout).cache_length
  backend = paging.resolved_backend(mesh.devices.flat[0].platform)
  dtype = jnp.dtype(c.rollout.cache_dtype)
  pool = functools.partial(pool_bytes, arch, mesh, page_size=paging.page_size, layout=layout_of(backend),
                           cache_dtype=dtype, backend=backend)
  compiled = pages = paging.device_pages(slots, max_length)
  if any(p.error is not None for p in slot):
    pages = paging.pages_per_row(max_length) + 1
    slot = remeasure(pages)
  non_pool = max(p.peak for p in slot) - pool(pages_per_device=pages)
  episode = full_budget_episode(c, observation)
  mean = min(ASSUMED_MEAN_CONTEXT, episode.final_context)
  checks = ()
  decode = next((p for p in slot if p.name == "decode_chunk"), None)
  if backend == "ragged_paged" and decode is not None and decode.error is None:
    shape = kernel_shape(arch, dict(mesh.shape), page_size=paging.page_size, max_length=max_length,
                         cache_itemsize=dtype.itemsize, compute_itemsize=jnp.dtype(c.model.compute_dtype).itemsize)
    checks = tuple(decode_checks(shape, arch, rows=slots, compiler_bytes=decode.bytes_accessed,
                                 weights=memory.sampling_weight_bytes(c, arch, dict(mesh.shape)), episode=episode,
                                 mean_context=mean, tensor=dict(mesh.shape).get("tensor", 1)))
  return PoolPlan(slots_per_device=slots, page_size=paging.page_size, pages_per_device=compiled,
                  page_bytes=pool(pages_per_device=2) - pool(pages_per_device=1),
                  dense_row_bytes=dense_row_bytes(arch, mesh, length=max_length, cache_dtype=dtype),
                  non_pool_bytes=float(non_pool), budget_bytes=float(budget_bytes),
                  full_context=episode.final_context, mean_context=mean, checks=checks)


__all__ = ["ASSUMED_MEAN_CONTEXT", "SLOT_PROGRAMS", "DecodeCheck", "Episode", "PoolPlan", "add_kernel_cost", "attended",
           "decode_checks", "decode_cost", "dense_row_bytes", "episode_decode_cost", "episode_extend_cost",
           "full_budget_episode", "kernel_shape", "plan", "pool_bytes"]
