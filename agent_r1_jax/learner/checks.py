"""The learner's sections of a config (`actor.*`, `critic.*`, the learner's `model.*` chunking and
`algorithm.loss_agg_horizon`), each checked with one ValueError naming the field to change, and the loss horizon
they resolve to. The batch's split over devices is checked where the devices are known (`sizing.checks`)."""

from __future__ import annotations

from ml_collections import config_dict

from agent_r1_jax import rl

LR_SCHEDULES = ("constant", "cosine")


def check_choice(name: str, value, choices) -> None:
  """`value` is one of `choices`, else one ValueError naming field `name` and the valid values."""
  if value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_learner_fields(c: config_dict.ConfigDict) -> None:
  """The actor's and critic's loss and optimizer choices, the loss horizon and the model's chunk sizes."""
  for name, value, choices in (
      ("actor.kl_loss_type", c.actor.kl_loss_type, rl.KL_PENALTIES),
      ("actor.loss_agg_mode", c.actor.loss_agg_mode, rl.LOSS_AGG_MODES),
      ("critic.loss_agg_mode", c.critic.loss_agg_mode, rl.LOSS_AGG_MODES),
      ("actor.lr_schedule", c.actor.lr_schedule, LR_SCHEDULES)):
    check_choice(name, value, choices)
  horizon = c.algorithm.loss_agg_horizon
  if horizon is not None and (not isinstance(horizon, int) or horizon < 1):
    raise ValueError(f"algorithm.loss_agg_horizon must be a positive integer (or None: "
                     f"rollout.max_response_length), got {horizon!r}")
  for name in ("logits_chunk_size", "attention_chunk_size"):
    if not isinstance(c.model[name], int) or c.model[name] < 0:
      raise ValueError(f"model.{name} must be an integer >= 0 (0: no chunking), got {c.model[name]!r}")


def loss_agg_horizon(c: config_dict.ConfigDict) -> int:
  """H of seq-mean-token-sum-norm: `algorithm.loss_agg_horizon`, default `rollout.max_response_length`."""
  return c.algorithm.loss_agg_horizon or c.rollout.max_response_length
