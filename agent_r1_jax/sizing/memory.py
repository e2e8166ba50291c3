"""Per-device bytes the dry run sets beside each compiled program's own: the state that stays on a device while
the program runs without being one of its arguments (`resident_bytes`), and what one decode step must read
(`sampling_weight_bytes`, `decode_step_bytes`).

Resident state is sized by the compiler of the devices it lives on, not from shapes. A TPU stores an array in
tiles, 8 x 128 32-bit words over its two minor dimensions (smaller tiles for a small array, a 512-byte buffer at
least), so a shard of shape s whose two minor dimensions span whole tiles' rows takes

  prod(s[:-2]) x ceil(s[-2] / 8 p) 8 p x ceil(s[-1] / 128) 128 x itemsize     (p = 4 / itemsize values per word)

in the layout the runtime picks (it may reorder dimensions to pad less): a float32 [8, 100] takes 4 KiB, not
3.2; a bfloat16 [16, 64] (head_dim 64) 4 KiB, not 2. prod(s) x itemsize undercounts by that padding, so the
figure is the per-device argument size of a program that takes the state and does nothing, compiled for the
target: on XLA:TPU tile-padded, on XLA:CPU exactly prod(s) x itemsize.
"""

from __future__ import annotations

from typing import Any

import jax
from ml_collections import config_dict

from agent_r1_jax.models import Qwen2Config
from agent_r1_jax.sampling import buckets

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def resident_bytes(tree: Any) -> int:
  """Bytes one device holds of a pytree of (abstract or concrete) arrays placed by their shardings, laid out as
  their devices' compiler lays them out: `memory_analysis().argument_size_in_bytes` of a program that takes every
  leaf (`keep_unused`, so none is pruned) and computes nothing. 0 for an empty tree."""
  leaves = jax.tree.leaves(tree)
  if not leaves:
    return 0
  compiled = jax.jit(lambda *args: None, keep_unused=True).lower(*leaves).compile()
  return int(compiled.memory_analysis().argument_size_in_bytes)


def sampling_weight_bytes(c: config_dict.ConfigDict, arch: Qwen2Config, mesh: dict[str, int]) -> float:
  """Bytes of the weights one decode step multiplies by, per device: N_w x bytes(compute) / tensor, in the compute
  dtype and the sampling sharding (whole over fsdp, split by tensor: `models.sharding.SAMPLING_RULES`). An untied
  embedding is read only at the sampled tokens' rows, so it is left out of N_w; a tied one is the LM head."""
  weights = arch.num_params() - (0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size)
  return weights * _BYTES[c.model.compute_dtype] / mesh["tensor"]


def decode_step_bytes(c: config_dict.ConfigDict, arch: Qwen2Config, mesh: dict[str, int], rollout_rows: int) -> float:
  """Bytes one decode step of the dense cache must read per device: the weights (`sampling_weight_bytes`) plus
  the KV cache of the device's b = rollout_rows / (data x fsdp) rows over all S slots (read whole, valid or not):

    N_w x bytes(compute) / tensor + 2 L b S K d_h bytes(cache) + b S       (K split by tensor when it divides)

  with S = the prompt bucket + R and the last term the cache's per-slot mask bytes. (The paged cache's: only the
  positions each row attends over, `sizing.paged_sizing.decode_checks`.)
  """
  tensor = mesh["tensor"]
  kv_heads = arch.num_key_value_heads / tensor if arch.num_key_value_heads % tensor == 0 else arch.num_key_value_heads
  rows = rollout_rows / (mesh["data"] * mesh["fsdp"])
  slots = buckets.prompt_bucket(c.rollout.max_prompt_length) + c.rollout.max_response_length
  cache = 2 * arch.num_hidden_layers * rows * slots * kv_heads * arch.head_dim * _BYTES[c.rollout.cache_dtype]
  return sampling_weight_bytes(c, arch, mesh) + cache + rows * slots
