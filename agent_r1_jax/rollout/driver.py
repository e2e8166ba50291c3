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

import time
from typing import Any, Sequence

import jax
import numpy as np

from agent_r1_jax.rollout import validation
from agent_r1_jax.rollout.batch import EpisodeStop, TrajectoryBatch
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.rollout.episode_state import EpisodeState
from agent_r1_jax.rollout.turns import (PhaseTimer, ProcessRewardFn, append_observation, apply_step_results,
                                        build_batch, cap_observation, check_and_encode, record_process_rewards,
                                        turn_budgets)
from agent_r1_jax.sampling.multihost import any_across_processes
from agent_r1_jax.sampling.params import StopReason

__all__ = ["ProcessRewardFn", "cap_observation", "run_episodes", "run_episodes_in_waves"]


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
  timer = PhaseTimer()
  start = time.perf_counter()
  episodes = check_and_encode(sampler, env, tokenizer, prompts, config, samples_per_prompt=samples_per_prompt,
                              ground_truths=ground_truths, data_sources=data_sources, check_env=check_env,
                              timer=timer)
  batch = episodes.batch_size
  prompt_ids, prompt_mask = episodes.prompt_ids, episodes.prompt_mask
  ep = EpisodeState.create(prompt_mask, config.max_response_length, config.max_turns, episodes.pad_id)
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
    budgets = turn_budgets(ep, config, np.arange(batch))
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
    record_process_rewards(ep, process_reward_fn, turn, env_rows, texts, results)
    observed = apply_step_results(ep, env_rows, results, stopped, config)
    if observed:
      with timer("tokenize"):
        obs_ids = tokenizer([obs for _, obs in observed], add_special_tokens=False)["input_ids"]
      for (b, _), ids in zip(observed, obs_ids):
        pending[b] = append_observation(ep, b, list(ids), config)

  out = build_batch(ep, episodes, tokenizer, timer, group_offset=group_offset, ground_truths=ground_truths,
                    data_sources=data_sources)
  total = time.perf_counter() - start
  timings = timer.timings(total, ("generation", "tools", "detokenize", "tokenize"), blocking=("generation", "tools"))
  out.timings = timings
  return out


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
