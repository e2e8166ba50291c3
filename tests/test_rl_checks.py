"""`check_inputs` turns bad batches into one clear ValueError instead of a silent NaN under jit."""

from __future__ import annotations

import numpy as np
import pytest

from agent_r1_jax import rl
from test_rl_reference import random_batch


def _good():
  rewards, values, mask, gids = random_batch(0)
  response = np.ones_like(mask)
  logp = np.where(mask > 0, -1.0, -np.inf).astype(np.float32)  # padding may hold -inf
  return dict(token_level_rewards=rewards, action_mask=mask, values=values, group_ids=gids,
              response_mask=response, logprobs=logp, old_logprobs=logp, ref_logprobs=logp)


def test_good_batch_passes():
  rl.check_inputs(**_good())
  batch = _good()
  batch["action_mask"] = batch["action_mask"].astype(bool)
  batch["group_ids"] = batch["group_ids"].astype(np.int64) + 2**31 - 1 - 999_999
  rl.check_inputs(**batch)


def _bad(**changes):
  batch = _good()
  for key, fn in changes.items():
    batch[key] = fn(batch[key])
  return batch


@pytest.mark.parametrize("batch,message", [
    (_bad(token_level_rewards=lambda r: r[0]), r"token_level_rewards must be 2-D \[B, T\]"),
    (_bad(action_mask=lambda m: m[:, :-1]), r"action_mask has shape \(12, 39\) but token_level_rewards"),
    (_bad(values=lambda v: v[:-1]), r"values has shape \(11, 40\)"),
    (_bad(action_mask=lambda m: np.where(m > 0, 0.5, 0.0)), r"action_mask must contain only 0 and 1; found 0.5"),
    (_bad(response_mask=lambda m: m * 2), r"response_mask must contain only 0 and 1"),
    (_bad(response_mask=lambda m: np.zeros_like(m)), r"action_mask is 1 outside the response"),
    (_bad(token_level_rewards=lambda r: np.where(np.arange(40) == 39, np.nan, r)),
     r"token_level_rewards is not finite \(nan\) at \(row, token\) \(0, 39\)"),
    (_bad(values=lambda v: np.full_like(v, np.inf)), r"values is not finite \(inf\) at masked \(row, token\) \(1, 7\)"),
    (_bad(old_logprobs=lambda x: np.full_like(x, np.nan)), r"old_logprobs is not finite"),
    (_bad(group_ids=lambda g: np.where(np.arange(12) == 3, -1, g)),
     r"group_ids must lie in \[0, 2147483647\]; row 3 has -1"),
    (_bad(group_ids=lambda g: g.astype(np.int64) + 2**31), r"group_ids must lie in"),
    (_bad(group_ids=lambda g: g.astype(np.float32)), r"group_ids must be integers"),
    (_bad(group_ids=lambda g: g[:5]), r"group_ids must have shape \[B\] = \(12,\)"),
])
def test_bad_batches_raise_one_clear_error(batch, message):
  with pytest.raises(ValueError, match=message):
    rl.check_inputs(**batch)
