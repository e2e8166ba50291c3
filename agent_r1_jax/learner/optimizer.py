"""Optimizer: AdamW with global-norm clipping and a warm-up schedule, and the update step that skips
non-finite gradients.

    lr(s)   = lr * s / W                                     for s < W  (linear warm-up over W steps)
            = lr                                             constant, or
            = lr * (1 + cos(pi * min(s - W, S - W) / (S - W))) / 2   cosine decay to 0 at S total steps
    g       = g * min(1, grad_clip / ||g||_2)                (when grad_clip > 0; norm over the whole tree)
    theta   = AdamW(theta, g; lr(s), b1, b2, eps, weight_decay)

Steps `s` count optimizer updates (one per mini-batch). An update whose gradient has a non-finite global norm
leaves parameters and optimizer state unchanged (`apply_update` reports it as `skipped = 1`). Parameters,
gradients and optimizer states are pytrees of the model's parameter shapes; the schedules are scalars.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def apply_update(tx: optax.GradientTransformation, params: nnx.State, opt_state: Any,
                 grads: nnx.State) -> tuple[nnx.State, Any, dict[str, jax.Array]]:
  """One optimizer step, skipped (params and state unchanged) when any gradient is non-finite."""
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(grad_norm)
  safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
  updates, new_opt_state = tx.update(safe_grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  return (keep(new_params, params), keep(new_opt_state, opt_state),
          {"grad_norm": grad_norm, "skipped": 1.0 - finite.astype(jnp.float32)})


def lr_schedule(lr: float, warmup_steps: int, *, total_steps: int | None = None,
                schedule: str = "constant") -> optax.Schedule:
  """Linear warm-up to `lr` over `warmup_steps`, then constant or a cosine decay to 0 at `total_steps`."""
  if lr <= 0:
    raise ValueError(f"learning rate must be > 0, got {lr}")
  warm = optax.linear_schedule(0.0, lr, max(warmup_steps, 1)) if warmup_steps > 0 else optax.constant_schedule(lr)
  if schedule == "constant":
    after = optax.constant_schedule(lr)
  elif schedule == "cosine":
    if not total_steps:
      raise ValueError("a cosine schedule needs total_steps")
    after = optax.cosine_decay_schedule(lr, max(total_steps - warmup_steps, 1))
  else:
    raise ValueError(f"unknown lr schedule {schedule!r}; use 'constant' or 'cosine'")
  return optax.join_schedules([warm, after], [warmup_steps]) if warmup_steps > 0 else after


def clipped_adamw(schedule: optax.Schedule, *, weight_decay: float, grad_clip: float, b1: float = 0.9,
                  b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
  """Global-norm clipping (when `grad_clip` > 0) then AdamW at `schedule(count)`. The state's structure does
  not depend on the schedule, so a state can move between transforms that differ only in their schedule."""
  parts = [optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)]
  if grad_clip and grad_clip > 0:
    parts.insert(0, optax.clip_by_global_norm(grad_clip))
  return optax.chain(*parts)


def make_optimizer(*, lr: float, warmup_steps: int, weight_decay: float, grad_clip: float,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   total_steps: int | None = None, schedule: str = "constant") -> optax.GradientTransformation:
  """AdamW with linear warm-up (then constant or cosine decay) and global-norm clipping.

  Steps count optimizer updates (one per mini-batch), as the schedule sees them.
  """
  return clipped_adamw(lr_schedule(lr, warmup_steps, total_steps=total_steps, schedule=schedule),
                       weight_decay=weight_decay, grad_clip=grad_clip, b1=b1, b2=b2, eps=eps)
