"""`TrajectoryBatch`: the fixed-shape result of a multi-turn rollout, ready for the learner.

Layout (B rows, P prompt slots, R response slots, T = `max_turns`):

  prompt_ids      int32 [B, P]  left-padded rendered prompt; `prompt_mask` [B, P] is 1 on its real tokens.
  response_ids    int32 [B, R]  right-padded; response token j of row b is `response_ids[b, j]`, i.e. cache
                                slot P + j of the sampler. It interleaves sampled assistant segments and the
                                tokenized tool observations, in the order they entered the context.
  response_mask   int32 [B, R]  1 on every real post-prompt token (sampled or observation), 0 on padding.
  action_mask     int32 [B, R]  1 exactly on the tokens the policy sampled (stop tokens included), else 0.
  attention_mask  int32 [B, P+R] = concat(prompt_mask, response_mask) (the model derives RoPE positions from it,
                                as the sampler does).
  sampler_logprobs float32 [B, R] log pi_old(token) as returned by the sampler on action tokens, 0 elsewhere.
  last_action_index int32 [B]   index j of the row's last sampled token (the outcome-reward slot).
  turn_last_action_index int32 [B, T] last sampled token of each turn, -1 for turns the row did not take
                                (the process-reward slots).
  process_rewards float32 [B, T] per-turn rewards an env hook emitted (0 when none).

Every row has at least one action token (the driver guarantees a positive first budget), so
`last_action_index >= 0` and `action_mask[b, last_action_index[b]] == 1`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping, Sequence

import numpy as np


class EpisodeStop(enum.IntEnum):
  """Why a row's episode ended (`TrajectoryBatch.stop_reason`)."""

  NONE = 0  # never set on a finished batch; the value of a row still running
  ANSWER = 1  # a turn ended on a stop token and the env found no tool call: a final answer
  EOS = 2  # a turn ended on an end-of-text id (`RolloutConfig.end_of_text_ids`), tool call or not
  MAX_TURNS = 3  # the last allowed turn still called a tool; its observation is not appended
  RESPONSE_BUDGET = 4  # the R response slots ran out (a turn cut short, or an observation cut to fit)
  CONTEXT_LIMIT = 5  # prompt + response reached `max_context_length` (same cuts as above)
  TRUNCATED_TURN = 6  # a turn used all `max_new_tokens_per_turn` without completing a tool call


