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
0); both calls compute only the rows taking part, gathered into a power-of-two width (`SlotDecoder`). Rows whose
turn ended in the chunk are appended to the episode state together; their texts go to the env, one `batch_step`
per (chunk, turn) group, on a `ThreadPoolExecutor`. Only when no row can decode does the host
block, on the first tool call to return. The rollout ends when every episode has ended.

Multi-process (a mesh spanning P processes, multi-controller JAX): each process runs this loop over its own
episodes (its prompts' rows) in its own n = N / P slots, with its own tool pool, and every process calls the same
sequence of jitted programs with the same shapes, so they stay collective. Per iteration, after harvesting and
admitting (local), the processes agree on five numbers with one small all-gather (`multihost.agreed_max`):

  * the longest pending append of any process (0: no extend this iteration; else every process runs the extend
    program at that bucket, one whose slots append nothing joining with empty, not-reset rows);
  * whether any process has a slot to decode (then every process runs the decode chunk, one with none with all
    budgets 0);
  * whether any process has an episode left (queued, or in a slot); the loop ends when none has;
  * the most rows any batch device appends and decodes, so that every process compacts the extend and the chunk
    to the same width (`SlotDecoder.compact_width`; admission spreads episodes over the devices to keep it low).

A process waiting for its tools therefore never blocks a collective: while another decodes, it joins the chunk
with its rows masked and harvests its tool calls between chunks. When no process decodes, a process with tool
calls in flight waits for one to return for at most `tool_poll_s` before the next agreement (so a process whose
tool returned first is not held up by another's slower tool), and one with none goes straight to the next
agreement, which waits for the others. With one process the agreement is local (no communication) and the wait
is for the first call to return. Before the loop the processes check once (one all-gather) that they run the same
slots_per_device and decode_chunk and that their episode ranges do not overlap.

Collective calls, in order, the same on every process: per rollout the check's all-gather, `Sampler.prepare` (unless
prepare_params=False) and the slots' init; per iteration the agreement, then the extend (iff the agreed length is
> 0), then the decode chunk (iff any process decodes). An exception on one process (a user error, an env that
raises) leaves the others waiting in their next collective, as in the lockstep driver.

The turn, observation and ending rules are `turns`' (the lockstep driver's), applied per finished turn, and
sampling is keyed by (episode, position) (`sampling.slots`), so the trajectories do not depend on N, C or on
how long the tools take, nor on how the episodes are split over processes (episode e of the keys is the
global row: `episode_offset` + the local row); with greedy decoding they equal the lockstep driver's.

Timings (seconds): generation (extend and decode calls, waiting for their results included), tools (summed
durations of the env calls, on whatever thread they ran, and the up-front probe), tools_blocked (wall time the host
spent blocked on tool calls: tool time not hidden behind decoding; the probe counts), sync (the cross-process
agreements, waiting for the other processes included; ~0 with one process), detokenize, tokenize, host (total -
generation - tools_blocked - sync), total. Stats: slot_occupancy (mean over the decode chunks this process ran,
masked ones included, of the fraction of its slots decoding), decode_chunks (their number), slots (n, this
process's slots), preemptions (paged cache: episodes whose pages were taken back to let an older one go on).
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
                                        build_batch, check_and_encode, record_process_rewards, timed_batch_step,
                                        turn_budgets)
from agent_r1_jax.sampling import multihost
from agent_r1_jax.sampling.paging import PagingConfig
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


