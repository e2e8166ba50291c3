"""Jitted KV-cache sampler with multi-turn continuation.

It drives the three jitted programs of `programs` (prefill, extend, decode). Shapes are bucketed (see `buckets`), so a multi-turn
rollout compiles a small fixed set of programs; all input validation happens on the host first.

Multi-host: each process passes only its local rows; every static size is derived from values all processes
agree on (a caller-given `width` / `extend_length`, else one small cross-process max per call, see
`multihost`), and a call whose local rows do nothing (all budgets 0, no observation tokens) still runs the
same program, so every process issues the same sequence of jitted calls. With one process nothing is
communicated and the sizes are the local ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from agent_r1_jax.models.config import Qwen2Config
from agent_r1_jax.models.kv_cache import KVCache, kv_axes
from agent_r1_jax.models.sharding import SAMPLING_RULES, logical_to_spec, state_shardings
from agent_r1_jax.sampling import buckets, multihost, programs
from agent_r1_jax.sampling import stop_sequences as stops_lib
from agent_r1_jax.sampling.params import SamplingParams


@dataclasses.dataclass
class SamplerState:
  """Device cache + next-token logits, plus host-side bookkeeping used for validation.

  Attributes:
    cache: the KV cache over `Bb * processes` rows (see `KVCache`), Bb = batch bucket of the local rows.
    last_logits: float32 `[Bb * processes, V]`, logits of each row's next token.
    batch_size: B, this process's rows (local rows >= B are padding).
    prompt_width: Pb, slots the (bucketed, left-padded) prompt occupies.
    host_lengths, host_cursor: int32 `[Bb]`, this process's real tokens / next free slot per row.
  """

  cache: KVCache
  last_logits: jax.Array
  batch_size: int
  prompt_width: int
  host_lengths: np.ndarray
  host_cursor: np.ndarray

  @property
  def lengths(self) -> np.ndarray:
    """int32 `[B]`: real tokens in the cache per row (prompt + everything appended or sampled)."""
    return self.host_lengths[:self.batch_size].copy()


@dataclasses.dataclass(frozen=True)
class Segment:
  """One decode segment of this process's rows (numpy). W = the call's width: the max budget over all
  processes, or the caller's `width`; 0 when no row samples.

  tokens int32 `[B, W]` (pad_id after each row's length), logprobs float32 `[B, W]` (0 after length),
  lengths int32 `[B]` (the tokens of a completed stop sequence count), stop_reasons int32 `[B]` (`StopReason`).
  """

  tokens: np.ndarray
  logprobs: np.ndarray
  lengths: np.ndarray
  stop_reasons: np.ndarray


def _config_from_graphdef(graphdef) -> Qwen2Config:
  for _, attr in getattr(graphdef, "attributes", ()):
    value = getattr(attr, "value", None)
    if isinstance(value, Qwen2Config):
      return value
  raise ValueError("could not find a Qwen2Config in the graphdef; pass config= to Sampler")


class Sampler:
  """Batched prefill / decode / continue over a preallocated KV cache.

  Args:
    graphdef: `nnx.split(model)[0]` of a `Qwen2ForCausalLM`.
    max_cache_length: S, cache slots per row (prompt bucket + everything appended must fit).
    stop_token_ids: single ids that end a row's segment (e.g. `<|im_end|>`, Qwen2.5's `</tool_call>`).
    stop_sequences: id sequences that end a row's segment once its last sampled tokens spell one (e.g.
      `</tool_call>` in a vocabulary where it is several tokens); a one-id sequence is a stop token. Only
      tokens sampled in the segment count (see `stop_sequences`). At least one stop condition is needed
      over both arguments.
    pad_id: id written after a row's end in returned tokens and used for padding inputs.
    cache_dtype: dtype of cached keys/values.
    mesh: run under this mesh: batch over (data, fsdp), KV heads over tensor, cache alike. It may span
      processes (multi-controller JAX): each process then passes and gets back only its own rows.
    config: the model config (found in `graphdef` when omitted).
  """

  def __init__(self, graphdef, *, max_cache_length: int, stop_token_ids: Sequence[int] = (),
               stop_sequences: Sequence[Sequence[int]] = (), pad_id: int, cache_dtype=jnp.float32,
               mesh: Mesh | None = None, config: Qwen2Config | None = None):
    self.graphdef = graphdef
    self.config = config or _config_from_graphdef(graphdef)
    vocab = self.config.vocab_size
    if not isinstance(max_cache_length, (int, np.integer)) or max_cache_length < 1:
      raise ValueError(f"max_cache_length must be a positive integer, got {max_cache_length!r}")
    seqs = stops_lib.normalize(stop_token_ids, stop_sequences, vocab_size=vocab)
    if not 0 <= int(pad_id) < vocab:
      raise ValueError(f"pad_id {pad_id} is outside the model vocabulary [0, {vocab})")
    self.max_cache_length = int(max_cache_length)
    self.stop_sequences = seqs  # every stop condition, single ids included (as 1-tuples)
    self.stop_token_ids = tuple(s[0] for s in seqs if len(s) == 1)
    self.pad_id = int(pad_id)
    self.cache_dtype = cache_dtype
    self.mesh = mesh
    self._stops = stops_lib.pack(seqs)  # [N, K], bucketed: the count and lengths are not shapes

  # -- public API ------------------------------------------------------------------------------

  def prepare(self, params):
    """`params` as every sampler call reads them: cast to the compute dtype and gathered over fsdp, once.

    Pass the result to prefill / extend / decode / continue_ for a whole rollout: each call would otherwise cast
    and gather the weights itself (the results are the same). One jitted call on every process.
    """
    return self._run(programs.sampling_weights_jit, self.graphdef, params)

  def abstract_prepared(self, params):
    """`prepare(params)` as abstract arrays with their shardings (for `lower`), from abstract `params`."""
    shapes = jax.eval_shape(programs.sampling_weights_jit, self.graphdef, params)
    if self.mesh is None:
      return shapes
    shardings = state_shardings(shapes, self.mesh, SAMPLING_RULES)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)

  def prefill(self, params, prompt_ids, prompt_mask) -> SamplerState:
    """Encodes left-padded prompts `[B, P]` (mask 1 = real) into a fresh cache.

    Every process must pass the same B; the prompt bucket comes from the largest P of any process.
    """
    ids = np.asarray(prompt_ids)
    mask = np.asarray(prompt_mask)
    self._check_prompts(ids, mask)
    b, p = ids.shape
    most_b, most_p, least_b = multihost.agreed_max([b, p, -b])
    if most_b != -least_b:
      raise ValueError(f"processes pass different batch sizes ({-least_b} to {most_b} rows); every process "
                       "must prefill the same number of rows")
    bb = buckets.batch_bucket(b)
    pb = min(buckets.prompt_bucket(int(most_p)), self.max_cache_length)
    pad_ids = np.full((bb, pb), self.pad_id, np.int32)
    pad_mask = np.zeros((bb, pb), np.int32)
    pad_ids[:b, pb - p:] = ids
    pad_mask[:b, pb - p:] = mask
    cache, logits = self._run(programs.prefill_jit, self.graphdef, params, self._batch(pad_ids),
                              self._batch(pad_mask), max_length=self.max_cache_length,
                              cache_dtype=self.cache_dtype)
    lengths = pad_mask.sum(1).astype(np.int32)
    cursor = np.where(lengths > 0, pb, 0).astype(np.int32)
    return SamplerState(cache, logits, b, pb, lengths, cursor)

  def decode(self, params, state: SamplerState, budgets, sampling: SamplingParams,
             rng: jax.Array, *, width: int | None = None) -> tuple[SamplerState, Segment]:
    """Samples one segment per row: until a stop sequence completes or `budgets[b]` tokens (0 = inactive).

    All-zero budgets are a valid call: it runs the same program (the loop exits at once), changes nothing
    and returns an empty segment, so a process whose rows have finished keeps step with the others.

    Args:
      width: the segment width every process agrees on (>= every budget on every process), e.g. the
        rollout's max new tokens per turn; default: the max budget over all processes (one small
        cross-process reduction when there are several).
    """
    budgets = self._check_budgets(state, budgets)
    if not isinstance(sampling, SamplingParams):
      raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    width = self._agreed_size("width", width, int(budgets.max()))
    return self._decode(params, state, budgets, sampling, rng, width)

  def extend(self, params, state: SamplerState, tokens: Sequence[Sequence[int]], *,
             extend_length: int | None = None) -> SamplerState:
    """Appends per-row tokens (ragged; empty = nothing for that row) with an incremental prefill.

    Args:
      extend_length: the longest row over all processes, agreed by the caller; default: computed with one
        small cross-process reduction (when there are several). When it is 0 no program runs on any process;
        otherwise every process runs the same one, also with no local tokens (a no-op for its rows).
    """
    rows = self._check_extension(state, tokens)
    extend_length = self._agreed_size("extend_length", extend_length, max(len(r) for r in rows))
    return self._extend(params, state, rows, extend_length)

  def continue_(self, params, state: SamplerState, tokens: Sequence[Sequence[int]], budgets,
                sampling: SamplingParams, rng: jax.Array, *, width: int | None = None,
                extend_length: int | None = None) -> tuple[SamplerState, Segment]:
    """`extend` with the observation tokens, then `decode` the next segment (one agreement for both)."""
    rows = self._check_extension(state, tokens)
    budgets = self._check_budgets(state, budgets, extra=[len(t) for t in rows])
    if not isinstance(sampling, SamplingParams):
      raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    longest, most = max(len(r) for r in rows), int(budgets.max())
    if width is None and extend_length is None:
      extend_length, width = (int(v) for v in multihost.agreed_max([longest, most]))
    extend_length = self._agreed_size("extend_length", extend_length, longest)
    width = self._agreed_size("width", width, most)
    state = self._extend(params, state, rows, extend_length)
    return self._decode(params, state, budgets, sampling, rng, width)

  def lower(self, params, *, rows: int, prompt_length: int, extend_length: int, width: int,
            sampling: SamplingParams, only: str | None = None) -> dict[str, jax.stages.Lowered] | jax.stages.Lowered:
    """The prefill, extend and decode programs of a rollout over `rows` global rows, lowered for abstract
    inputs without running anything (`params` may hold `jax.ShapeDtypeStruct`s with shardings): call
    `.compile().memory_analysis()` on them to size a run. Shapes are bucketed as a real rollout buckets them:
    rows, prompt width `prompt_length`, observation width `extend_length`, segment width `width`. With
    `only` ("prefill", "extend" or "decode"), that program alone."""
    bb = buckets.batch_bucket(rows)
    pb = min(buckets.prompt_bucket(prompt_length), self.max_cache_length)
    rows_of = lambda shape, dtype, names=None: self._abstract(shape, dtype, names or ("batch",) + (None,) * (len(shape) - 1))
    cache = jax.eval_shape(lambda: KVCache.init(self.config, bb, self.max_cache_length, self.cache_dtype))
    names = kv_axes(self.config.num_key_value_heads, dict(self.mesh.shape).get("tensor", 1) if self.mesh else 1)
    cache = KVCache(k=tuple(rows_of(a.shape, a.dtype, names) for a in cache.k),
                    v=tuple(rows_of(a.shape, a.dtype, names) for a in cache.v),
                    valid=rows_of(cache.valid.shape, cache.valid.dtype), lengths=rows_of((bb,), jnp.int32),
                    cursor=rows_of((bb,), jnp.int32))
    logits = rows_of((bb, self.config.vocab_size), jnp.float32)
    tb = buckets.extend_bucket(extend_length)
    rng = jax.eval_shape(lambda: jax.random.key(0))
    lowerings = {
        "prefill": lambda: programs.prefill_jit.lower(self.graphdef, params, rows_of((bb, pb), jnp.int32),
                                              rows_of((bb, pb), jnp.int32), max_length=self.max_cache_length,
                                              cache_dtype=self.cache_dtype),
        "extend": lambda: programs.extend_jit.lower(self.graphdef, params, cache, logits, rows_of((bb, tb), jnp.int32),
                                            rows_of((bb, tb), jnp.int32)),
        "decode": lambda: programs.decode_jit.lower(self.graphdef, params, cache, logits, rows_of((bb,), jnp.int32),
                                            self._abstract(self._stops.shape, jnp.int32, (None, None)),
                                            self._abstract(rng.shape, rng.dtype, ()), sampling=sampling,
                                            width=buckets.segment_bucket(width), pad_id=self.pad_id),
    }
    with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
      if only is not None:
        return lowerings[only]()
      return {name: lower() for name, lower in lowerings.items()}

  # -- helpers ---------------------------------------------------------------------------------

  def _abstract(self, shape, dtype, names) -> jax.ShapeDtypeStruct:
    """An abstract array, placed on the mesh by logical axis `names` (as the running sampler places it)."""
    if self.mesh is None:
      return jax.ShapeDtypeStruct(shape, dtype)
    spec = logical_to_spec(shape, names, self.mesh)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(self.mesh, spec))

  def _decode(self, params, state: SamplerState, budgets: np.ndarray, sampling: SamplingParams,
              rng: jax.Array, width: int) -> tuple[SamplerState, Segment]:
    padded = np.zeros(state.host_lengths.shape, np.int32)  # [Bb]: padding rows are inactive
    padded[:state.batch_size] = budgets
    cache, logits, tokens, logprobs, count, reason = self._run(
        programs.decode_jit, self.graphdef, params, state.cache, state.last_logits, self._batch(padded),
        self._replicated(self._stops), self._replicated(rng), sampling=sampling,
        width=buckets.segment_bucket(width), pad_id=self.pad_id)
    b = state.batch_size
    count = multihost.local_rows(count)
    seg = Segment(tokens=multihost.local_rows(tokens)[:b, :width],
                  logprobs=multihost.local_rows(logprobs)[:b, :width],
                  lengths=count[:b].copy(), stop_reasons=multihost.local_rows(reason)[:b].copy())
    new = SamplerState(cache, logits, b, state.prompt_width, state.host_lengths + count,
                       state.host_cursor + count)
    return new, seg

  def _extend(self, params, state: SamplerState, rows: list[list[int]], extend_length: int
              ) -> SamplerState:
    if extend_length == 0:
      return state
    tb = buckets.extend_bucket(extend_length)
    ids = np.full((state.host_lengths.shape[0], tb), self.pad_id, np.int32)
    mask = np.zeros(ids.shape, np.int32)
    for i, row in enumerate(rows):
      ids[i, :len(row)] = row
      mask[i, :len(row)] = 1
    cache, logits = self._run(programs.extend_jit, self.graphdef, params, state.cache, state.last_logits,
                              self._batch(ids), self._batch(mask))
    n = mask.sum(1).astype(np.int32)
    return SamplerState(cache, logits, state.batch_size, state.prompt_width,
                        state.host_lengths + n, state.host_cursor + n)

  @staticmethod
  def _agreed_size(name: str, given: int | None, local: int) -> int:
    """The caller's agreed size (checked against this process's need), else the max over processes."""
    if given is None:
      return int(multihost.agreed_max([local])[0])
    if not isinstance(given, (int, np.integer)) or given < local:
      raise ValueError(f"{name}={given!r} is smaller than this process needs ({local}); pass the max over "
                       "all processes (or leave it None to compute it)")
    return int(given)

  def _run(self, fn, *args, **kwargs):
    if self.mesh is None:
      return fn(*args, **kwargs)
    with jax.set_mesh(self.mesh):
      return fn(*args, **kwargs)

  def _batch(self, x: np.ndarray) -> jax.Array:
    """Local host rows `[Bb, ...]` -> device; under a mesh, the global array over every process's rows."""
    if self.mesh is None:
      return jnp.asarray(x)
    return multihost.global_rows(x, self.mesh)

  def _replicated(self, x) -> jax.Array:
    """A value every process passes identically (stop ids, PRNG key) -> replicated on the mesh."""
    if self.mesh is None:
      return jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed key: move its raw data, rewrap
      data = multihost.replicated(np.asarray(jax.random.key_data(x)), self.mesh)
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return multihost.replicated(np.asarray(x), self.mesh)

  def _check_prompts(self, ids: np.ndarray, mask: np.ndarray) -> None:
    if ids.ndim != 2 or mask.shape != ids.shape:
      raise ValueError(f"prompt_ids and prompt_mask must both be [B, P]; got {ids.shape} and "
                       f"{mask.shape}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
      raise ValueError(f"empty prompt batch of shape {ids.shape}; every row needs >= 1 token")
    if not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"prompt_ids must be integers, got {ids.dtype}")
    if not np.isin(mask, (0, 1)).all():
      raise ValueError("prompt_mask must hold only 0 and 1")
    empty = np.flatnonzero(mask.sum(1) == 0)
    if empty.size:
      raise ValueError(f"empty prompt in row(s) {empty.tolist()}; every row needs >= 1 real token")
    not_left = np.flatnonzero((np.diff(mask, axis=1) < 0).any(1))
    if not_left.size:
      raise ValueError(f"prompt row(s) {not_left.tolist()} are not left-padded (mask must be "
                       "0...0 1...1); pad prompts on the left")
    real = ids[mask.astype(bool)]
    if real.size and (real.min() < 0 or real.max() >= self.config.vocab_size):
      raise ValueError(f"prompt token ids must be in [0, {self.config.vocab_size}), got "
                       f"[{real.min()}, {real.max()}]")
    if ids.shape[1] > self.max_cache_length:
      raise ValueError(f"prompt of {ids.shape[1]} tokens is longer than the cache "
                       f"(max_cache_length={self.max_cache_length}); raise max_cache_length or "
                       "truncate the prompt")

  def _check_budgets(self, state: SamplerState, budgets, extra: Sequence[int] | None = None
                     ) -> np.ndarray:
    budgets = np.asarray(budgets)
    if budgets.shape != (state.batch_size,) or not np.issubdtype(budgets.dtype, np.integer):
      raise ValueError(f"budgets must be integers of shape ({state.batch_size},), got "
                       f"{budgets.dtype} {budgets.shape}")
    if (budgets < 0).any():
      raise ValueError(f"budgets must be >= 0 (0 = row inactive), got {budgets.tolist()}")
    used = state.host_cursor[:state.batch_size] + (0 if extra is None else np.asarray(extra))
    over = np.flatnonzero(used + budgets > self.max_cache_length)
    if over.size:
      r = int(over[0])
      raise ValueError(f"row {r} would overflow the KV cache: {used[r]} slots used + budget "
                       f"{budgets[r]} > max_cache_length={self.max_cache_length}; lower the budget "
                       "or raise max_cache_length")
    return budgets.astype(np.int32)

  def _check_extension(self, state: SamplerState, tokens) -> list[list[int]]:
    if len(tokens) != state.batch_size:
      raise ValueError(f"tokens must hold one sequence per row ({state.batch_size}), got "
                       f"{len(tokens)}")
    rows = [[int(t) for t in row] for row in tokens]
    vocab = self.config.vocab_size
    for i, row in enumerate(rows):
      if row and (min(row) < 0 or max(row) >= vocab):
        raise ValueError(f"row {i}: token ids must be in [0, {vocab}), got {row}")
      if state.host_cursor[i] + len(row) > self.max_cache_length:
        raise ValueError(f"row {i} would overflow the KV cache: {state.host_cursor[i]} slots used "
                         f"+ {len(row)} new tokens > max_cache_length={self.max_cache_length}")
    return rows


def max_logprob_drift(sampler_logprobs: np.ndarray, learner_logprobs: np.ndarray,
                      mask: np.ndarray) -> float:
  """max |sampler - learner| log-prob over masked positions (a metric for the trainer to log)."""
  mask = np.asarray(mask).astype(bool)
  if not mask.any():
    return 0.0
  diff = np.abs(np.asarray(sampler_logprobs, np.float64) - np.asarray(learner_logprobs, np.float64))
  return float(diff[mask].max())


__all__ = ["Sampler", "SamplerState", "Segment", "max_logprob_drift"]
