"""Host-side validation of an RL batch, called once per batch before the jitted kernels.

Inside jit a bad input cannot raise; it turns into a silent NaN or a wrong gather. `check_inputs` reads
the arrays on the host (NumPy) and raises one `ValueError` that names the array, the problem and the
first offending position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_INT32_MAX = np.iinfo(np.int32).max


def _host(x: Any) -> np.ndarray:
  return np.asarray(x)


def _first_index(bad: np.ndarray) -> tuple[int, ...]:
  return tuple(int(i) for i in np.argwhere(bad)[0])


def _check_mask(name: str, mask: np.ndarray, shape: tuple[int, ...]) -> None:
  if mask.shape != shape:
    raise ValueError(f"{name} has shape {mask.shape} but token_level_rewards has shape {shape}; "
                     f"all per-token arrays must be [B, T] with the same B and T")
  if mask.dtype != np.bool_:
    if not (np.issubdtype(mask.dtype, np.number)):
      raise ValueError(f"{name} must be a 0/1 (or bool) array, got dtype {mask.dtype}")
    bad = (mask != 0) & (mask != 1)
    if bad.any():
      idx = _first_index(bad)
      raise ValueError(f"{name} must contain only 0 and 1; found {mask[idx].item()!r} at (row, token) {idx}")


def _check_finite(name: str, x: np.ndarray, shape: tuple[int, ...], mask: np.ndarray | None) -> None:
  """Finite values wherever `mask` is non-zero (everywhere when `mask` is None)."""
  if x.shape != shape:
    raise ValueError(f"{name} has shape {x.shape} but token_level_rewards has shape {shape}; "
                     f"all per-token arrays must be [B, T] with the same B and T")
  if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
    raise ValueError(f"{name} must be a real-valued array, got dtype {x.dtype}")
  bad = ~np.isfinite(x) if mask is None else ~np.isfinite(x) & (mask != 0)
  if bad.any():
    idx = _first_index(bad)
    where = "(row, token)" if mask is None else "masked (row, token)"
    raise ValueError(f"{name} is not finite ({x[idx].item()!r}) at {where} {idx}; fix the reward "
                     f"function / model output that produced it")


def check_inputs(token_level_rewards: Any, action_mask: Any, *, values: Any = None, group_ids: Any = None,
                 response_mask: Any = None, logprobs: Any = None, old_logprobs: Any = None,
                 ref_logprobs: Any = None) -> None:
  """Validates one batch of RL inputs on the host; raises `ValueError` naming what to fix.

  Checks:
    * `token_level_rewards` is 2-D `[B, T]`; every other per-token array has the same shape.
    * `action_mask` (and `response_mask`) are bool or contain only 0 and 1, and, when both are given,
      action tokens lie inside the response (`action_mask <= response_mask`).
    * rewards are finite everywhere (a NaN reward on an observation token is still a bug upstream);
      values and log-probs are finite at masked positions (padding may hold anything).
    * `group_ids` is an integer `[B]` array with ids in `[0, 2**31 - 1]` (arbitrary, not necessarily
      contiguous).

  Args:
    token_level_rewards: `[B, T]`.
    action_mask: `[B, T]`.
    values, logprobs, old_logprobs, ref_logprobs: optional `[B, T]`.
    group_ids: optional int `[B]`.
    response_mask: optional `[B, T]`.

  Raises:
    ValueError: with a message saying which array is wrong and how.
  """
  rewards = _host(token_level_rewards)
  if rewards.ndim != 2:
    raise ValueError(f"token_level_rewards must be 2-D [B, T], got shape {rewards.shape}")
  shape = rewards.shape
  mask = _host(action_mask)
  _check_mask("action_mask", mask, shape)
  _check_finite("token_level_rewards", rewards, shape, None)
  if response_mask is not None:
    resp = _host(response_mask)
    _check_mask("response_mask", resp, shape)
    outside = (mask != 0) & (resp == 0)
    if outside.any():
      raise ValueError(f"action_mask is 1 outside the response (response_mask 0) at (row, token) "
                       f"{_first_index(outside)}; action tokens must be response tokens")
  for name, arr in (("values", values), ("logprobs", logprobs), ("old_logprobs", old_logprobs),
                    ("ref_logprobs", ref_logprobs)):
    if arr is not None:
      _check_finite(name, _host(arr), shape, mask)
  if group_ids is not None:
    gids = _host(group_ids)
    if gids.shape != (shape[0],):
      raise ValueError(f"group_ids must have shape [B] = ({shape[0]},), got {gids.shape}")
    if not np.issubdtype(gids.dtype, np.integer):
      raise ValueError(f"group_ids must be integers (one prompt id per row), got dtype {gids.dtype}")
    out = (gids < 0) | (gids > _INT32_MAX)
    if out.any():
      i = int(np.argmax(out))
      raise ValueError(f"group_ids must lie in [0, {_INT32_MAX}]; row {i} has {gids[i]}")