class _SlotLoop:
  """The host loop's state: the slots' phases and turn buffers over one `EpisodeState`."""

  def __init__(self, decoder: SlotDecoder, params: Any, env: Any, tokenizer: Any, episodes, ep: EpisodeState,
               config: RolloutConfig, sampling: SamplingParams, rng: jax.Array, pool, timer: PhaseTimer,
               process_reward_fn: ProcessRewardFn | None, *, episode_offset: int, tool_poll_s: float):
    n = decoder.slots
    self.decoder, self.params, self.env, self.tokenizer = decoder, params, env, tokenizer
    self.episodes, self.ep, self.config, self.sampling, self.rng = episodes, ep, config, sampling, rng
    self.pool, self.timer, self.process_reward_fn = pool, timer, process_reward_fn
    self.episode_offset, self.tool_poll_s = episode_offset, tool_poll_s
    self.multiprocess = jax.process_count() > 1
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
    self.granted = np.zeros(n, bool)  # READY slots whose append and next turn have their pages (always, dense)
    self.admitted = np.zeros(n, np.int64)  # admission order of the episode each slot holds (oldest first)
    self.admissions = 0
    self.preemptions = 0
    self.state = decoder.init()

  def _unfinished(self) -> bool:
    return bool(self.queue) or bool((self.phase != Phase.FREE).any())

  def run(self) -> None:
    """Iterations until no process has an episode left; each runs, on every process, one agreement and then the
    same programs (an extend at the agreed bucket if any process appends, a decode chunk if any decodes)."""
    while True:
      for future in [f for f in self.calls if f.done()]:
        self._observe(future)
      self._admit()
      self._grant()
      ready = np.flatnonzero((self.phase == Phase.READY) & self.granted)
      longest = max((len(self.pending[s]) for s in ready), default=0)
      decoding = (self.phase == Phase.DECODE) | ((self.phase == Phase.READY) & self.granted)  # extended, they decode
      with self.timer("sync"):
        extend_length, any_decode, any_left, extend_busiest, decode_busiest = (int(v) for v in multihost.agreed_max(
            [longest, decoding.any(), self._unfinished(), self.decoder.busiest((self.phase == Phase.READY) & self.granted),
             self.decoder.busiest(decoding)]))
      if not any_left:
        return
      self._extend(ready, extend_length, extend_busiest)
      if any_decode:
        self._decode(self.phase == Phase.DECODE, decode_busiest)
      elif self.calls:
        start = time.perf_counter()
        concurrent.futures.wait(list(self.calls), timeout=self.tool_poll_s if self.multiprocess else None,
                                return_when=concurrent.futures.FIRST_COMPLETED)
        self.timer.add("tools_blocked", time.perf_counter() - start)
      elif self._unfinished():
        raise RuntimeError(f"internal error: slots {self.phase.tolist()} and {len(self.queue)} queued episodes, "
                           "but nothing to decode and no tool call in flight")

  def _admit(self) -> None:
    """Queued episodes into free slots, each on the batch device holding the fewest episodes (the lowest free slot
    there): a call's compacted width is set by its busiest device, and a device's rows are its share of the work."""
    per_device = (self.phase != Phase.FREE).reshape(-1, self.decoder.slots_per_device)
    held = per_device.sum(axis=1)
    while self.queue and not per_device.all():
      device = int(np.argmin(np.where(per_device.all(axis=1), np.iinfo(np.int64).max, held)))
      s = device * self.decoder.slots_per_device + int(np.argmin(per_device[device]))
      per_device[device, s % self.decoder.slots_per_device] = True
      held[device] += 1
      e = self.queue.popleft()
      self.phase[s], self.episode[s], self.reset[s] = Phase.READY, e, True
      self.pending[s] = self.episodes.prompts[e]
      self.admitted[s], self.admissions = self.admissions, self.admissions + 1

  def _grant(self) -> None:
    """Paged cache: READY slots, oldest episode first, take the pages of their append and of their next turn's whole
    budget (a turn never waits mid-way), or wait. If nothing can move (no slot decoding or granted, no tool call in
    flight), the youngest waiting episode holding pages on the oldest's device is preempted: its pages go back and
    its whole context is appended again (recomputed) once granted; a pool holds one full-length episode, so the
    oldest always goes on. Dense: every READY slot is granted."""
    ready = self.phase == Phase.READY
    self.granted = ready.copy() if self.decoder.pages is None else self.granted & ready
    if self.decoder.pages is None:
      return
    waiting = sorted(np.flatnonzero(ready & ~self.granted), key=lambda s: self.admitted[s])
    budgets = turn_budgets(self.ep, self.config, self.episode[waiting]) if waiting else []
    for s, budget in zip(waiting, budgets):
      context = (0 if self.reset[s] else self.state.host_lengths[s]) + len(self.pending[s])
      self.granted[s] = self.decoder.reserve(int(s), int(context + budget))
    if self.granted.any() or (self.phase == Phase.DECODE).any() or self.calls or not waiting:
      return
    device = waiting[0] // self.decoder.slots_per_device  # the oldest waiting episode's: free pages there
    holding = [s for s in waiting[1:] if self.decoder.pages.held[s] and s // self.decoder.slots_per_device == device]
    if holding:
      victim = max(holding, key=lambda s: self.admitted[s])
      e = self.episode[victim]
      self.decoder.trim(int(victim), 0)
      self.reset[victim], self.preemptions = True, self.preemptions + 1
      self.pending[victim] = list(self.episodes.prompts[e]) + self.ep.response_ids[e, :self.ep.length[e]].tolist()
      self._grant()

  def _extend(self, ready: np.ndarray, extend_length: int, busiest: int) -> None:
    """Every process calls this each iteration with the agreed `extend_length`: the extend program runs on all
    of them when it is > 0 (this process's READY rows append their pending ids, its other rows nothing), on none
    when it is 0; then this process's READY slots start their turn."""
    if extend_length > 0:
      rows = [self.pending[s] if self.granted[s] else [] for s in range(self.decoder.slots)]
      with self.timer("generation"):
        self.state = self.decoder.extend(self.params, self.state, rows, self.reset & self.granted,
                                         extend_length=extend_length, busiest=busiest)
    if ready.size == 0:
      return
    for s in ready:
      self.pending[s] = []
    self.reset[ready], self.granted[ready] = False, False
    self.remaining[ready] = turn_budgets(self.ep, self.config, self.episode[ready])
    self.fresh[ready] = True
    self.phase[ready] = Phase.DECODE

  def _decode(self, decoding: np.ndarray, busiest: int) -> None:
    """One decode chunk, run by every process when any decodes: this process's `decoding` slots sample (keyed by
    their global episode), the rest are masked with budget 0 (all of them when it has nothing to decode)."""
    budgets = np.where(decoding, self.remaining, 0)
    with self.timer("generation"):
      self.state, chunk = self.decoder.decode(self.params, self.state, budgets, self.fresh,
                                              self.episode_offset + self.episode, self.sampling, self.rng,
                                              busiest=busiest)
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
    for s in slots:  # the turn's unused pages (all of them at the episode's end) go back
      self.decoder.trim(int(s), 0 if self.phase[s] == Phase.FREE else int(self.state.host_lengths[s]))
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
      self.calls[self.pool.submit(timed_batch_step, self.env, call.texts)] = call

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
        self.decoder.trim(int(s), 0)


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
    episode_offset: int | None = None,
    tool_poll_s: float = 0.005,
    paging: PagingConfig | None = None,
) -> TrajectoryBatch:
  """One multi-turn rollout through `slots_per_device` decode slots per batch device; see the module docstring.

  Takes what `driver.run_episodes` takes (the same checks run first, with the same messages) plus:

  Args:
    sampler: a `Sampler`: its model, stop sequences, pad id, cache size, cache dtype and mesh define the slots.
    slots_per_device: decode slots per device along the mesh's batch axes (N = this x data x fsdp; without a
      mesh, N = this).
    decode_chunk: C, tokens each decode call samples per slot at most; a turn spans as many chunks as it needs.
    rng: episode e's token at context position t draws from `fold_in(fold_in(rng, e), t)`, e = episode_offset +
      its row; the same key on every process.
    tool_workers: threads running env.batch_step; with more than one the env must accept concurrent calls (the
      `envs.BaseToolEnv` family does; a tool that keeps state across calls must guard it).
    episode_offset: the global number of this call's first row; default group_offset x samples_per_prompt, the
      global row when `group_offset` is the global number of the first prompt (as a multi-process caller passes
      it), so P processes over consecutive shares of the prompts sample what one process samples over all.
    tool_poll_s: multi-process only: when no process decodes, how long a process waits for its own tool calls
      before agreeing again with the others.
    paging: a paged KV cache (`sampling.paging.PagingConfig`; pages per slot as its episode grows, admission to a
      turn waiting for pages, see `_SlotLoop._grant`), or None for the dense cache (every slot at full length).

  Multi-process: every process calls this with the same sampler settings, slots_per_device, decode_chunk,
  sampling and rng, and its own prompts (any number; episode ranges must not overlap); see the module docstring.

  Returns:
    The `TrajectoryBatch` of this process's B rows in row order (not slot order); `timings` and `stats` as in the
    module docstring.
  """
  if episode_offset is None:
    episode_offset = group_offset * samples_per_prompt
  validation.check_slot_arguments(tool_workers, tool_poll_s, episode_offset)
  decoder = SlotDecoder(sampler, slots_per_device=slots_per_device, decode_chunk=decode_chunk, paging=paging)
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
  validation.check_slot_processes(int(slots_per_device), decoder.decode_chunk, int(episode_offset),
                                  episodes.batch_size)
  ep = EpisodeState.create(episodes.prompt_mask, config.max_response_length, config.max_turns, episodes.pad_id)
  if prepare_params:
    with timer("generation"):
      params = sampler.prepare(params)  # cast and gathered once for every call of the rollout
  with concurrent.futures.ThreadPoolExecutor(int(tool_workers), thread_name_prefix="slot-tools") as pool:
    loop = _SlotLoop(decoder, params, env, tokenizer, episodes, ep, config, sampling, rng, pool, timer,
                     process_reward_fn, episode_offset=int(episode_offset), tool_poll_s=float(tool_poll_s))
    try:
      loop.run()
    finally:
      for future in loop.calls:
        future.cancel()
  out = build_batch(ep, episodes, tokenizer, timer, group_offset=group_offset, ground_truths=ground_truths,
                    data_sources=data_sources)
  out.timings = timer.timings(time.perf_counter() - start, ("generation", "tools", "tools_blocked", "sync",
                                                            "detokenize", "tokenize"),
                              blocking=("generation", "tools_blocked", "sync"))
  out.stats = {"slot_occupancy": float(np.mean(loop.occupancy)) if loop.occupancy else 0.0,
               "decode_chunks": float(len(loop.occupancy)), "slots": float(decoder.slots),
               "preemptions": float(loop.preemptions)}
  return out


__all__ = ["run_slot_episodes"]
