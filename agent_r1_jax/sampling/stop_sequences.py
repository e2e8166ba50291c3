"""Stop sequences: a row's segment ends when its last sampled tokens spell one of them.

A stop sequence is a non-empty run of token ids s = (s_1, ..., s_L); a single stop token is the case L = 1.
The decode loop keeps, per row, a rolling window w of the last K tokens sampled *in the current segment*
(oldest first; slots before the segment's first token hold -1), and a row stops at step t when, for some
stop sequence of length L <= K,

  w[K - L + j] = s_j   for j = 1..L,

i.e. the window's suffix equals the sequence. The window is seeded with -1 at the start of every segment,
so tokens of the prompt, of an earlier segment, or of an observation never complete a stop: a stop string
that straddles the segment's start does not count.

On device the sequences are one int32 array `[N, K]` (both bucketed to powers of two so the number and
length of the stop sequences are not shapes), right-aligned and left-padded with -1; an all -1 row (padding)
never matches. Sampled ids are >= 0, so a -1 slot of the window never equals a real id.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agent_r1_jax.sampling import buckets

ABSENT = -1


def normalize(stop_token_ids: Sequence[int] = (), stop_sequences: Sequence[Sequence[int]] = (), *,
              vocab_size: int) -> tuple[tuple[int, ...], ...]:
  """The stop conditions as id tuples: each single id first, then each sequence, duplicates dropped.

  Raises ValueError when there is none, a sequence is empty, or an id is outside `[0, vocab_size)`.
  """
  flat = [s for s in stop_sequences if isinstance(s, (int, np.integer))]
  if flat:
    raise ValueError(f"stop_sequences must hold sequences of ids, got bare id(s) {flat}; pass single ids as "
                     "stop_token_ids or as one-element sequences")
  seqs = [(int(t),) for t in stop_token_ids] + [tuple(int(t) for t in s) for s in stop_sequences]
  if not seqs:
    raise ValueError("no stop condition: pass stop_token_ids and/or stop_sequences (e.g. <|im_end|>)")
  empty = [i for i, s in enumerate(stop_sequences) if len(s) == 0]
  if empty:
    raise ValueError(f"stop_sequences {empty} are empty; every stop sequence needs at least one id")
  unknown = sorted({t for s in seqs for t in s if not 0 <= t < vocab_size})
  if unknown:
    raise ValueError(f"unknown stop token id(s) {unknown}: the model vocabulary is [0, {vocab_size})")
  return tuple(dict.fromkeys(seqs))


def pack(seqs: Sequence[Sequence[int]]) -> np.ndarray:
  """int32 `[N, K]`: N = pow2 bucket (>= 4) of the count, K = pow2 bucket of the longest sequence; each
  sequence right-aligned in its row, -1 to its left and in padding rows."""
  longest = max(len(s) for s in seqs)
  out = np.full((buckets.pow2_bucket(len(seqs), 4), buckets.pow2_bucket(longest)), ABSENT, np.int32)
  for i, s in enumerate(seqs):
    out[i, out.shape[1] - len(s):] = s
  return out


def empty_window(rows: int, packed: jax.Array) -> jax.Array:
  """int32 `[rows, K]` of -1: the window at the start of a segment (nothing sampled yet)."""
  return jnp.full((rows, packed.shape[1]), ABSENT, jnp.int32)


def push(window: jax.Array, token: jax.Array) -> jax.Array:
  """The window `[B, K]` shifted left by one with `token` `[B]` appended as the newest entry."""
  return jnp.concatenate([window[:, 1:], token[:, None].astype(window.dtype)], axis=1)


def completed(window: jax.Array, packed: jax.Array) -> jax.Array:
  """bool `[B]`: the window's suffix equals some stop sequence of `packed` `[N, K]`."""
  care = packed != ABSENT                                    # [N, K]
  equal = window[:, None, :] == packed[None, :, :]            # [B, N, K]
  hit = jnp.all(equal | ~care[None], axis=2) & jnp.any(care, axis=1)[None]
  return jnp.any(hit, axis=1)


__all__ = ["ABSENT", "completed", "empty_window", "normalize", "pack", "push"]
