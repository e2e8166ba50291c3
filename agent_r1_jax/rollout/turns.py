"""The episode rules both rollout engines apply, whatever the schedule: inputs checked and encoded, a finished
turn's env result turned into an ending or an observation, the observation capped and appended, and the
fixed-shape `TrajectoryBatch` assembled.

The lockstep driver (`driver.run_episodes`) applies them to every row at once after each segment; the slot engine
(`slot_engine.run_slot_episodes`) to the rows whose turn just finished. Either way a row sees the same rules in
the same order, so the two engines produce the same trajectories from the same sampled tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from agent_r1_jax.rollout import stop_strings, validation
from agent_r1_jax.rollout.batch import EpisodeStop, TrajectoryBatch
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.rollout.episode_state import EpisodeState

ProcessRewardFn = Callable[[int, np.ndarray, list[str], list[tuple[str, list[bool], bool]]], Sequence[float]]


class PhaseTimer:
  """Accumulates wall time per named phase."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
      yield
    finally:
      self.add(name, time.perf_counter() - start)

  def add(self, name: str, seconds: float) -> None:
    self.seconds[name] = self.seconds.get(name, 0.0) + seconds

  def timings(self, total: float, names: Sequence[str], blocking: Sequence[str]) -> dict[str, float]:
    """Seconds of each phase in `names` (0 if it never ran), `total`, and host = total - the `blocking` phases (the
    host's own work: what no phase accounts for, plus those of `names` that are not blocking)."""
    out = {name: self.seconds.get(name, 0.0) for name in names}
    out["total"] = total
    out["host"] = total - sum(out[name] for name in blocking)
    return out


def timed_batch_step(env: Any, texts: list[str]) -> tuple[Any, float]:
  """(env.batch_step(texts), its duration in seconds): a tool call as a thread pool runs it."""
  start = time.perf_counter()
  results = env.batch_step(texts)
  return results, time.perf_counter() - start


