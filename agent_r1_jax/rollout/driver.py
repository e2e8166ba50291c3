"""The multi-turn episode driver: jitted generation segments alternating with host-side env steps.

One rollout (paper, Figure 3) over B = len(prompts) * samples_per_prompt rows:

  prefill(prompts)
  for turn in 0 .. max_turns-1, while any row on any process is active:
    budget_b = min(max_new_tokens_per_turn, R - len_b, C - prompt_len_b - len_b)   (0 for inactive rows)
    segment  = decode (turn 0) | continue_(observations) (later turns)      -- one jitted call, all rows
    append each row's segment to its response (action_mask 1); decode the segments (one batch_decode)
    env.batch_step(segment texts of the rows that sampled)                   -- one call, all rows
    rows without a tool call end (answer); rows with one either end (turn / budget / context limit) or get
    their observation tokenized (one batch call) and appended (action_mask 0), queued for continue_.

Everything per token happens in numpy (scatter of segment tokens) or on device; the Python loops are over
turns and over rows' strings. The sampled ids are stored as returned, never decoded and re-encoded; only
observations are tokenized, once. A row's trailing observation after its last turn is not appended.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np

from agent_r1_jax.rollout import stop_strings, validation
from agent_r1_jax.rollout.batch import EpisodeStop, TrajectoryBatch
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.rollout.episode_state import EpisodeState
from agent_r1_jax.sampling.multihost import any_across_processes
from agent_r1_jax.sampling.params import StopReason

ProcessRewardFn = Callable[[int, np.ndarray, list[str], list[tuple[str, list[bool], bool]]], Sequence[float]]


class _PhaseTimer:
  """Accumulates wall time per named phase."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _encode_prompts(tokenizer: Any, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
  """Rendered prompt strings are tokenized as they are (no extra BOS); id sequences pass through."""
  if not isinstance(prompts, (list, tuple)):
    prompts = list(prompts)
  if prompts and all(isinstance(p, str) for p in prompts):
    return [list(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
  if any(isinstance(p, str) for p in prompts):
    raise TypeError("prompts must be all rendered strings or all token-id sequences, not a mix")
  return [[int(t) for t in p] for p in prompts]


def _left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
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


def _check_cache_lengths(state: Any, expected: np.ndarray) -> None:
  """The sampler's per-row cache fill must match the driver's account (a cheap [B] comparison)."""
  lengths = getattr(state, "lengths", None)
  if lengths is not None and not np.array_equal(np.asarray(lengths), expected):
    raise RuntimeError(f"sampler cache lengths {np.asarray(lengths)} disagree with the driver's {expected}")


def _apply_step_results(ep: EpisodeState, rows: np.ndarray, results: Sequence[tuple[str, list[bool], bool]],
                        stopped: np.ndarray, config: RolloutConfig) -> list[tuple[int, str]]:
  """Counts tool calls, ends the rows the env step ends, returns (row, observation) of rows that go on.

  No tool call: a turn that ended on a stop token is an answer; one cut by a budget ran out of the response
  slots, the context, or (otherwise) the per-turn budget. A tool call on the last allowed turn ends the row
  (MAX_TURNS) without its observation.
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


def _append_observation(ep: EpisodeState, b: int, ids: list[int], config: RolloutConfig) -> list[int]:
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


def run_episodes(
    sampler: Any,
    params: Any,
    env: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[int]],
    config: RolloutConfig,
    sampling: Any,
    rng: jax.Array,
    *,
    samples_per_prompt: int = 1,
    ground_truths: Sequence[Any] | None = None,
    data_sources: Sequence[str] | None = None,
    group_offset: int = 0,
    process_reward_fn: ProcessRewardFn | None = None,
    check_env: bool = True,
    prepare_params: bool = True,
) -> TrajectoryBatch:
  """Runs one multi-turn rollout and returns its fixed-shape `TrajectoryBatch`.

  Args:
    sampler: implements the sampling contract: `prefill(params, ids[B,P], mask[B,P])`, `decode(params,
      state, budgets[B], sampling, rng)`, `continue_(params, state, tokens: list[list[int]], budgets, sampling,
      rng)` -> `(state, segment)` with numpy `segment.tokens/logprobs [B,S]`, `lengths/stop_reasons [B]`.
    params: the policy parameters handed to every sampler call.
    env: `batch_step(list[str]) -> list[(observation: str, successes: list[bool], active: bool)]`.
    tokenizer: a Hugging Face tokenizer with `<|im_start|>` / `<|im_end|>` as single ids (see `validation`);
      `<tool_call>` / `</tool_call>` may be several tokens (turns are parsed as text).
    prompts: rendered chat prompts (strings, or their token ids) ending with the assistant header.
    config: the rollout limits.
    sampling: the sampler's (static) sampling parameters, passed through.
    rng: a JAX PRNG key; turn t samples with `fold_in(rng, t)`.
    samples_per_prompt: rows per prompt; row i * n + k is sample k of prompt i, `group_ids` = offset + i.
    ground_truths, data_sources: per prompt, copied to each of its rows for the reward functions.
    group_offset: added to the prompt index to form `group_ids` (make them global under multi-host).
    process_reward_fn: optional `fn(turn, rows, segment_texts, step_results) -> one float per row in
      rows` called after each env step (e.g. an env's own method); the value lands on the turn's last action.
    check_env: probe the env once with a final answer and a call to a nonexistent tool before generating.
    prepare_params: hand every sampler call `sampler.prepare(params)` (when the sampler has it) instead of
      `params`; False when the caller passes prepared parameters already.

  Returns:
    The TrajectoryBatch of B rows, with `timings` in seconds: generation (sampler calls: prefill,
    segments, observation appends), tools (env.batch_step, parsing included, and the up-front probe),
    host (everything else: validation, detokenize, tokenize, bookkeeping), total; detokenize and tokenize
    are also reported on their own (they are part of host).
  """
  timer = _PhaseTimer()
  start = time.perf_counter()

  # ---- everything a user can get wrong fails here, before anything is compiled ---------------------------
  if samples_per_prompt < 1:
    raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
  validation.special_token_ids(tokenizer)  # the observation framing's tokens are single ids
  validation.check_sampler(sampler, config, stop_strings.standalone_ids(tokenizer),
                           parallel_tool_calls=bool(getattr(env, "parallel_tool_calls", False)))
  prompt_lists = _encode_prompts(tokenizer, prompts)
  validation.check_prompts(prompt_lists, config)
  n_prompts = len(prompt_lists)
  for name, values in (("ground_truths", ground_truths), ("data_sources", data_sources)):
    if values is not None and len(values) != n_prompts:
      raise ValueError(f"{name} has {len(values)} entries for {n_prompts} prompts")
  if check_env:
    with timer("tools"):
      validation.probe_env(env)

  n = samples_per_prompt
  batch = n_prompts * n
  pad_id = int(tokenizer.pad_token_id)
  prompt_ids, prompt_mask = _left_pad([p for p in prompt_lists for _ in range(n)], config.max_prompt_length,
                                      pad_id)
  ep = EpisodeState.create(prompt_mask, config.max_response_length, config.max_turns, pad_id)
  end_of_text = np.asarray(config.end_of_text_ids, np.int64)

  with timer("generation"):
    if prepare_params and hasattr(sampler, "prepare"):
      params = sampler.prepare(params)  # cast and gathered once for every call of the rollout
    state = sampler.prefill(params, prompt_ids, prompt_mask)
  cache_len = ep.prompt_length.copy()  # real tokens the sampler holds per row; checked against state.lengths
  _check_cache_lengths(state, cache_len)
  pending: list[list[int]] = [[] for _ in range(batch)]

  for turn in range(config.max_turns):
    if not any_across_processes(ep.active):
      break
    room_response, room_context = ep.room(config.context_limit)
    budgets = np.where(ep.active, np.minimum(config.max_new_tokens_per_turn,
                                             np.minimum(room_response, room_context)), 0).astype(np.int32)
    if np.any(ep.active & (budgets < 1)):
      raise RuntimeError("internal error: an active row has no room left to sample")
    key = jax.random.fold_in(rng, turn)
    with timer("generation"):
      if turn == 0:
        state, seg = sampler.decode(params, state, budgets, sampling, key)
      else:
        state, seg = sampler.continue_(params, state, pending, budgets, sampling, key)
    lengths = np.asarray(seg.lengths).astype(np.int64)
    if np.any(lengths[budgets > 0] < 1) or np.any(lengths > budgets):
      raise RuntimeError(f"sampler returned segment lengths {lengths} outside (0, budgets={budgets}]")
    cache_len += np.asarray([len(p) for p in pending]) + lengths
    _check_cache_lengths(state, cache_len)

    tokens = np.asarray(seg.tokens)
    ep.append_segment(turn, tokens, np.asarray(seg.logprobs, np.float32), lengths)
    ran = lengths > 0
    stopped = np.asarray(seg.stop_reasons) == StopReason.STOP_TOKEN
    last_token = tokens[np.arange(batch), np.maximum(lengths - 1, 0)]
    eot = ran & stopped & np.isin(last_token, end_of_text)
    ep.finish(np.nonzero(eot)[0], EpisodeStop.EOS)
    env_rows = np.nonzero(ran & ~eot)[0]
    pending = [[] for _ in range(batch)]
    if env_rows.size == 0:
      continue

    with timer("detokenize"):
      texts = tokenizer.batch_decode([tokens[b, :lengths[b]].tolist() for b in env_rows],
                                     skip_special_tokens=False)
    with timer("tools"):
      results = env.batch_step(texts)
    validation.check_step_results(results, len(env_rows))
    if process_reward_fn is not None:
      rewards = np.asarray(process_reward_fn(turn, env_rows, texts, results), np.float32)
      if rewards.shape != env_rows.shape:
        raise ValueError(f"process_reward_fn must return one reward per row ({env_rows.size}), got "
                         f"shape {rewards.shape}")
      ep.process_rewards[env_rows, turn] = rewards
    observed = _apply_step_results(ep, env_rows, results, stopped, config)
    if observed:
      with timer("tokenize"):
        obs_ids = tokenizer([obs for _, obs in observed], add_special_tokens=False)["input_ids"]
      for (b, _), ids in zip(observed, obs_ids):
        pending[b] = _append_observation(ep, b, list(ids), config)

  if np.any(ep.active):
    raise RuntimeError("internal error: rows still active after the turn loop")
  with timer("detokenize"):
    response_text = tokenizer.batch_decode(
        [ep.response_ids[b, :ep.length[b]].tolist() for b in range(batch)], skip_special_tokens=False)
  total = time.perf_counter() - start
  timings = {name: timer.seconds.get(name, 0.0) for name in ("generation", "tools", "detokenize", "tokenize")}
  timings["total"] = total
  timings["host"] = total - timings["generation"] - timings["tools"]  # includes detokenize and tokenize
  repeat = lambda values, fill: [v for v in (values if values is not None else [fill] * n_prompts)  # noqa: E731
                                 for _ in range(n)]
  return TrajectoryBatch(
      prompt_ids=prompt_ids,
      prompt_mask=prompt_mask,
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
      timings=timings,
  )


def run_episodes_in_waves(sampler: Any, params: Any, env: Any, tokenizer: Any, prompts: Sequence[str | Sequence[int]],
                          config: RolloutConfig, sampling: Any, rng: jax.Array, *, prompts_per_wave: int,
                          samples_per_prompt: int = 1, ground_truths: Sequence[Any] | None = None,
                          data_sources: Sequence[str] | None = None, group_offset: int = 0,
                          **kwargs: Any) -> TrajectoryBatch:
  """`run_episodes` over successive waves of `prompts_per_wave` prompts, their rows concatenated in prompt order.

  A wave samples its rows to the end of their episodes before the next wave starts, so the KV cache holds one
  wave's rows, not the step's: how a step whose cache would not fit a chip is sampled with a smaller fixed
  shape. Every process of a multi-host run holds as many prompts, so all run the same waves. Wave w draws
  `fold_in(rng, w)`; `prompts_per_wave` = 0 (or >= len(prompts)) is one wave that draws `rng` itself, i.e.
  exactly `run_episodes`. `kwargs` go to every wave.
  """
  prompts = list(prompts)
  if prompts_per_wave < 0:
    raise ValueError(f"prompts_per_wave must be >= 0 (0: one wave), got {prompts_per_wave}")
  if not prompts_per_wave or prompts_per_wave >= len(prompts):
    return run_episodes(sampler, params, env, tokenizer, prompts, config, sampling, rng,
                        samples_per_prompt=samples_per_prompt, ground_truths=ground_truths,
                        data_sources=data_sources, group_offset=group_offset, **kwargs)
  if hasattr(sampler, "prepare"):
    params = sampler.prepare(params)  # once for every wave
  waves = []
  for w, start in enumerate(range(0, len(prompts), prompts_per_wave)):
    part = slice(start, start + prompts_per_wave)
    waves.append(run_episodes(
        sampler, params, env, tokenizer, prompts[part], config, sampling, jax.random.fold_in(rng, w),
        samples_per_prompt=samples_per_prompt, group_offset=group_offset + start,
        ground_truths=None if ground_truths is None else list(ground_truths)[part],
        data_sources=None if data_sources is None else list(data_sources)[part], prepare_params=False, **kwargs))
  return TrajectoryBatch.concatenate(waves)
