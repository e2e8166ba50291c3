"""The analytic per-device memory plan of every program one RL step runs (`--config.dry_run=True`).

Per device of a (data x fsdp x tensor) mesh, with b = rows per device, T = tokens, L layers, hidden D, MLP
width F, heads H, KV heads K of width d_h, vocabulary V; a dimension the tensor axis divides is split by it
(heads, KV heads, F, V), parameters are split over fsdp x tensor, rows over data x fsdp:

  parameters    N * bytes(param) / (fsdp * tensor)            (AdamW moments: 2 x 4 bytes, gradients: 4)
  gathered      with fsdp > 1 weights are all-gathered in the compute dtype where used: the embedding /
                LM head (V * D) in every learner pass; the sampler's programs read every weight gathered
                once per rollout (N * bytes(compute) / tensor: `Sampler.prepare`); in an update every
                layer's, with its float32 gradient (the gradients are reduce-scattered together at the end)
  KV cache      2 * L * b * S * K * d_h * bytes(cache)         S = cache slots (prompt bucket + R)
  attention     dense: b * H * T_q * T_k * 4 * 2               float32 scores and softmax weights, one layer
                blocked (C = model.attention_chunk_size):     one block of C queries x C keys (scores,
                b * H * C * (3 C + 2 d_h) * 4                  exponentials) and its running sums
  layer         b * T * (4 D + 3 F) * bytes(compute)           q, k, v, output and the SwiGLU activations
  logits block  b * C_l * V * 4 * 3                            one block of C_l response positions: logits,
                                                               exponentials, their gradient

and each program holds:

  sampling_weights  params -> the weights in the compute dtype, gathered over fsdp (once per rollout)
  prefill       sampling weights, ids -> cache of the prompt bucket, padded to S; one layer's prompt attention
  extend        sampling weights, cache, observation ids -> one layer's attention of T_obs new tokens over S slots
  decode        sampling weights, cache, [b, V] logits -> per step: sampling's [b, V] float32 temporaries
  logprobs     params, the learner batch -> one micro-batch's forward (one layer's working set, the final
                hidden states) and one logits block; outputs [rows, R] log-probs (and entropy)
  values        the same through the critic, without logits
  actor_update  params, AdamW state, the mini-batch -> gradient accumulator and one micro-batch's gradient,
                the saved activations of every layer (with remat only each block's input), one layer's
                backward working set, a logits block forward and backward
  critic_update the same for the critic, without logits

It is a planning estimate (XLA fuses, frees and reuses buffers), checked against XLA's compiled figures by the
dry run, which prints both.
"""

from __future__ import annotations

import dataclasses

from ml_collections import config_dict

from agent_r1_jax.models import Qwen2Config
from agent_r1_jax.sampling import buckets

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _split(n: int, ways: int) -> float:
  """n per device when a mesh axis of `ways` devices splits it (the sharding rules leave it whole otherwise)."""
  return n / ways if n % ways == 0 else float(n)


