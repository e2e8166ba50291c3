"""Static-shape bucketing: which padded sizes the sampler compiles for.

Policy (each size is rounded up to a power of two, with a floor):
  batch      B -> max(1, 2^ceil(log2 B)) up to 64, then the next multiple of 64 (extra rows are inactive
                                                     padding; the paper's 640 rollout rows stay 640, where a
                                                     power of two would sample 1024)
  prompt     P -> max(16, 2^ceil(log2 P))           (extra columns are left padding)
  extension  T -> max(8, 2^ceil(log2 T))            (observation tokens, right padded)
  slot extension T -> the smallest 2^k (1 + j / 4) >= max(8, T), j = 0..3 (prompts and observations appended
                                                     by the slot engine, right padded: at most 25% padding
                                                     where a power of two wastes up to half; `slot_extend_bucket`)
  segment    S -> max(8, 2^ceil(log2 W))            (output buffer of one decode segment; W = the
                                                     call's width, by default its max budget)
Multi-host: P, T and the width are the max over all processes (or a size the caller says they agree on),
and B is the same on every process, so every process compiles and calls the same programs.
The KV cache has exactly `max_cache_length` slots (one static size per sampler).

Cache capacity rule: a row uses bucket(P) slots for its prompt (left padding occupies slots), then one
slot per sampled token and per appended observation token; every call checks on the host, before
compiling, that `bucket(P) + tokens appended so far + this call's tokens <= max_cache_length`.

A rollout over one batch bucket therefore compiles at most: 1 prefill per prompt bucket, 1 decode per
(segment bucket, SamplingParams), 1 extend per extension bucket; `rollout_compile_bound` counts them.
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_PROMPT = 16
MIN_EXTEND = 8
MIN_SEGMENT = 8
BATCH_STEP = 64


def pow2_bucket(n: int, floor: int = 1) -> int:
  """Smallest power of two >= max(n, floor)."""
  n = max(int(n), floor, 1)
  return 1 << (n - 1).bit_length()


def batch_bucket(b: int) -> int:
  if b <= BATCH_STEP:
    return pow2_bucket(b, 1)
  return -(-int(b) // BATCH_STEP) * BATCH_STEP


def prompt_bucket(p: int) -> int:
  return pow2_bucket(p, MIN_PROMPT)


def extend_bucket(t: int) -> int:
  return pow2_bucket(t, MIN_EXTEND)


def slot_extend_bucket(t: int) -> int:
  """The slot engine's append width: the smallest of 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ... (2^k (1 + j / 4))
  that holds max(t, 8). Its extends run over the few rows that append, each as wide as its longest append, so
  padding is most of their cost; four sizes per octave keep it under a quarter for 4x the compiled programs."""
  t = max(int(t), MIN_EXTEND)
  step = max(pow2_bucket(t) // 8, 1)  # a quarter of the octave [2^k, 2^(k+1)) that holds t
  return -(-t // step) * step


def segment_bucket(max_budget: int) -> int:
  return pow2_bucket(max_budget, MIN_SEGMENT)


def rollout_compile_bound(prompt_lengths: Iterable[int], budgets: Iterable[int],
                          observation_lengths: Iterable[int], num_sampling_params: int = 1) -> int:
  """Upper bound on compiled programs for rollouts of one batch bucket with these sizes."""
  prompts = {prompt_bucket(p) for p in prompt_lengths}
  segments = {segment_bucket(b) for b in budgets}
  extends = {extend_bucket(t) for t in observation_lengths if t > 0}
  return len(prompts) + len(segments) * num_sampling_params + len(extends)