@dataclasses.dataclass
class TrajectoryBatch:
  """Host-side (numpy) rollout result with static shapes; see the module docstring for the layout."""

  prompt_ids: np.ndarray
  prompt_mask: np.ndarray
  response_ids: np.ndarray
  response_mask: np.ndarray
  action_mask: np.ndarray
  sampler_logprobs: np.ndarray
  last_action_index: np.ndarray
  turn_last_action_index: np.ndarray
  process_rewards: np.ndarray
  group_ids: np.ndarray
  num_turns: np.ndarray
  num_tool_calls: np.ndarray
  num_tool_errors: np.ndarray
  stop_reason: np.ndarray
  response_text: list[str]
  ground_truth: list[Any]
  data_source: list[str]
  timings: dict[str, float] = dataclasses.field(default_factory=dict)
  stats: dict[str, float] = dataclasses.field(default_factory=dict)  # engine figures that are not times

  def __post_init__(self):
    b, p = self.prompt_ids.shape
    r = self.response_ids.shape[1]
    expected = {
        "prompt_mask": (b, p), "response_mask": (b, r), "action_mask": (b, r), "sampler_logprobs": (b, r),
        "last_action_index": (b,), "group_ids": (b,), "num_turns": (b,), "num_tool_calls": (b,),
        "num_tool_errors": (b,), "stop_reason": (b,),
    }
    for name, shape in expected.items():
      if getattr(self, name).shape != shape:
        raise ValueError(f"TrajectoryBatch.{name} has shape {getattr(self, name).shape}, expected {shape}")
    if self.turn_last_action_index.shape != self.process_rewards.shape or self.process_rewards.shape[0] != b:
      raise ValueError("turn_last_action_index and process_rewards must both be [B, max_turns]")
    for name in ("response_text", "ground_truth", "data_source"):
      if len(getattr(self, name)) != b:
        raise ValueError(f"TrajectoryBatch.{name} has {len(getattr(self, name))} entries for {b} rows")

  @classmethod
  def concatenate(cls, batches: Sequence[TrajectoryBatch]) -> TrajectoryBatch:
    """The rows of `batches` (equal P and R) one after another; timings are summed (waves run in sequence),
    stats averaged weighted by rows."""
    if not batches:
      raise ValueError("concatenate needs at least one TrajectoryBatch")
    fields = {}
    for field in dataclasses.fields(cls):
      values = [getattr(b, field.name) for b in batches]
      if field.name == "timings":
        names = dict.fromkeys(k for t in values for k in t)
        fields[field.name] = {k: sum(t.get(k, 0.0) for t in values) for k in names}
      elif field.name == "stats":
        names = dict.fromkeys(k for t in values for k in t)
        rows = [b.batch_size for b in batches]
        fields[field.name] = {k: sum(n * t.get(k, 0.0) for n, t in zip(rows, values)) / sum(rows) for k in names}
      elif isinstance(values[0], np.ndarray):
        fields[field.name] = np.concatenate(values, axis=0)
      else:
        fields[field.name] = [v for vs in values for v in vs]
    return cls(**fields)

  # ---- shapes and derived arrays -------------------------------------------------------------------------

  @property
  def batch_size(self) -> int:
    return self.prompt_ids.shape[0]

  @property
  def prompt_length(self) -> int:
    return self.prompt_ids.shape[1]

  @property
  def response_length(self) -> int:
    return self.response_ids.shape[1]

  @property
  def response_lengths(self) -> np.ndarray:
    """int32 [B]: real response tokens per row (sampled + observation)."""
    return self.response_mask.sum(axis=1).astype(np.int32)

  @property
  def input_ids(self) -> np.ndarray:
    """int32 [B, P+R]: prompt then response, the sequence the learner runs its forward pass on."""
    return np.concatenate([self.prompt_ids, self.response_ids], axis=1)

  @property
  def attention_mask(self) -> np.ndarray:
    """int32 [B, P+R]: 1 on real tokens (left-padded prompt, right-padded response)."""
    return np.concatenate([self.prompt_mask, self.response_mask], axis=1).astype(np.int32)

  def trimmed(self, prompt_length: int, response_length: int) -> TrajectoryBatch:
    """The same batch with P and R shrunk: prompt columns cut on the left, response columns on the right.

    The learner's cost grows with (P+R)^2 through attention, so a batch whose rows are all shorter than the
    rollout limits is trimmed before it is moved to devices. Only padding may be cut: every index
    (`last_action_index`, `turn_last_action_index`) stays valid because responses are right-padded.

    Raises:
      ValueError: if a real prompt or response token would be cut.
    """
    longest_prompt = int(self.prompt_mask.sum(axis=1).max(initial=0))
    longest_response = int(self.response_lengths.max(initial=0))
    if not (longest_prompt <= prompt_length <= self.prompt_length
            and longest_response <= response_length <= self.response_length):
      raise ValueError(f"cannot trim to P={prompt_length}, R={response_length}: rows need P >= {longest_prompt}, "
                       f"R >= {longest_response} and the batch has P={self.prompt_length}, R={self.response_length}")
    cut_p, cut_r = slice(self.prompt_length - prompt_length, None), slice(0, response_length)
    return dataclasses.replace(
        self, prompt_ids=self.prompt_ids[:, cut_p], prompt_mask=self.prompt_mask[:, cut_p],
        response_ids=self.response_ids[:, cut_r], response_mask=self.response_mask[:, cut_r],
        action_mask=self.action_mask[:, cut_r], sampler_logprobs=self.sampler_logprobs[:, cut_r])

  # ---- rewards -------------------------------------------------------------------------------------------

  def outcome_rewards_to_tokens(self, scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Places one scalar per row on its last action token.

    Returns float32 [B, R] with `out[b, last_action_index[b]] = scores[b]` and zeros elsewhere, so an
    episode that ended on a tool call (its last response tokens are an observation) keeps its reward on a
    token the policy chose.
    """
    scores = np.asarray(scores, np.float32)
    if scores.shape != (self.batch_size,):
      raise ValueError(f"expected one score per row, shape ({self.batch_size},), got {scores.shape}")
    out = np.zeros(self.response_ids.shape, np.float32)
    out[np.arange(self.batch_size), self.last_action_index] = scores
    return out

  def process_rewards_to_tokens(self) -> np.ndarray:
    """float32 [B, R]: `process_rewards[b, t]` placed on the last action token of turn t (summed if shared)."""
    out = np.zeros(self.response_ids.shape, np.float32)
    rows, turns = np.nonzero(self.turn_last_action_index >= 0)
    np.add.at(out, (rows, self.turn_last_action_index[rows, turns]), self.process_rewards[rows, turns])
    return out

  def token_level_rewards(self, scores: Sequence[float] | np.ndarray, *, include_process: bool = True
                          ) -> np.ndarray:
    """float32 [B, R]: outcome scores on the last action token plus (optionally) per-turn process rewards."""
    out = self.outcome_rewards_to_tokens(scores)
    if include_process:
      out += self.process_rewards_to_tokens()
    return out

  # ---- device transfer -----------------------------------------------------------------------------------

  def as_learner_inputs(self) -> dict[str, np.ndarray]:
    """The arrays the learner's batch is prepared from (`RLTrainer.prepare_batch`), as numpy `[B, ...]`."""
    return {
        "input_ids": self.input_ids.astype(np.int32),
        "attention_mask": self.attention_mask,
        "response_ids": self.response_ids.astype(np.int32),
        "response_mask": self.response_mask.astype(np.int32),
        "action_mask": self.action_mask.astype(np.int32),
        "sampler_logprobs": self.sampler_logprobs.astype(np.float32),
        "group_ids": self.group_ids.astype(np.int32),
    }

  def to_device(self, sharding: Any = None, *, extra: Mapping[str, np.ndarray] | None = None
                ) -> dict[str, Any]:
    """Moves `as_learner_inputs()` (plus `extra` per-row arrays, e.g. token-level rewards) to devices.

    `sharding` is a `jax.sharding.Sharding` over the batch axis (e.g. `NamedSharding(mesh, P(("data",
    "fsdp")))`) or None for the default device. Under multi-host each process holds only its local rows; the
    global array is assembled with `jax.make_array_from_process_local_data`, which is also correct with one
    process. A sharding whose spec has fewer dims than an array is padded with None (replicated) by JAX.
    """
    import jax  # pylint: disable=g-import-not-at-top

    arrays = dict(self.as_learner_inputs())
    if extra:
      for name, value in extra.items():
        value = np.asarray(value)
        if value.shape[:1] != (self.batch_size,):
          raise ValueError(f"extra array {name!r} must have {self.batch_size} rows, got shape {value.shape}")
        arrays[name] = value
    if sharding is None:
      return {name: jax.device_put(value) for name, value in arrays.items()}
    return {name: jax.make_array_from_process_local_data(sharding, value) for name, value in arrays.items()}

  # ---- summaries -----------------------------------------------------------------------------------------

  def metrics(self) -> dict[str, float]:
    """Scalar rollout statistics (means over rows, stop-reason fractions) for logging."""
    out = {
        "rollout/turns_mean": float(self.num_turns.mean()),
        "rollout/tool_calls_mean": float(self.num_tool_calls.mean()),
        "rollout/tool_errors_mean": float(self.num_tool_errors.mean()),
        "rollout/response_length_mean": float(self.response_lengths.mean()),
        "rollout/action_tokens_mean": float(self.action_mask.sum(axis=1).mean()),
    }
    for reason in EpisodeStop:
      if reason is not EpisodeStop.NONE:
        out[f"rollout/stop_{reason.name.lower()}"] = float(np.mean(self.stop_reason == reason))
    for name, seconds in self.timings.items():
      out[f"rollout/time_{name}_s"] = float(seconds)
    for name, value in self.stats.items():
      out[f"rollout/{name}"] = float(value)
    return out
