"""The slot engine: a rollout's episodes streamed through a fixed set of decode slots, tools running on host threads
while other slots decode (the lockstep driver, `driver.run_episodes`, stays as the reference it is tested against).

Lifecycle of a slot (N slots, `sampling.slots.SlotDecoder`; episodes are the B = prompts x samples rows, queued in
row order):

  FREE    --admit the next queued episode: reset the row, its prompt to append-->          READY
  READY   --one batched extend of every READY row's pending ids; the next turn's budget-->  DECODE
  DECODE  --decode chunks of C tokens until the turn stops (stop sequence or budget)-->      TOOL, or FREE on EOS
  TOOL    --env.batch_step on a pool thread; when it returns: the rules of `turns`-->       READY (observation to
                                                                                             append), or FREE (ended)

Each iteration of the host loop, without waiting on anything: harvests the tool calls that have returned, admits
queued episodes into free slots, runs one extend for every READY row (prefills and observations together; rows
with nothing to append are untouched), then decodes one chunk over all DECODE rows (the others masked with budget
0). Rows whose turn ended in the chunk are appended to the episode state together; their texts go to the env,
one `batch_step` per (chunk, turn) group, on a `ThreadPoolExecutor`. Only when no row can decode does the host
block, on the first tool call to return. The rollout ends when every episode has ended.

The turn, observation and ending rules are `turns`' (the lockstep driver's), applied per finished turn, and
sampling is keyed by (episode, position) (`sampling.slots`), so the trajectories do not depend on N, C or on
how long the tools take; with greedy decoding they equal the lockstep driver's.

Timings (seconds): generation (extend and decode calls, waiting for their results included), tools (summed
durations of the env calls, on whatever thread they ran, and the up-front probe), tools_blocked (wall time the host
spent blocked on tool calls: tool time not hidden behind decoding; the probe counts), detokenize, tokenize, host
(total - generation - tools_blocked), total. Stats: slot_occupancy (mean over decode chunks of the fraction of
slots decoding), decode_chunks (their number), slots (N).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import enum
import time
from typing import Any, Sequence

import jax
import numpy as np

from agent_r1_jax.rollout import validation
from agent_r1_jax.rollout.batch import EpisodeStop, TrajectoryBatch
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.rollout.episode_state import EpisodeState
from agent_r1_jax.rollout.turns import (PhaseTimer, ProcessRewardFn, append_observation, apply_step_results,
                                        build_batch, check_and_encode, record_process_rewards, turn_budgets)
from agent_r1_jax.sampling.params import SamplingParams, StopReason
from agent_r1_jax.sampling.sampler import Sampler
from agent_r1_jax.sampling.slots import Chunk, SlotDecoder


class Phase(enum.IntEnum):
  FREE = 0
  READY = 1
  DECODE = 2
  TOOL = 3


@dataclasses.dataclass(frozen=True)
class _ToolCall:
  """One env.batch_step in flight: the episodes (rows) and slots of a group of turns that ended together."""

  rows: np.ndarray
  slots: np.ndarray
  turn: int
  texts: list[str]


def _timed_step(env: Any, texts: list[str]) -> tuple[Any, float]:
  start = time.perf_counter()
  results = env.batch_step(texts)
  return results, time.perf_counter() - start


class _SlotLoop:
  """The host loop's state: the slots' phases and turn buffers over one `EpisodeState`."""

  def __init__(self, decoder: SlotDecoder, params: Any, env: Any, tokenizer: Any, episodes, ep: EpisodeState,
               config: RolloutConfig, sampling: SamplingParams, rng: jax.Array, pool, timer: PhaseTimer,
               process_reward_fn: ProcessRewardFn | None):
    n = decoder.slots
    self.decoder, self.params, self.env, self.tokenizer = decoder, params, env, tokenizer
    self.episodes, self.ep, self.config, self.sampling, self.rng = episodes, ep, config, sampling, rng
    self.pool, self.timer, self.process_reward_fn = pool, timer, process_reward_fn
    self.queue = collections.deque(range(ep.batch_size))
    self.phase = np.full(n, Phase.FREE, np.int8)
    self.episode = np.zeros(n, np.int64)  # the episode a non-FREE slot holds
    self.reset = np.zeros(n, bool)  # READY slots whose row is emptied before their append (a new episode)
    self.pending: list[list[int]] = [[] for _ in range(n)]  # READY slots' ids to append (prompt or observation)
    self.remaining = np.zeros(n, np.int64)  # DECODE slots' budget left in the current turn
    self.fresh = np.zeros(n, bool)  # DECODE slots whose turn starts with the next chunk
    self.turn_tokens: list[list[np.ndarray]] = [[] for _ in range(n)]
    self.turn_logprobs: list[list[np.ndarray]] = [[] for _ in range(n)]
    self.stopped = np.zeros(ep.batch_size, bool)  # per episode: its last turn ended on a stop sequence
    self.end_of_text = np.asarray(config.end_of_text_ids, np.int64)
    self.calls: dict[concurrent.futures.Future, _ToolCall] = {}
    self.occupancy: list[float] = []
    self.state = decoder.init()

  def run(self) -> None:
    while self.queue or (self.phase != Phase.FREE).any():
      for future in [f for f in self.calls if f.done()]:
        self._observe(future)
      self._admit()
      self._extend()
      decoding = self.phase == Phase.DECODE
      if decoding.any():
        self._decode(decoding)
      elif self.calls:
        start = time.perf_counter()
        concurrent.futures.wait(list(self.calls), return_when=concurrent.futures.FIRST_COMPLETED)
        self.timer.add("tools_blocked", time.perf_counter() - start)
      elif self.queue or (self.phase != Phase.FREE).any():
        raise RuntimeError(f"internal error: slots {self.phase.tolist()} and {len(self.queue)} queued episodes, "
                           "but nothing to decode and no tool call in flight")

  def _admit(self) -> None:
    for s in np.flatnonzero(self.phase == Phase.FREE):
      if not self.queue:
        return
      e = self.queue.popleft()
      self.phase[s], self.episode[s], self.reset[s] = Phase.READY, e, True
      self.pending[s] = self.episodes.prompts[e]

  def _extend(self) -> None:
    ready = np.flatnonzero(self.phase == Phase.READY)
    if ready.size == 0:
      return
    if any(self.pending[s] for s in ready):
      with self.timer("generation"):
        self.state = self.decoder.extend(self.params, self.state, self.pending, self.reset)
    for s in ready:
      self.pending[s] = []
    self.reset[:] = False
    self.remaining[ready] = turn_budgets(self.ep, self.config, self.episode[ready])
    self.fresh[ready] = True
    self.phase[ready] = Phase.DECODE

  def _decode(self, decoding: np.ndarray) -> None:
    budgets = np.where(decoding, self.remaining, 0)
    with self.timer("generation"):
      self.state, chunk = self.decoder.decode(self.params, self.state, budgets, self.fresh, self.episode,
                                              self.sampling, self.rng)
    self.occupancy.append(float(decoding.mean()))
    self.fresh[:] = False
    counts = chunk.counts.astype(np.int64)
    reasons = chunk.stop_reasons
    went_on = reasons == StopReason.NONE
    bad = decoding & ((counts < 1) | (counts > budgets) | (went_on & (counts != self.decoder.decode_chunk))
                      | ((reasons == StopReason.LENGTH) & (counts != budgets)))
    if bad.any() or (~decoding & (counts != 0)).any():
      raise RuntimeError(f"slot decode returned counts {counts.tolist()} and reasons {reasons.tolist()} for "
                         f"budgets {budgets.tolist()}")
    for s in np.flatnonzero(decoding):
      self.turn_tokens[s].append(chunk.tokens[s, :counts[s]])
      self.turn_logprobs[s].append(chunk.logprobs[s, :counts[s]])
    self.remaining -= counts
    self._end_turns(np.flatnonzero(decoding & ~went_on), chunk)

  def _end_turns(self, slots: np.ndarray, chunk: Chunk) -> None:
    """The turns of `slots` ended in `chunk`: appended to their episodes; EOS ends the episode, the rest go to
    the env (one batch_step per turn index among them)."""
    if slots.size == 0:
      return
    rows = self.episode[slots]
    lengths = np.asarray([sum(len(t) for t in self.turn_tokens[s]) for s in slots], np.int64)
    tokens = np.full((slots.size, int(lengths.max())), self.episodes.pad_id, np.int32)
    logprobs = np.zeros(tokens.shape, np.float32)
    for i, s in enumerate(slots):
      tokens[i, :lengths[i]] = np.concatenate(self.turn_tokens[s])
      logprobs[i, :lengths[i]] = np.concatenate(self.turn_logprobs[s])
      self.turn_tokens[s], self.turn_logprobs[s] = [], []
    turns = self.ep.num_turns[rows].copy()
    self.ep.append_segment(turns, tokens, logprobs, lengths, rows=rows)
    stopped = chunk.stop_reasons[slots] == StopReason.STOP_TOKEN
    self.stopped[rows] = stopped
    eot = stopped & np.isin(tokens[np.arange(slots.size), lengths - 1], self.end_of_text)
    self.ep.finish(rows[eot], EpisodeStop.EOS)
    self.phase[slots[eot]] = Phase.FREE
    slots, rows, tokens, lengths, turns = slots[~eot], rows[~eot], tokens[~eot], lengths[~eot], turns[~eot]
    if slots.size == 0:
      return
    with self.timer("detokenize"):
      texts = self.tokenizer.batch_decode([tokens[i, :lengths[i]].tolist() for i in range(slots.size)],
                                          skip_special_tokens=False)
    self.phase[slots] = Phase.TOOL
    for turn in np.unique(turns):
      group = np.flatnonzero(turns == turn)
      call = _ToolCall(rows[group], slots[group], int(turn), [texts[i] for i in group])
      self.calls[self.pool.submit(_timed_step, self.env, call.texts)] = call

  def _observe(self, future: concurrent.futures.Future) -> None:
    """A tool call returned: the turn rules end its episodes or queue their observations for the next extend."""
    call = self.calls.pop(future)
    results, seconds = future.result()
    self.timer.add("tools", seconds)
    validation.check_step_results(results, len(call.rows))
    record_process_rewards(self.ep, self.process_reward_fn, call.turn, call.rows, call.texts, results)
    observed = apply_step_results(self.ep, call.rows, results, self.stopped, self.config)
    sent: dict[int, list[int]] = {}
    if observed:
      with self.timer("tokenize"):
        obs_ids = self.tokenizer([obs for _, obs in observed], add_special_tokens=False)["input_ids"]
      for (b, _), ids in zip(observed, obs_ids):
        sent[b] = append_observation(self.ep, b, list(ids), self.config)
    for s, b in zip(call.slots, call.rows):
      if self.ep.active[b]:
        self.phase[s], self.pending[s] = Phase.READY, sent[int(b)]
      else:
        self.phase[s] = Phase.FREE


def run_slot_episodes(
    sampler: Sampler,
    params: Any,
    env: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[int]],
    config: RolloutConfig,
    sampling: SamplingParams,
    rng: jax.Array,
    *,
    slots_per_device: int,
    decode_chunk: int,
    samples_per_prompt: int = 1,
    ground_truths: Sequence[Any] | None = None,
    data_sources: Sequence[str] | None = None,
    group_offset: int = 0,
    process_reward_fn: ProcessRewardFn | None = None,
    check_env: bool = True,
    prepare_params: bool = True,
    tool_workers: int = 8,
) -> TrajectoryBatch:
  """One multi-turn rollout through `slots_per_device` decode slots per batch device; see the module docstring.

  Takes what `driver.run_episodes` takes (the same checks run first, with the same messages) plus:

  Args:
    sampler: a `Sampler`: its model, stop sequences, pad id, cache size, cache dtype and mesh define the slots.
    slots_per_device: decode slots per device along the mesh's batch axes (N = this x data x fsdp; without a
      mesh, N = this).
    decode_chunk: C, tokens each decode call samples per slot at most; a turn spans as many chunks as it needs.
    rng: episode e's token at context position t draws from `fold_in(fold_in(rng, e), t)` (e = its row).
    tool_workers: threads running env.batch_step; with more than one the env must accept concurrent calls (the
      `envs.BaseToolEnv` family does; a tool that keeps state across calls must guard it).

  Returns:
    The `TrajectoryBatch` of the B rows in row order (not slot order); `timings` and `stats` as in the module
    docstring.
  """
  if not isinstance(tool_workers, (int, np.integer)) or tool_workers < 1:
    raise ValueError(f"tool_workers must be a positive integer, got {tool_workers!r}")
  decoder = SlotDecoder(sampler, slots_per_device=slots_per_device, decode_chunk=decode_chunk)
  timer = PhaseTimer()
  start = time.perf_counter()
  episodes = check_and_encode(sampler, env, tokenizer, prompts, config, samples_per_prompt=samples_per_prompt,
                              ground_truths=ground_truths, data_sources=data_sources, check_env=False, timer=timer)
  if not isinstance(sampling, SamplingParams):
    raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
  if check_env:
    probe_start = time.perf_counter()
    validation.probe_env(env)
    probe = time.perf_counter() - probe_start
    timer.add("tools", probe)
    timer.add("tools_blocked", probe)
  ep = EpisodeState.create(episodes.prompt_mask, config.max_response_length, config.max_turns, episodes.pad_id)
  if prepare_params:
    with timer("generation"):
      params = sampler.prepare(params)  # cast and gathered once for every call of the rollout
  with concurrent.futures.ThreadPoolExecutor(int(tool_workers), thread_name_prefix="slot-tools") as pool:
    loop = _SlotLoop(decoder, params, env, tokenizer, episodes, ep, config, sampling, rng, pool, timer,
                     process_reward_fn)
    try:
      loop.run()
    finally:
      for future in loop.calls:
        future.cancel()
  out = build_batch(ep, episodes, tokenizer, timer, group_offset=group_offset, ground_truths=ground_truths,
                    data_sources=data_sources)
  total = time.perf_counter() - start
  names = ("generation", "tools", "tools_blocked", "detokenize", "tokenize")
  timings = {name: timer.seconds.get(name, 0.0) for name in names}
  timings["total"] = total
  timings["host"] = total - timings["generation"] - timings["tools_blocked"]  # includes detokenize and tokenize
  out.timings = timings
  out.stats = {"slot_occupancy": float(np.mean(loop.occupancy)) if loop.occupancy else 0.0,
               "decode_chunks": float(len(loop.occupancy)), "slots": float(decoder.slots)}
  return out


__all__ = ["run_slot_episodes"]
