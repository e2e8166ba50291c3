"""A per-device memory plan for a configured run, computed from shapes alone (`--config.dry_run=True`).

Estimates, in bytes per device, for a mesh (data x fsdp x tensor = N devices):

  params      P_n * bytes(param_dtype) / (fsdp * tensor)              actor (+ critic, + frozen reference)
  optimizer   P_n * 2 * 4 / (fsdp * tensor)                             AdamW first and second moments, float32
  gradients   P_n * 4 / (fsdp * tensor)                                 float32 accumulation buffer
  kv_cache    2 * L * B_roll * (P+R) * K * d_h * bytes(cache) / (data*fsdp * min(tensor, K))
  activations per micro-batch of m rows and S = P+R tokens, per device:
              remat:    L * m * S * D * bytes(compute)  (block inputs kept)  + one block's working set
              no remat: L * m * S * (10 D + 2 F) * bytes(compute)            (rough per-block residue)
              + logits m * R * V * 4 * 3 (log-softmax, softmax, grad)
              all divided by (data * fsdp) for the batch axis.

It is a planning estimate (XLA fuses and frees buffers; the real peak differs by tens of percent), meant for
choosing a mesh and micro-batch size before renting a pod.
"""

from __future__ import annotations

import dataclasses

from agent_r1_jax.models import Qwen2Config

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass
class MemoryPlan:
  num_params: int
  per_device: dict[str, float]   # bytes

  @property
  def total(self) -> float:
    return sum(self.per_device.values())

  def table(self) -> str:
    gib = 1 << 30
    lines = [f"  {name:<22s} {value / gib:10.2f} GiB" for name, value in self.per_device.items()]
    lines.append(f"  {'total':<22s} {self.total / gib:10.2f} GiB")
    return "\n".join(lines)


def plan_memory(model: Qwen2Config, *, param_dtype: str, compute_dtype: str, cache_dtype: str, remat: bool,
                use_critic: bool, keep_reference: bool, rollout_rows: int, prompt_length: int,
                response_length: int, micro_batch_size: int, data: int, fsdp: int, tensor: int) -> MemoryPlan:
  """The per-device estimate described in the module docstring."""
  n = model.num_params()
  shard = fsdp * tensor
  batch_shard = data * fsdp
  pb, cb = _BYTES[param_dtype], _BYTES[compute_dtype]
  copies = 1 + int(use_critic) + int(keep_reference)
  s = prompt_length + response_length
  d, f, layers = model.hidden_size, model.intermediate_size, model.num_hidden_layers
  k, hd = model.num_key_value_heads, model.head_dim
  per_device = {
      "params": n * pb * copies / shard,
      "optimizer (AdamW)": n * 8 * (1 + int(use_critic)) / shard,
      "gradients": n * 4 / shard,
      "kv_cache (rollout)": 2 * layers * rollout_rows * s * k * hd * _BYTES[cache_dtype]
                            / (batch_shard * min(tensor, k)),
  }
  m = micro_batch_size
  if remat:
    act = layers * m * s * d * cb + m * s * (10 * d + 2 * f) * cb
  else:
    act = layers * m * s * (10 * d + 2 * f) * cb
  act += m * response_length * model.vocab_size * 4 * 3
  per_device["activations (micro-batch)"] = act / batch_shard
  return MemoryPlan(num_params=n, per_device=per_device)
