"""Two JAX processes on 127.0.0.1 run the slot engine (`run_slot_episodes`) on one mesh spanning both.

The test launches this file twice as a script (multi-controller JAX, one CPU device per process, Gloo collectives,
`loopback_workers`). Both processes build the steered tiny policy of `test_slot_engine` in float32, a (data=2)
mesh over the two devices and a `Sampler(mesh=mesh)`: 2 slots per device, so each process streams its episodes
through its own 2 slots of the 4. Each process drives its own share of the prompts with its own tool thread pool,
and process 1's tool holds every call until its process has either joined a decode chunk with all its rows masked
or agreed that no process decodes, so the processes finish turns at different times: process 1 joins process 0's
chunks masked while its tools run, and extends at the other's bucket. (Holding instead of sleeping makes the masked
join independent of the machine's speed: a fixed sleep can end before the next chunk on a slow machine.)

References (computed here, in one process, without a mesh):
  * greedy, each process half of `GREEDY_PROMPTS` (multi-turn calls, tool errors, MAX_TURNS / ANSWER /
    CONTEXT_LIMIT endings): the two processes' rows, in process order, equal the lockstep driver's over all
    prompts (tokens, masks, log-probs, process rewards, tool counts, stop reasons, texts), on the dense cache and
    on a paged cache whose pools hold one full-length episode per device (turns wait for pages);
  * sampled (temperature 1, 3 samples per prompt), process 0 one prompt and process 1 three: the rows equal the
    single-process slot engine's over all four prompts with other slot and chunk counts, which holds only if each
    process keys its episodes by their global number.

The workers also record every slot program call: both processes made the same sequence (same kinds, same extend
buckets), and process 1 ran decode chunks with all budgets 0 while it still had episodes (waiting for its tools)
and process 0 decoded. Mismatched slot settings and overlapping episode ranges fail on both processes with a
ValueError before any program runs (instead of hanging).
"""

from __future__ import annotations

import json
import pathlib
import pickle
import sys
import threading

import numpy as np
import pytest

import loopback_workers

NUM_PROCESSES = 2
WORKER_TIMEOUT_S = 240  # hard bound on the whole two-process run (usually far less)
TOOL_HOLD_LIMIT_S = 60.0  # a held tool call that sees neither event by then is a bug in the engine's loop
SLOTS_PER_DEVICE = 2
GREEDY_CHUNK, SAMPLED_CHUNK = 2, 3
SAMPLED_SPLIT = (1, 3)  # prompts of SAMPLED_PROMPTS per process


def turn_reward(turn, rows, texts, results):
  """A process reward that depends on the turn, the (local) row and the tool's outcome."""
  del texts
  return [turn + 0.1 * r + (0.5 if ok and ok[0] else 0.0) for r, (_, ok, _) in zip(rows, results)]


def greedy_share(pid: int) -> dict:
  """Process pid's half of the greedy prompts and the arguments that make its rows global."""
  from test_slot_engine import GREEDY_PROMPTS  # pylint: disable=import-outside-toplevel
  half = len(GREEDY_PROMPTS) // NUM_PROCESSES
  part = slice(pid * half, (pid + 1) * half)
  return dict(prompts=GREEDY_PROMPTS[part], group_offset=pid * half,
              ground_truths=[f"gold {i}" for i in range(len(GREEDY_PROMPTS))][part],
              data_sources=["hotpotqa"] * half)


def sampled_share(pid: int) -> dict:
  from test_slot_engine import SAMPLED_PROMPTS  # pylint: disable=import-outside-toplevel
  start = sum(SAMPLED_SPLIT[:pid])
  return dict(prompts=SAMPLED_PROMPTS[start:start + SAMPLED_SPLIT[pid]], group_offset=start)


# --------------------------------------------------------------------------------------------------
# Worker side (runs in the child processes).


