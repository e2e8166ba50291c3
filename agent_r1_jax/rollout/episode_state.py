"""`EpisodeState`: the host-side buffers a rollout fills, and the only code that writes them.

Row b's response so far is `response_ids[b, :length[b]]`; a sampled segment is appended with one vectorised
scatter over all rows, an observation with one slice write. Rows leave the episode through `finish`, which
records why.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agent_r1_jax.rollout.batch import EpisodeStop


@dataclasses.dataclass
class EpisodeState:
  """Per-row response buffers `[B, R]`, per-turn records `[B, T]` and counters `[B]` of one rollout."""

  response_ids: np.ndarray
  action_mask: np.ndarray
  response_mask: np.ndarray
  logprobs: np.ndarray
  length: np.ndarray  # int64 [B]: real response tokens so far
  prompt_length: np.ndarray  # int64 [B]: real prompt tokens
  turn_last_action: np.ndarray  # int32 [B, T], -1 = turn not taken
  process_rewards: np.ndarray  # float32 [B, T]
  num_turns: np.ndarray
  num_tool_calls: np.ndarray
  num_tool_errors: np.ndarray
  stop_reason: np.ndarray
  active: np.ndarray  # bool [B]

  @classmethod
  def create(cls, prompt_mask: np.ndarray, response_length: int, max_turns: int, pad_id: int) -> EpisodeState:
    batch = prompt_mask.shape[0]
    shape = (batch, response_length)
    return cls(
        response_ids=np.full(shape, pad_id, np.int32),
        action_mask=np.zeros(shape, np.int32),
        response_mask=np.zeros(shape, np.int32),
        logprobs=np.zeros(shape, np.float32),
        length=np.zeros(batch, np.int64),
        prompt_length=prompt_mask.sum(axis=1).astype(np.int64),
        turn_last_action=np.full((batch, max_turns), -1, np.int32),
        process_rewards=np.zeros((batch, max_turns), np.float32),
        num_turns=np.zeros(batch, np.int32),
        num_tool_calls=np.zeros(batch, np.int32),
        num_tool_errors=np.zeros(batch, np.int32),
        stop_reason=np.full(batch, int(EpisodeStop.NONE), np.int32),
        active=np.ones(batch, bool),
    )

  @property
  def batch_size(self) -> int:
    return self.response_ids.shape[0]

  def room(self, context_limit: int) -> tuple[np.ndarray, np.ndarray]:
    """(free response slots R - len, free context C - prompt_len - len), int64 [B] each."""
    return self.response_ids.shape[1] - self.length, context_limit - self.prompt_length - self.length

  def append_segment(self, turn: int | np.ndarray, tokens: np.ndarray, logprobs: np.ndarray, lengths: np.ndarray,
                     rows: np.ndarray | None = None) -> None:
    """Writes `tokens[i, :lengths[i]]` (sampled: action_mask 1) after the response of row `rows[i]` (row i when
    `rows` is None: every row); entries with length 0 are untouched. Records the turn's last action index for
    rows that sampled. `turn` is the turn these segments are, one int for all or an int array like `lengths`
    (the slot engine appends rows that are at different turns)."""
    rows = np.arange(self.batch_size) if rows is None else np.asarray(rows, np.int64)
    col = np.arange(tokens.shape[1])[None, :]
    valid = col < lengths[:, None]
    at = np.broadcast_to(rows[:, None], valid.shape)[valid]
    cols = (self.length[rows][:, None] + col)[valid]
    self.response_ids[at, cols] = tokens[valid]
    self.action_mask[at, cols] = 1
    self.response_mask[at, cols] = 1
    self.logprobs[at, cols] = logprobs[valid]
    ran = lengths > 0
    self.length[rows] += lengths
    self.num_turns[rows[ran]] += 1
    turns = np.broadcast_to(np.asarray(turn), rows.shape)
    self.turn_last_action[rows[ran], turns[ran]] = (self.length[rows[ran]] - 1).astype(np.int32)

  def append_observation(self, b: int, ids: list[int]) -> None:
    """Writes observation tokens (action_mask 0, response_mask 1) after row b's response."""
    start = int(self.length[b])
    self.response_ids[b, start:start + len(ids)] = ids
    self.response_mask[b, start:start + len(ids)] = 1
    self.length[b] += len(ids)

  def finish(self, rows: np.ndarray, reason: EpisodeStop) -> None:
    self.stop_reason[rows] = int(reason)
    self.active[rows] = False

  def last_action_index(self) -> np.ndarray:
    """int32 [B]: the last sampled token of each row (its latest turn's last action)."""
    return self.turn_last_action.max(axis=1).astype(np.int32)