def encode_prompts(tokenizer: Any, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
  """Rendered prompt strings are tokenized as they are (no extra BOS); id sequences pass through."""
  if not isinstance(prompts, (list, tuple)):
    prompts = list(prompts)
  if prompts and all(isinstance(p, str) for p in prompts):
    return [list(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
  if any(isinstance(p, str) for p in prompts):
    raise TypeError("prompts must be all rendered strings or all token-id sequences, not a mix")
  return [[int(t) for t in p] for p in prompts]


def left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  ids = np.full((len(rows), width), pad_id, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for b, row in enumerate(rows):
    if row:
      ids[b, width - len(row):] = row
      mask[b, width - len(row):] = 1
  return ids, mask


def cap_observation(ids: list[int], cap: int | None, tail: int) -> list[int]:
  """Keeps the first cap - tail and the last `tail` ids of an observation longer than `cap`."""
  if cap is None or len(ids) <= cap:
    return ids
  return ids[:cap - tail] + (ids[len(ids) - tail:] if tail else [])


@dataclasses.dataclass(frozen=True)
class Episodes:
  """A rollout's checked inputs: B = len(prompts) * samples_per_prompt rows, row i * n + k = sample k of prompt i.

  prompt_ids, prompt_mask: int32 `[B, P]`, left-padded to `config.max_prompt_length`.
  prompts: the B rows' prompt ids (unpadded).
  """

  prompt_ids: np.ndarray
  prompt_mask: np.ndarray
  prompts: list[list[int]]
  n_prompts: int
  samples_per_prompt: int
  pad_id: int

  @property
  def batch_size(self) -> int:
    return self.prompt_ids.shape[0]


def check_and_encode(sampler: Any, env: Any, tokenizer: Any, prompts: Sequence[str | Sequence[int]],
                     config: RolloutConfig, *, samples_per_prompt: int, ground_truths: Sequence[Any] | None,
                     data_sources: Sequence[str] | None, check_env: bool, timer: PhaseTimer) -> Episodes:
  """Everything a user can get wrong fails here, before anything is compiled; returns the encoded rows."""
  if samples_per_prompt < 1:
    raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
  validation.special_token_ids(tokenizer)  # the observation framing's tokens are single ids
  validation.check_sampler(sampler, config, stop_strings.standalone_ids(tokenizer),
                           parallel_tool_calls=bool(getattr(env, "parallel_tool_calls", False)))
  prompt_lists = encode_prompts(tokenizer, prompts)
  validation.check_prompts(prompt_lists, config)
  n_prompts = len(prompt_lists)
  for name, values in (("ground_truths", ground_truths), ("data_sources", data_sources)):
    if values is not None and len(values) != n_prompts:
      raise ValueError(f"{name} has {len(values)} entries for {n_prompts} prompts")
  if check_env:
    with timer("tools"):
      validation.probe_env(env)
  pad_id = int(tokenizer.pad_token_id)
  rows = [p for p in prompt_lists for _ in range(samples_per_prompt)]
  prompt_ids, prompt_mask = left_pad(rows, config.max_prompt_length, pad_id)
  return Episodes(prompt_ids, prompt_mask, rows, n_prompts, samples_per_prompt, pad_id)


def record_process_rewards(ep: EpisodeState, process_reward_fn: ProcessRewardFn | None, turn: int, rows: np.ndarray,
                           texts: list[str], results: Sequence[tuple[str, list[bool], bool]]) -> None:
  """`process_reward_fn(turn, rows, texts, results)` (one float per row) into `ep.process_rewards[rows, turn]`."""
  if process_reward_fn is None:
    return
  rewards = np.asarray(process_reward_fn(turn, rows, texts, results), np.float32)
  if rewards.shape != rows.shape:
    raise ValueError(f"process_reward_fn must return one reward per row ({rows.size}), got "
                     f"shape {rewards.shape}")
  ep.process_rewards[rows, turn] = rewards


def apply_step_results(ep: EpisodeState, rows: np.ndarray, results: Sequence[tuple[str, list[bool], bool]],
                       stopped: np.ndarray, config: RolloutConfig) -> list[tuple[int, str]]:
  """Counts tool calls, ends the rows the env step ends, returns (row, observation) of rows that go on.

  `stopped` bool `[B]` (indexed by row): the row's turn ended on a stop sequence. No tool call: a turn that
  ended on a stop token is an answer; one cut by a budget ran out of the response slots, the context, or
  (otherwise) the per-turn budget. A tool call on the last allowed turn ends the row (MAX_TURNS) without its
  observation.
  """
  # Each result is the env's (observation, successes, active): `envs.StepResult` or a plain tuple.
  calls = np.asarray([active for _, _, active in results], bool)
  ep.num_tool_calls[rows] += np.asarray([len(successes) for _, successes, _ in results], np.int32)
  ep.num_tool_errors[rows] += np.asarray([sum(not s for s in successes) for _, successes, _ in results], np.int32)

  answered = rows[~calls]
  room_response, room_context = ep.room(config.context_limit)
  closed = stopped[answered]
  no_response = room_response[answered] <= 0
  no_context = room_context[answered] <= 0
  ep.finish(answered[closed], EpisodeStop.ANSWER)
  ep.finish(answered[~closed & no_response], EpisodeStop.RESPONSE_BUDGET)
  ep.finish(answered[~closed & ~no_response & no_context], EpisodeStop.CONTEXT_LIMIT)
  ep.finish(answered[~closed & ~no_response & ~no_context], EpisodeStop.TRUNCATED_TURN)

  calling = rows[calls]
  last_turn = ep.num_turns[calling] >= config.max_turns
  ep.finish(calling[last_turn], EpisodeStop.MAX_TURNS)
  observations = [observation for observation, _, active in results if active]
  return [(int(b), obs) for b, obs, last in zip(calling, observations, last_turn) if not last]


def append_observation(ep: EpisodeState, b: int, ids: list[int], config: RolloutConfig) -> list[int]:
  """Appends row b's (capped) observation; returns the ids to send to the sampler ([] if the row ends).

  It must leave at least one slot for the next action; otherwise it is cut to the room left and the row
  ends on whichever limit (response slots or context) is tighter.
  """
  ids = cap_observation(ids, config.max_observation_tokens, config.observation_tail_tokens)
  room_response, room_context = (int(x[b]) for x in ep.room(config.context_limit))
  room = min(room_response, room_context)
  if len(ids) < room:
    ep.append_observation(b, ids)
    return ids
  ep.append_observation(b, ids[:room])
  ep.finish(np.asarray([b]), EpisodeStop.RESPONSE_BUDGET if room_response <= room_context
            else EpisodeStop.CONTEXT_LIMIT)
  return []


def turn_budgets(ep: EpisodeState, config: RolloutConfig, rows: np.ndarray) -> np.ndarray:
  """int32 budgets of the next turn of `rows`: min(max_new_tokens_per_turn, free response slots, free context),
  0 for rows that have ended; an active row always has room for one token (the rules end it otherwise)."""
  room_response, room_context = ep.room(config.context_limit)
  budgets = np.where(ep.active[rows], np.minimum(config.max_new_tokens_per_turn,
                                                 np.minimum(room_response[rows], room_context[rows])), 0)
  budgets = budgets.astype(np.int32)
  if np.any(ep.active[rows] & (budgets < 1)):
    raise RuntimeError("internal error: an active row has no room left to sample")
  return budgets


def build_batch(ep: EpisodeState, episodes: Episodes, tokenizer: Any, timer: PhaseTimer, *, group_offset: int,
                ground_truths: Sequence[Any] | None, data_sources: Sequence[str] | None) -> TrajectoryBatch:
  """The finished rollout's `TrajectoryBatch` (every row must have ended); response texts decoded here."""
  if np.any(ep.active):
    raise RuntimeError("internal error: rows still active after the rollout")
  with timer("detokenize"):
    response_text = tokenizer.batch_decode(
        [ep.response_ids[b, :ep.length[b]].tolist() for b in range(ep.batch_size)], skip_special_tokens=False)
  n, n_prompts = episodes.samples_per_prompt, episodes.n_prompts
  repeat = lambda values, fill: [v for v in (values if values is not None else [fill] * n_prompts)  # noqa: E731
                                 for _ in range(n)]
  return TrajectoryBatch(
      prompt_ids=episodes.prompt_ids,
      prompt_mask=episodes.prompt_mask,
      response_ids=ep.response_ids,
      response_mask=ep.response_mask,
      action_mask=ep.action_mask,
      sampler_logprobs=ep.logprobs,
      last_action_index=ep.last_action_index(),
      turn_last_action_index=ep.turn_last_action,
      process_rewards=ep.process_rewards,
      group_ids=(group_offset + np.repeat(np.arange(n_prompts), n)).astype(np.int32),
      num_turns=ep.num_turns,
      num_tool_calls=ep.num_tool_calls,
      num_tool_errors=ep.num_tool_errors,
      stop_reason=ep.stop_reason,
      response_text=response_text,
      ground_truth=repeat(ground_truths, None),
      data_source=repeat(data_sources, ""),
  )