def _worker(out_dir: pathlib.Path) -> None:
  from agent_r1_jax import distributed  # pylint: disable=import-outside-toplevel

  distributed.maybe_initialize(initialization_timeout=40)
  import jax  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.rollout import run_slot_episodes  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sampling import multihost  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sampling.slots import SlotDecoder  # pylint: disable=import-outside-toplevel
  import test_slot_engine as t  # pylint: disable=import-outside-toplevel

  pid = jax.process_index()
  mesh = jax.make_mesh((2, 1, 1), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  graphdef, params = t.build_policy()
  params = jax.tree.map(lambda x: multihost.replicated(np.asarray(x), mesh), params)
  config = t.rollout_config()
  sampler = t.make_sampler(graphdef, config, mesh)

  # Events of this process's host loop that release a held tool call: a decode chunk joined with all budgets 0, or
  # an agreement that no process decodes (then nothing can happen until a tool returns).
  released = threading.Condition()
  releases = [0]

  def release() -> None:
    with released:
      releases[0] += 1
      released.notify_all()

  class HeldEnv(t.SteerEnv):
    def batch_step(self, texts):
      if threading.current_thread() is threading.main_thread():  # the up-front probe (check_env), before the loop
        return super().batch_step(texts)
      with released:
        seen = releases[0]
        if not released.wait_for(lambda: releases[0] > seen, timeout=TOOL_HOLD_LIMIT_S):
          raise RuntimeError("held tool call: no masked chunk and no idle agreement")
      return super().batch_step(texts)

  # Every slot program call of this process: ("extend", (longest append, busiest device), None) /
  # ("decode", busiest device, sum of this process's budgets); the first two must match across processes.
  calls: list[tuple] = []
  extend, decode, agreed_max = SlotDecoder.extend, SlotDecoder.decode, multihost.agreed_max

  def recorded_extend(self, params, state, rows, reset, *, extend_length=None, busiest=None):
    calls.append(("extend", (extend_length, busiest), None))
    return extend(self, params, state, rows, reset, extend_length=extend_length, busiest=busiest)

  def recorded_decode(self, params, state, budgets, *args, busiest=None):
    calls.append(("decode", busiest, int(np.sum(budgets))))
    out = decode(self, params, state, budgets, *args, busiest=busiest)
    if not np.any(budgets):
      release()
    return out

  def observed_agreement(values):
    agreed = agreed_max(values)
    if len(agreed) == 5 and not agreed[1]:  # the slot engine's agreement: [append, any decode, any left, ...]
      release()
    return agreed

  SlotDecoder.extend, SlotDecoder.decode, multihost.agreed_max = recorded_extend, recorded_decode, observed_agreement
  env = lambda: t.SteerEnv() if pid == 0 else HeldEnv()  # noqa: E731
  out = {}

  # Misconfigured calls fail on both processes before any slot program (one all-gather, no hang).
  share = greedy_share(pid)
  errors = []
  for kwargs in (dict(slots_per_device=SLOTS_PER_DEVICE, decode_chunk=GREEDY_CHUNK + pid, group_offset=0),
                 dict(slots_per_device=SLOTS_PER_DEVICE, decode_chunk=GREEDY_CHUNK, group_offset=0)):
    try:
      run_slot_episodes(sampler, params, env(), t.TOK, share["prompts"], config, t.GREEDY, jax.random.key(0),
                        check_env=False, **kwargs)
      errors.append(None)
    except ValueError as e:
      errors.append(str(e))
  out["errors"], out["calls_before_runs"] = errors, list(calls)

  calls.clear()
  batch = run_slot_episodes(sampler, params, env(), t.TOK, share["prompts"], config, t.GREEDY, jax.random.key(0),
                            slots_per_device=SLOTS_PER_DEVICE, decode_chunk=GREEDY_CHUNK,
                            group_offset=share["group_offset"], ground_truths=share["ground_truths"],
                            data_sources=share["data_sources"], process_reward_fn=turn_reward)
  out["greedy"] = dict(batch=batch, calls=list(calls))

  # The same on the paged cache, with a pool of one full-length episode per device: turns wait for pages.
  from agent_r1_jax.sampling.paging import PagingConfig  # pylint: disable=import-outside-toplevel
  calls.clear()
  batch = run_slot_episodes(sampler, params, env(), t.TOK, share["prompts"], config, t.GREEDY, jax.random.key(0),
                            slots_per_device=SLOTS_PER_DEVICE, decode_chunk=GREEDY_CHUNK,
                            group_offset=share["group_offset"], ground_truths=share["ground_truths"],
                            data_sources=share["data_sources"], process_reward_fn=turn_reward, check_env=False,
                            paging=PagingConfig(page_size=8, pages_per_device=34))
  out["greedy_paged"] = dict(batch=batch, calls=list(calls))

  calls.clear()
  share = sampled_share(pid)
  batch = run_slot_episodes(sampler, params, env(), t.TOK, share["prompts"], config, t.SAMPLED, jax.random.key(3),
                            samples_per_prompt=3, slots_per_device=SLOTS_PER_DEVICE, decode_chunk=SAMPLED_CHUNK,
                            group_offset=share["group_offset"], check_env=False)
  out["sampled"] = dict(batch=batch, calls=list(calls))
  with open(out_dir / f"result_{pid}.pkl", "wb") as f:
    pickle.dump(out, f)
  (out_dir / f"report_{pid}.json").write_text(json.dumps(
      {"process_count": jax.process_count(), "global_devices": len(jax.devices())}))


# --------------------------------------------------------------------------------------------------
# Test side (the parent process).


def _check_calls(runs: list[dict], name: str) -> None:
  """Both processes made the same program calls with the same shapes (append length, compacted width); process 1
  joined chunks masked while it waited for tools."""
  shapes = [[(kind, shape) for kind, shape, _ in run["calls"]] for run in runs]
  assert shapes[0] == shapes[1], f"{name}: the processes' slot program sequences differ"
  decodes = [[budget for kind, _, budget in run["calls"] if kind == "decode"] for run in runs]
  assert len(decodes[0]) == runs[0]["batch"].stats["decode_chunks"] == runs[1]["batch"].stats["decode_chunks"]
  assert all(shape[0] > 0 for kind, shape, _ in runs[0]["calls"] if kind == "extend")  # no extend of nothing
  # Both widths occur: one row per device (compacted) and both slots.
  assert {shape for kind, shape, _ in runs[0]["calls"] if kind == "decode"} == {1, 2}, name
  last_own = max(i for i, budget in enumerate(decodes[1]) if budget > 0)
  masked = [i for i in range(last_own) if decodes[1][i] == 0 and decodes[0][i] > 0]
  assert masked, (f"{name}: process 1 never joined process 0's chunk with its rows masked while it had episodes "
                 f"(decode budgets per chunk, process 0: {decodes[0]}, process 1: {decodes[1]})")


def _global_rows(fn):
  """`fn` as the processes' rollouts call it (rows numbered within each process's half of the prompts)."""
  from test_slot_engine import GREEDY_PROMPTS  # pylint: disable=import-outside-toplevel
  half = len(GREEDY_PROMPTS) // NUM_PROCESSES
  return lambda turn, rows, texts, results: fn(turn, rows % half, texts, results)


@pytest.mark.slow
def test_two_processes_sample_the_one_process_episodes(tmp_path):
  import jax  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.rollout import EpisodeStop, TrajectoryBatch, run_episodes, run_slot_episodes  # pylint: disable=import-outside-toplevel
  import test_slot_engine as t  # pylint: disable=import-outside-toplevel

  loopback_workers.run_workers(__file__, tmp_path, num_processes=NUM_PROCESSES, timeout_s=WORKER_TIMEOUT_S)
  results = []
  for pid in range(NUM_PROCESSES):
    report = json.loads((tmp_path / f"report_{pid}.json").read_text())
    assert report == {"process_count": NUM_PROCESSES, "global_devices": NUM_PROCESSES}
    with open(tmp_path / f"result_{pid}.pkl", "rb") as f:
      results.append(pickle.load(f))

  # Misconfigurations: both processes raise, and nothing was compiled or run for them.
  for r in results:
    chunk_error, overlap_error = r["errors"]
    assert chunk_error is not None and "same decode_chunk" in chunk_error, chunk_error
    assert overlap_error is not None and "overlapping episode ranges" in overlap_error, overlap_error
    assert r["calls_before_runs"] == []

  graphdef, params = t.build_policy()
  config = t.rollout_config()
  sampler = t.make_sampler(graphdef, config)

  # Greedy: the lockstep driver over all prompts, in one process.
  everything = t.GREEDY_PROMPTS
  want = run_episodes(sampler, params, t.SteerEnv(), t.TOK, everything, config, t.GREEDY, jax.random.key(0),
                      ground_truths=[f"gold {i}" for i in range(len(everything))],
                      data_sources=["hotpotqa"] * len(everything), process_reward_fn=_global_rows(turn_reward))
  # The reference has what the equality must hold for, on both processes' halves.
  half = len(everything) // 2
  for rows in (slice(0, half), slice(half, None)):
    assert (want.num_turns[rows] > 1).any() and (want.num_tool_errors[rows] > 0).any()
  reasons = set(want.stop_reason.tolist())
  assert {EpisodeStop.MAX_TURNS, EpisodeStop.ANSWER, EpisodeStop.CONTEXT_LIMIT} <= reasons, reasons
  runs = [r["greedy"] for r in results]
  for pid, run in enumerate(runs):
    assert run["batch"].stats["slots"] == SLOTS_PER_DEVICE and run["batch"].batch_size == half
    assert run["batch"].timings["sync"] >= 0
  t.assert_same_trajectories(TrajectoryBatch.concatenate([run["batch"] for run in runs]), want, logprob_atol=2e-5)
  _check_calls(runs, "greedy")
  paged = [r["greedy_paged"] for r in results]
  t.assert_same_trajectories(TrajectoryBatch.concatenate([run["batch"] for run in paged]), want, logprob_atol=2e-5)
  shapes = [[(kind, shape) for kind, shape, _ in run["calls"]] for run in paged]
  assert shapes[0] == shapes[1], "paged: the processes' slot program sequences differ"

  # Sampled: the single-process slot engine over all prompts, with other slot and chunk counts.
  want = run_slot_episodes(sampler, params, t.SteerEnv(), t.TOK, t.SAMPLED_PROMPTS, config, t.SAMPLED,
                           jax.random.key(3), samples_per_prompt=3, slots_per_device=5, decode_chunk=7)
  runs = [r["sampled"] for r in results]
  assert [run["batch"].batch_size for run in runs] == [3 * n for n in SAMPLED_SPLIT]
  assert len(set(want.response_text)) > 3  # the samples differ: the keys matter
  t.assert_same_trajectories(TrajectoryBatch.concatenate([run["batch"] for run in runs]), want, logprob_atol=2e-5)
  _check_calls(runs, "sampled")


if __name__ == "__main__":
  _worker(pathlib.Path(sys.argv[1]))