@dataclasses.dataclass(frozen=True)
class RunShape:
  """Everything the plan reads: the architecture, dtypes, mesh and the step's shapes."""
  arch: Qwen2Config
  param_bytes: int
  compute_bytes: int
  cache_bytes: int
  remat: bool
  data: int
  fsdp: int
  tensor: int
  rollout_rows: int          # the sampler's (bucketed) rows
  prompt_bucket: int         # the sampler's prompt width
  cache_length: int          # S
  extend_bucket: int         # the widest observation an extend call appends (bucketed)
  segment_width: int         # one decode segment's output width (bucketed)
  top_p: bool                # nucleus sampling (sorts the vocabulary every step)
  attention_chunk: int       # blocked attention's block size (0: dense)
  learner_rows: int
  mini_rows: int
  prompt_length: int         # P of the learner batch
  response_length: int       # R of the learner batch
  actor_micro: int           # rows per device of one micro-batch
  critic_micro: int
  logits_chunk: int
  use_critic: bool
  keep_reference: bool

  @classmethod
  def from_config(cls, c: config_dict.ConfigDict, arch: Qwen2Config, mesh: dict[str, int], *, rollout_rows: int,
                  extend_tokens: int) -> RunShape:
    r = c.rollout
    return cls(arch=arch, param_bytes=_BYTES[c.model.param_dtype], compute_bytes=_BYTES[c.model.compute_dtype],
               cache_bytes=_BYTES[r.cache_dtype], remat=bool(c.model.remat), data=mesh["data"], fsdp=mesh["fsdp"],
               tensor=mesh["tensor"], rollout_rows=rollout_rows, prompt_bucket=buckets.prompt_bucket(r.max_prompt_length),
               cache_length=buckets.prompt_bucket(r.max_prompt_length) + r.max_response_length,
               extend_bucket=buckets.extend_bucket(extend_tokens),
               segment_width=buckets.segment_bucket(r.max_new_tokens_per_turn), top_p=r.top_p < 1.0,
               attention_chunk=c.model.attention_chunk_size,
               learner_rows=c.trainer.batch_size * r.n_samples,
               mini_rows=c.trainer.batch_size * r.n_samples // c.actor.num_mini_batches,
               prompt_length=r.max_prompt_length, response_length=r.max_response_length,
               actor_micro=c.actor.micro_batch_size_per_device, critic_micro=c.critic.micro_batch_size_per_device,
               logits_chunk=c.model.logits_chunk_size or r.max_response_length,
               use_critic=bool(c.algorithm.use_critic),
               keep_reference=bool(c.actor.use_kl_loss or c.algorithm.use_kl_in_reward))


class _Sizes:
  """The per-device building blocks of the module docstring's table, for one `RunShape`."""

  def __init__(self, s: RunShape):
    a = s.arch
    self.s = s
    self.batch_devices = s.data * s.fsdp
    self.heads = _split(a.num_attention_heads, s.tensor)
    self.kv_heads = _split(a.num_key_value_heads, s.tensor)
    self.mlp = _split(a.intermediate_size, s.tensor)
    self.vocab = _split(a.vocab_size, s.tensor)
    self.params = a.num_params() * s.param_bytes / (s.fsdp * s.tensor)

  def rows(self, n: int) -> float:
    return n / self.batch_devices

  def kv_cache(self, b: float, slots: int) -> float:
    a = self.s.arch
    return 2 * a.num_hidden_layers * b * slots * self.kv_heads * a.head_dim * self.s.cache_bytes + b * slots

  def attention(self, b: float, t_q: int, t_k: int) -> float:
    """One layer's attention working set, dense or blocked as `models.attention.attend` decides."""
    chunk = self.s.attention_chunk
    if not chunk or t_q == 1 or (t_q <= chunk and t_k <= chunk):
      return b * self.heads * t_q * t_k * 4 * 2
    c_q, c_k = min(t_q, chunk), min(t_k, chunk)
    return b * self.heads * c_q * (3 * c_k + 2 * self.s.arch.head_dim) * 4

  def gathered_head(self) -> float:
    """The embedding / LM head gathered whole over fsdp, in the compute dtype (`merge_for_compute`)."""
    a, s = self.s.arch, self.s
    return 0.0 if s.fsdp == 1 else self.vocab * a.hidden_size * s.compute_bytes

  def gathered_weights(self, bytes_per_param: float) -> float:
    """Every weight gathered whole over fsdp (split by tensor only) at `bytes_per_param`."""
    s = self.s
    return 0.0 if s.fsdp == 1 else s.arch.num_params() * bytes_per_param / s.tensor

  def layer(self, b: float, t: int) -> float:
    return b * t * (4 * self.s.arch.hidden_size + 3 * self.mlp) * self.s.compute_bytes

  def logits_block(self, b: float) -> float:
    return b * min(self.s.logits_chunk, self.s.response_length) * self.vocab * 4 * 3

  def batch(self, rows: int) -> float:
    """A learner batch of `rows` rows: 3 int32 token arrays and up to 7 float32 per-response arrays."""
    s = self.s
    seq, resp = s.prompt_length + s.response_length, s.response_length
    floats = 5 + int(s.keep_reference) + int(s.use_critic)
    return self.rows(rows) * (2 * seq + resp + floats * resp) * 4


