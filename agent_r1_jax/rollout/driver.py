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

from agent_r1_jax.rollout import validation
from agent_r1_jax.rollout.batch import EpisodeStop, TrajectoryBatch
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.rollout.multihost import any_across_processes

# sampling.StopReason.STOP_TOKEN (the contract's value): the segment ended on one of the sampler's stop ids.
_SAMPLER_STOP_TOKEN = 1

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
) -> TrajectoryBatch:
  """Runs one multi-turn rollout and returns its fixed-shape `TrajectoryBatch`.

  Args:
    sampler: implements the sampling contract: `prefill(params, ids[B,P], mask[B,P])`, `decode(params,
      state, budgets[B], sampling, rng)`, `continue_(params, state, tokens: list[list[int]], budgets, sampling,
      rng)` -> `(state, segment)` with numpy `segment.tokens/logprobs [B,S]`, `lengths/stop_reasons [B]`.
    params: the policy parameters handed to every sampler call.
    env: `batch_step(list[str]) -> list[(observation: str, successes: list[bool], active: bool)]`.
    tokenizer: a Hugging Face tokenizer with the Qwen2.5 special tokens (see `validation`).
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
  special = validation.special_token_ids(tokenizer)
  validation.check_sampler(sampler, config, special)
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
  P, R, T = config.max_prompt_length, config.max_response_length, config.max_turns  # pylint: disable=invalid-name
  pad_id = int(tokenizer.pad_token_id)
  prompt_ids, prompt_mask = _left_pad([p for p in prompt_lists for _ in range(n)], P, pad_id)
  prompt_len = prompt_mask.sum(axis=1).astype(np.int64)
  end_of_text = np.asarray(config.end_of_text_ids, np.int64)

  response_ids = np.full((batch, R), pad_id, np.int32)
  action_mask = np.zeros((batch, R), np.int32)
  response_mask = np.zeros((batch, R), np.int32)
  logprobs = np.zeros((batch, R), np.float32)
  resp_len = np.zeros(batch, np.int64)
  turn_last = np.full((batch, T), -1, np.int32)
  process_rewards = np.zeros((batch, T), np.float32)
  num_turns = np.zeros(batch, np.int32)
  num_calls = np.zeros(batch, np.int32)
  num_errors = np.zeros(batch, np.int32)
  stop = np.full(batch, int(EpisodeStop.NONE), np.int32)
  active = np.ones(batch, bool)
  rows_all = np.arange(batch)

  def finish(rows: np.ndarray, reason: EpisodeStop) -> None:
    stop[rows] = int(reason)
    active[rows] = False

  def append_observation(b: int, ids: list[int]) -> None:
    start_b = resp_len[b]
    response_ids[b, start_b:start_b + len(ids)] = ids
    response_mask[b, start_b:start_b + len(ids)] = 1
    resp_len[b] += len(ids)

  with timer("generation"):
    state = sampler.prefill(params, prompt_ids, prompt_mask)
  cache_len = prompt_len.copy()  # real tokens the sampler holds per row; checked against state.lengths
  _check_cache_lengths(state, cache_len)
  pending: list[list[int]] = [[] for _ in range(batch)]

  for turn in range(T):
    if not any_across_processes(active):
      break
    room_response = R - resp_len
    room_context = config.context_limit - prompt_len - resp_len
    budgets = np.where(active, np.minimum(config.max_new_tokens_per_turn,
                                          np.minimum(room_response, room_context)), 0).astype(np.int32)
    ran = budgets > 0
    if np.any(active & ~ran):
      raise RuntimeError("internal error: an active row has no room left to sample")
    key = jax.random.fold_in(rng, turn)
    with timer("generation"):
      if turn == 0:
        state, seg = sampler.decode(params, state, budgets, sampling, key)
      else:
        state, seg = sampler.continue_(params, state, pending, budgets, sampling, key)
    cache_len += np.asarray([len(p) for p in pending]) + np.asarray(seg.lengths)
    _check_cache_lengths(state, cache_len)

    # ---- append the sampled segments (vectorised scatter) ---------------------------------------------------
    lengths = np.asarray(seg.lengths).astype(np.int64)
    tokens = np.asarray(seg.tokens)
    if np.any(lengths[ran] < 1) or np.any(lengths > budgets):
      raise RuntimeError(f"sampler returned segment lengths {lengths} outside (0, budgets={budgets}]")
    width = tokens.shape[1]
    col = np.arange(width)[None, :]
    valid = col < lengths[:, None]
    rr = np.broadcast_to(rows_all[:, None], valid.shape)[valid]
    cc = (resp_len[:, None] + col)[valid]
    response_ids[rr, cc] = tokens[valid]
    action_mask[rr, cc] = 1
    response_mask[rr, cc] = 1
    logprobs[rr, cc] = np.asarray(seg.logprobs, np.float32)[valid]
    last_tok = tokens[rows_all, np.maximum(lengths - 1, 0)]
    resp_len += lengths
    num_turns[ran] += 1
    turn_last[ran, turn] = (resp_len[ran] - 1).astype(np.int32)
    stopped = np.asarray(seg.stop_reasons) == _SAMPLER_STOP_TOKEN

    # ---- end-of-text ends the episode; every other sampled segment goes to the env -----------------------
    eot = ran & stopped & np.isin(last_tok, end_of_text)
    finish(np.nonzero(eot)[0], EpisodeStop.EOS)
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
      process_rewards[env_rows, turn] = rewards
    calls = np.asarray([r[2] for r in results], bool)
    num_calls[env_rows] += np.asarray([len(r[1]) for r in results], np.int32)
    num_errors[env_rows] += np.asarray([sum(not s for s in r[1]) for r in results], np.int32)

    # Rows with no tool call: a closed turn is an answer; an unclosed one ran out of some budget.
    answered = env_rows[~calls]
    full_response = resp_len[answered] >= R
    full_context = prompt_len[answered] + resp_len[answered] >= config.context_limit
    closed = stopped[answered]
    finish(answered[closed], EpisodeStop.ANSWER)
    finish(answered[~closed & full_response], EpisodeStop.RESPONSE_BUDGET)
    finish(answered[~closed & ~full_response & full_context], EpisodeStop.CONTEXT_LIMIT)
    finish(answered[~closed & ~full_response & ~full_context], EpisodeStop.TRUNCATED_TURN)

    # Rows with a tool call: the last turn ends here (its observation is not appended) ...
    calling = env_rows[calls]
    observations = [r[0] for r in results if r[2]]
    last_turn = num_turns[calling] >= T
    finish(calling[last_turn], EpisodeStop.MAX_TURNS)
    keep = ~last_turn
    calling = calling[keep]
    observations = [o for o, k in zip(observations, keep) if k]
    if calling.size == 0:
      continue
    # ... the others get their observation, tokenized once, cut to what fits.
    with timer("tokenize"):
      obs_ids = tokenizer(observations, add_special_tokens=False)["input_ids"]
    for b, ids in zip(calling.tolist(), obs_ids):
      ids = cap_observation(list(ids), config.max_observation_tokens, config.observation_tail_tokens)
      room_r = int(R - resp_len[b])
      room_c = int(config.context_limit - prompt_len[b] - resp_len[b])
      room = min(room_r, room_c)
      if len(ids) < room:  # the observation fits with at least one slot left for the next action
        append_observation(b, ids)
        pending[b] = ids
      else:
        append_observation(b, ids[:room])
        finish(np.asarray([b]), EpisodeStop.RESPONSE_BUDGET if room_r <= room_c else EpisodeStop.CONTEXT_LIMIT)

  if np.any(active):
    raise RuntimeError("internal error: rows still active after the turn loop")
  with timer("detokenize"):
    response_text = tokenizer.batch_decode([response_ids[b, :resp_len[b]].tolist() for b in rows_all],
                                           skip_special_tokens=False)
  last_action = turn_last.max(axis=1)
  total = time.perf_counter() - start
  timings = {name: timer.seconds.get(name, 0.0) for name in ("generation", "tools", "detokenize", "tokenize")}
  timings["total"] = total
  timings["host"] = total - timings["generation"] - timings["tools"]  # includes detokenize and tokenize
  repeat = lambda values, fill: [v for v in (values if values is not None else [fill] * n_prompts)  # noqa: E731
                                 for _ in range(n)]
  return TrajectoryBatch(
      prompt_ids=prompt_ids,
      prompt_mask=prompt_mask,
      response_ids=response_ids,
      response_mask=response_mask,
      action_mask=action_mask,
      sampler_logprobs=logprobs,
      last_action_index=last_action.astype(np.int32),
      turn_last_action_index=turn_last,
      process_rewards=process_rewards,
      group_ids=(group_offset + np.repeat(np.arange(n_prompts), n)).astype(np.int32),
      num_turns=num_turns,
      num_tool_calls=num_calls,
      num_tool_errors=num_errors,
      stop_reason=stop,
      response_text=response_text,
      ground_truth=repeat(ground_truths, None),
      data_source=repeat(data_sources, ""),
      timings=timings,
  )
