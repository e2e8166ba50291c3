"""Jitted learner computations: response log-probs / values, and the actor and critic updates.

Layout of a learner batch (all device arrays, `B` rows, prompt length `P`, response length `R`):

    input_ids        int32 [B, P+R]   left-padded prompt ++ right-padded response
    attention_mask   int32 [B, P+R]   1 = real token (prompt, action or observation)
    response_ids     int32 [B, R]     = input_ids[:, P:]
    loss_mask        f32   [B, R]     tokens that carry policy loss (action mask, or response mask in the
                                      `loss_mask=response` ablation)
    advantage_mask   f32   [B, R]     tokens that carry advantages and value targets (same choice)
    old_logprobs     f32   [B, R]     log pi_old(a_t | s_t), recomputed by the learner before the update (absent
                                      from an on-policy update, which holds its own log-probs fixed: `actor_loss`)
    ref_logprobs     f32   [B, R]     log pi_ref(a_t | s_t) (frozen initial policy), when a KL is on
    advantages       f32   [B, R]
    returns, old_values f32 [B, R]    critic targets and rollout-time values (PPO)
    sampler_logprobs f32   [B, R]     the sampler's log-probs, and
    action_mask      f32   [B, R]     the sampled tokens: only in an on-policy update, for the metrics the skipped
                                      old-log-prob pass would have given (`rollout_logprob_metrics`)

Response token j sits at sequence position P + j and is predicted by the hidden state at P + j - 1, so
every per-response quantity reads `hidden[:, P-1 : P+R-1]`; the value of the state before token j is read
from the same slice. The LM head is applied to that slice only (never to the prompt), in blocks of
`logits_chunk_size` positions (`rl.chunked_logprobs`), so no pass holds `[m, R, V]` logits.

Memory does not grow with the batch: every pass (old and reference log-probs, values, and the actor and
critic updates) walks micro-batches of `m` rows with a `lax.scan`, so one micro-batch's activations exist at
a time. Micro-batch k of a batch of `M` rows holds rows k, k + M/m, k + 2M/m, ... (`microbatch.split_micro`):
with the rows sharded in contiguous blocks over the batch devices, every micro-batch then holds m / devices
rows of every device, and no rows move between devices.

Updates: a mini-batch's micro-batches are walked summing gradients of `total_k / D`, where `D` is the loss
denominator of the whole mini-batch (`rl.aggregation`): the summed gradient is exactly the full-mini-batch
gradient (`microbatch.accumulate_gradients`). A non-finite gradient leaves parameters and optimizer state
untouched and is reported (`skipped = 1`; `optimizer.apply_update`).

On-policy updates (one epoch of one mini-batch, nothing needing the old log-probs before it) skip the
separate old-log-prob pass: `Learner.actor_step(..., onpolicy=True)` takes `old = stop_gradient(logp)` from
its own forward, which has the same value and gradient (see `actor_loss`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agent_r1_jax import rl
from agent_r1_jax.models import merge_for_compute
from agent_r1_jax.learner.microbatch import accumulate_gradients, map_micro
from agent_r1_jax.learner.optimizer import apply_update

Batch = dict[str, jax.Array]


def batch_fields(rows: int, prompt_length: int, response_length: int, *, with_ref: bool,
                 with_values: bool) -> dict[str, tuple[tuple[int, ...], Any]]:
  """`{name: (shape, dtype)}` of a learner batch (the layout in the module docstring): what `prepare_batch`
  builds and every jitted pass reads; the dry run compiles the passes for exactly these arrays."""
  seq, resp = (rows, prompt_length + response_length), (rows, response_length)
  fields = {"input_ids": (seq, jnp.int32), "attention_mask": (seq, jnp.int32), "response_ids": (resp, jnp.int32)}
  names = ["loss_mask", "advantage_mask", "old_logprobs", "advantages", "returns"]
  names += ["ref_logprobs"] * with_ref + ["old_values"] * with_values
  fields.update({name: (resp, jnp.float32) for name in names})
  return fields


# --------------------------------------------------------------------------------------------------
# Forward passes restricted to the response.


def bucket_length(needed: int, multiple: int, cap: int) -> int:
  """`needed` rounded up to a multiple of `multiple`, at most `cap`: the padded width of one batch.

  Padding every batch to the configured maximum would make attention cost O(max^2) per row; padding to the
  batch's own longest row, rounded up, keeps the number of compiled shapes at most cap / multiple.
  """
  return min(cap, -(-max(needed, 1) // multiple) * multiple)


def response_hidden(model: nnx.Module, input_ids: jax.Array, attention_mask: jax.Array,
                    response_length: int) -> jax.Array:
  """Backbone hidden states that predict each response token: `[B, R, D]`."""
  hidden, _ = model.model(input_ids, attention_mask)
  start = input_ids.shape[1] - response_length - 1
  return jax.lax.slice_in_dim(hidden, start, start + response_length, axis=1)


def response_logprobs(model: nnx.Module, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False,
                       chunk_size: int = 0) -> tuple[jax.Array, jax.Array | None]:
  """`log softmax(logits / temperature)[a_t]` for every response token, float32 `[B, R]`.

  Also returns the per-token entropy of the (temperature-scaled) policy when `with_entropy`. The LM head
  runs over blocks of `chunk_size` response positions (0: all at once); see `rl.chunked_logprobs`.
  """
  responses = batch["response_ids"]
  h = response_hidden(model, batch["input_ids"], batch["attention_mask"], responses.shape[1])
  return rl.chunked_logprobs(h, responses, model.logits, chunk_size=chunk_size, temperature=temperature,
                              with_entropy=with_entropy)


def response_values(critic: nnx.Module, batch: Batch) -> jax.Array:
  """Critic values V(s_t) of the state before each response token, float32 `[B, R]`."""
  r = batch["response_ids"].shape[1]
  h = response_hidden(critic, batch["input_ids"], batch["attention_mask"], r).astype(jnp.float32)
  values = jnp.einsum("brd,d->br", h, critic.value_kernel[...].astype(jnp.float32))
  return values + critic.value_bias[...].astype(jnp.float32)


# --------------------------------------------------------------------------------------------------
# Loss configuration (hashable: static under jit).


@dataclasses.dataclass(frozen=True)
class ActorLossConfig:
  """Static settings of the actor objective.

      loss = PG(clip) + kl_loss_coef * KL(pi || pi_ref) - entropy_coef * H(pi)

  all aggregated over `loss_mask` by `loss_agg_mode` (see `rl.aggregation`).
  """
  clip_ratio_low: float = 0.2
  clip_ratio_high: float = 0.2
  clip_ratio_c: float = 3.0
  loss_agg_mode: str = "token-mean"
  entropy_coef: float = 0.0
  use_kl_loss: bool = False
  kl_loss_coef: float = 0.001
  kl_loss_type: str = "low_var_kl"
  temperature: float = 1.0
  horizon: int | None = None          # H of seq-mean-token-sum-norm (None: the batch's response width)
  logits_chunk_size: int = 0          # response positions per LM-head block (0: one block)


@dataclasses.dataclass(frozen=True)
class CriticLossConfig:
  """Static settings of the clipped value loss."""
  clip_range_value: float = 0.5
  loss_agg_mode: str = "token-mean"
  horizon: int | None = None


# --------------------------------------------------------------------------------------------------
# Per-micro-batch losses: (scalar to differentiate = total / D, metrics as Aggregates).


def actor_loss(params: nnx.State, graphdef: nnx.GraphDef, batch: Batch, denominator: jax.Array,
               cfg: ActorLossConfig, *, onpolicy: bool = False
               ) -> tuple[jax.Array, tuple[dict[str, rl.Aggregate], dict[str, jax.Array]]]:
  """Actor objective of one micro-batch, divided by the mini-batch denominator `D`.

  Returns `(total / D, (metrics, per_token))`; `per_token` is empty unless `onpolicy`.

  `onpolicy`: the parameters are those that sampled the batch and nothing has updated them since, so
  pi_old = pi_theta and the old log-probs are this forward's own, held fixed: `old = stop_gradient(logp)`
  (`batch["old_logprobs"]` is not read). Then

      rho = exp(logp - sg(logp)) = 1,      d rho / d theta = exp(0) * d logp / d theta = d logp / d theta,

  the value and gradient of exp(logp_theta - logp_old) at theta_old = theta. At rho = 1 the clip is inactive
  (1 lies inside [1 - eps_low, 1 + eps_high]) and so is the dual clip (clip_ratio_c > 1), so the surrogate is
  -A with gradient -A * d logp / d theta: the same loss and gradient as with old log-probs recomputed by a
  separate forward at the same parameters (up to that forward's rounding); clip fractions and approx_kl are
  0. `per_token` then holds this forward's log-probs and entropy `[m, R]` (no gradient), for the metrics the
  skipped pass gave.
  """
  model = merge_for_compute(graphdef, params)
  # Entropy is always reported; it enters the loss only when entropy_coef > 0.
  logp, entropy = response_logprobs(model, batch, temperature=cfg.temperature, with_entropy=True,
                                     chunk_size=cfg.logits_chunk_size)
  mask = batch["loss_mask"]
  # At rho = 1 the clipped and unclipped terms tie; jnp.maximum splits a tie's gradient half and half between
  # them, and both halves are -A * d rho, so the sum is the full gradient.
  old_logp = jax.lax.stop_gradient(logp) if onpolicy else batch["old_logprobs"]
  pg = rl.compute_policy_loss(old_logp, logp, batch["advantages"], mask,
                              clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                              clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg_mode, horizon=cfg.horizon)
  on = mask > 0
  ent = rl.aggregate(jnp.where(on, entropy, 0.0), mask, cfg.loss_agg_mode, cfg.horizon)
  total = pg.loss.total - cfg.entropy_coef * ent.total
  metrics = {"actor/pg_loss": pg.loss, "actor/entropy": ent, "actor/clip_fraction": pg.clip_fraction,
             "actor/clip_fraction_dual": pg.clip_fraction_lower, "actor/approx_kl": pg.approx_kl}
  if cfg.use_kl_loss:
    kl = rl.compute_kl_loss(logp, batch["ref_logprobs"], mask, kind=cfg.kl_loss_type,
                            loss_agg_mode=cfg.loss_agg_mode, horizon=cfg.horizon)
    total = total + cfg.kl_loss_coef * kl.total
    metrics["actor/kl_loss"] = kl
  per_token = {}
  if onpolicy:
    per_token = {"logprobs": jax.lax.stop_gradient(logp), "entropy": jax.lax.stop_gradient(entropy)}
  return total / denominator, (metrics, per_token)


def rollout_logprob_metrics(logprobs: jax.Array, entropy: jax.Array, sampler_logprobs: jax.Array,
                            action_mask: jax.Array) -> dict[str, jax.Array]:
  """What the current policy's log-probs say about the sampled tokens; `[B, R]` inputs, scalar outputs:

      logprob_drift_max = max over action tokens of |logp_t - logp_sampler_t|   (learner vs sampler numerics)
      entropy           = sum_t a_t H_t / max(sum_t a_t, 1)                      (token mean over actions)

  with `a` the action mask. Masked positions are selected away, not multiplied by 0, so a non-finite value
  there changes nothing.
  """
  on = action_mask > 0
  drift = jnp.max(jnp.where(on, jnp.abs(logprobs - sampler_logprobs), 0.0))
  count = jnp.sum(on.astype(jnp.float32))
  return {"logprob_drift_max": drift, "entropy": jnp.sum(jnp.where(on, entropy, 0.0)) / jnp.maximum(count, 1.0)}


def critic_loss(params: nnx.State, graphdef: nnx.GraphDef, batch: Batch, denominator: jax.Array,
                cfg: CriticLossConfig) -> tuple[jax.Array, tuple[dict[str, rl.Aggregate], dict]]:
  """Clipped value loss of one micro-batch, divided by the mini-batch denominator `D`; no per-token outputs."""
  critic = merge_for_compute(graphdef, params)
  values = response_values(critic, batch)
  out = rl.compute_value_loss(values, batch["old_values"], batch["returns"], batch["advantage_mask"],
                              clip_range_value=cfg.clip_range_value, loss_agg_mode=cfg.loss_agg_mode,
                              horizon=cfg.horizon)
  on = batch["advantage_mask"] > 0
  vmean = rl.aggregate(jnp.where(on, values, 0.0), batch["advantage_mask"], "token-mean")
  return out.loss.total / denominator, ({"critic/value_loss": out.loss,
                                         "critic/value_clip_fraction": out.clip_fraction,
                                         "critic/values_mean": vmean}, {})


# --------------------------------------------------------------------------------------------------
# Jitted entry points.


class Learner:
  """Holds the static pieces (graphdefs, optimizers, loss configs) and the jitted functions.

  Parameters and optimizer states are passed in and returned (never stored here), so the trainer owns
  all mutable state and checkpoints it as one pytree.
  """

  def __init__(self, actor_graphdef: nnx.GraphDef, actor_tx: optax.GradientTransformation,
               actor_cfg: ActorLossConfig, *, critic_graphdef: nnx.GraphDef | None = None,
               critic_tx: optax.GradientTransformation | None = None,
               critic_cfg: CriticLossConfig = CriticLossConfig()):
    self.actor_graphdef = actor_graphdef
    self.actor_tx = actor_tx
    self.actor_cfg = actor_cfg
    self.critic_graphdef = critic_graphdef
    self.critic_tx = critic_tx
    self.critic_cfg = critic_cfg
    self.logprobs = jax.jit(self._logprobs, static_argnames=("num_micro", "with_entropy"))
    self.values = jax.jit(self._values, static_argnames=("num_micro",))
    self.actor_step = jax.jit(self._actor_step, static_argnames=("num_micro", "onpolicy"), donate_argnums=(0, 1))
    self.critic_step = jax.jit(self._critic_step, static_argnames=("num_micro",), donate_argnums=(0, 1))

  def _logprobs(self, params: nnx.State, batch: Batch, *, num_micro: int = 1,
                 with_entropy: bool = True) -> tuple[jax.Array, jax.Array | None]:
    """Response log-probs `[B, R]` (and entropy, else None) of the policy `params`, micro-batch by micro-batch."""
    cfg = self.actor_cfg

    def one(p, mb):  # the model is merged inside the loop: nnx modules must not cross trace levels
      return response_logprobs(merge_for_compute(self.actor_graphdef, p), mb, temperature=cfg.temperature,
                                with_entropy=with_entropy, chunk_size=cfg.logits_chunk_size)
    return map_micro(one, params, _scoring_inputs(batch), num_micro)

  def _values(self, params: nnx.State, batch: Batch, *, num_micro: int = 1) -> jax.Array:
    """Critic values `[B, R]`, micro-batch by micro-batch."""
    return map_micro(lambda p, mb: response_values(merge_for_compute(self.critic_graphdef, p), mb), params,
                     _scoring_inputs(batch), num_micro)

  def _actor_step(self, params, opt_state, batch: Batch, *, num_micro: int, onpolicy: bool = False):
    """One actor update on a mini-batch -> `(params, opt_state, metrics)`.

    `onpolicy`: `params` sampled this batch and have not been updated since (one epoch of one mini-batch), so
    the batch carries no `old_logprobs`: the update's forward holds its own fixed (`actor_loss`), and the
    metrics gain `logprob_drift_max` and `entropy` from that forward (`rollout_logprob_metrics`, reading the
    batch's `sampler_logprobs` and `action_mask`): the values the skipped pass would have given.
    """
    loss_fn = lambda p, mb, d: actor_loss(p, self.actor_graphdef, mb, d, self.actor_cfg, onpolicy=onpolicy)
    params, opt_state, metrics, per_token = _update_step(
        loss_fn, self.actor_tx, params, opt_state, batch, batch["loss_mask"], self.actor_cfg.loss_agg_mode,
        self.actor_cfg.horizon, num_micro, prefix="actor")
    if onpolicy:
      metrics.update(rollout_logprob_metrics(per_token["logprobs"], per_token["entropy"], batch["sampler_logprobs"],
                                             batch["action_mask"]))
    return params, opt_state, metrics

  def _critic_step(self, params, opt_state, batch: Batch, *, num_micro: int):
    loss_fn = lambda p, mb, d: critic_loss(p, self.critic_graphdef, mb, d, self.critic_cfg)
    params, opt_state, metrics, _ = _update_step(
        loss_fn, self.critic_tx, params, opt_state, batch, batch["advantage_mask"], self.critic_cfg.loss_agg_mode,
        self.critic_cfg.horizon, num_micro, prefix="critic")
    return params, opt_state, metrics


def _scoring_inputs(batch: Batch) -> Batch:
  """The arrays a forward pass reads (the rest of a learner batch is not carried through its micro-batches)."""
  return {k: batch[k] for k in ("input_ids", "attention_mask", "response_ids")}


def _update_step(loss_fn: Callable, tx: optax.GradientTransformation, params, opt_state, batch: Batch,
                 mask: jax.Array, loss_agg_mode: str, horizon: int | None, num_micro: int, *, prefix: str):
  """One optimizer update on a mini-batch: the mask's full denominator, accumulated micro-batch gradients,
  a (skippable) optimizer step; metrics gain `<prefix>/grad_norm` and `<prefix>/skipped`. Returns
  `(params, opt_state, metrics, per_token)` (`accumulate_gradients`' per-token outputs)."""
  denominator = rl.loss_denominator(mask, loss_agg_mode, horizon)
  grads, metrics, per_token = accumulate_gradients(loss_fn, params, batch, denominator, num_micro)
  params, opt_state, upd = apply_update(tx, params, opt_state, grads)
  return params, opt_state, {**metrics, f"{prefix}/grad_norm": upd["grad_norm"],
                             f"{prefix}/skipped": upd["skipped"]}, per_token