def plan_programs(s: RunShape) -> dict[str, float]:
  """Per-device bytes of each program (`total` in the dry run's table), by the module docstring's formulas."""
  z = _Sizes(s)
  a = s.arch
  b = z.rows(s.rollout_rows)
  seq = s.prompt_length + s.response_length
  cache = z.kv_cache(b, s.cache_length)
  logits_rows = b * a.vocab_size * 4
  sampling = logits_rows * (7 if s.top_p else 3)
  adam = a.num_params() * 8 / (s.fsdp * s.tensor)
  grads = a.num_params() * 4 / (s.fsdp * s.tensor)

  head = z.gathered_head()

  def forward(m: int) -> float:
    return z.attention(m, seq, seq) + z.layer(m, seq) + 2 * m * seq * a.hidden_size * s.compute_bytes

  def backward(m: int) -> float:
    saved = (a.num_hidden_layers * m * seq * a.hidden_size * s.compute_bytes if s.remat
             else a.num_hidden_layers * (z.layer(m, seq) + z.attention(m, seq, seq) / 2))
    return 2 * grads + saved + 1.5 * z.attention(m, seq, seq) + 2 * z.layer(m, seq)

  prepared = a.num_params() * s.compute_bytes / s.tensor  # the sampling weights (`Sampler.prepare`)
  plan = {
      "sampling_weights": z.params + prepared,
      "prefill": prepared + z.kv_cache(b, s.prompt_bucket) + cache + logits_rows
                 + z.attention(b, s.prompt_bucket, s.prompt_bucket) + z.layer(b, s.prompt_bucket),
      "extend": prepared + cache + 2 * logits_rows + z.attention(b, s.extend_bucket, s.cache_length)
                + z.layer(b, s.extend_bucket),
      "decode": prepared + cache + logits_rows + sampling
                + b * s.segment_width * 8 + z.attention(b, 1, s.cache_length),
      "logprobs": z.params + head + z.batch(s.learner_rows) + 2 * z.rows(s.learner_rows) * s.response_length * 4
                   + forward(s.actor_micro) + z.logits_block(s.actor_micro),
      "actor_update": z.params + z.gathered_weights(s.compute_bytes + 4) + adam + z.batch(s.mini_rows)
                      + backward(s.actor_micro) + 2 * z.logits_block(s.actor_micro),
  }
  plan["ref_logprobs"] = plan["logprobs"] - z.rows(s.learner_rows) * s.response_length * 4
  if s.use_critic:
    values = s.critic_micro * seq * a.hidden_size * 4
    plan["values"] = (z.params + z.batch(s.learner_rows) + z.rows(s.learner_rows) * s.response_length * 4
                      + forward(s.critic_micro) + values)
    plan["critic_update"] = (z.params + z.gathered_weights(s.compute_bytes + 4) + adam + z.batch(s.mini_rows)
                             + backward(s.critic_micro) + 2 * values)
  return plan


def decode_step_bytes(s: RunShape) -> float:
  """Bytes one decode step must read per device: every weight the step multiplies by, in the compute dtype and
  the sampling sharding (whole over fsdp, split by tensor: `models.sharding.SAMPLING_RULES`), plus the KV cache of
  the device's rows that the step attends over (all S slots: the cache is read whole, valid or not).

  An untied embedding is read only at the sampled tokens' rows, so it is left out; a tied one is the LM head.
  """
  a = s.arch
  weights = a.num_params() - (0 if a.tie_word_embeddings else a.vocab_size * a.hidden_size)
  z = _Sizes(s)
  return weights * s.compute_bytes / s.tensor + z.kv_cache(z.rows(s.rollout_rows), s.cache_length)
