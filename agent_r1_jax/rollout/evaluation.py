"""Greedy evaluation of a policy with the same rollout driver and scorer as training (no second code path).

`evaluate_examples` runs batched greedy episodes over a list of examples and scores each trajectory with the
reward function registered for its `data_source`; `summarize` turns the per-example records into the metrics
of one data source (EM, F1, substring accuracy, format, reward, turns, tool-call and tool-error rates).
Each record also keeps its response cut into action / observation segments, taken from the rollout's
token-level `action_mask` (not from parsing the text), for the sample-trajectory page.

Two engines play the episodes, as `rollout.engine` picks for training: the slot engine (`slot_options`, the
default of every preset: `sizing.rollout_sizing.evaluation_slot_options`) streams the examples through its slots,
each episode keyed by its example's index, so the records do not depend on the batch size or on how many
processes play; the lockstep driver (`slot_options=None`) plays batches of `batch_size` prompts.

Multi-host (P > 1 processes of one JAX job, each holding the same examples): the examples are dealt to the
processes (slot engine: consecutive shares of each window of examples; lockstep: example i to process i mod P) and
every process returns all records in example order (`gather_records`), so the summaries are the same on every
process and, with greedy decoding, equal to one process's.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from agent_r1_jax.rewards import get_scorer
from agent_r1_jax.rollout import RolloutConfig, TrajectoryBatch, run_episodes, run_slot_episodes
from agent_r1_jax.sampling import multihost

RECORD_METRICS = ("score", "em", "f1", "substring_acc", "format", "format_answer", "format_tool")
ACTION, OBSERVATION = "action", "observation"
# The slot engine plays the examples in windows of this many batches (`batch_size` prompts each): a window's
# episodes stream through the slots together, so it bounds the host's trajectory arrays, not the device's cache.
SLOT_WINDOW_BATCHES = 8


@dataclasses.dataclass
class EpisodeRecord:
  """One scored trajectory (kept for tables and the sample-trajectory page)."""
  example_id: str
  data_source: str
  question: str
  answers: list[str]
  prompt: str
  response: str
  scores: dict[str, Any]
  num_turns: int
  num_tool_calls: int
  num_tool_errors: int
  stop_reason: int
  # (kind, text) in response order, kind ACTION (sampled by the policy) or OBSERVATION (written by the env).
  segments: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  question_type: str = ""  # the example's `type` (bridge, comparison, ...; "" where the data set has none)


def response_spans(response_mask: np.ndarray, action_mask: np.ndarray) -> list[tuple[str, int, int]]:
  """Maximal runs of one response row with a constant action mask: `(kind, start, end)`, end exclusive.

  Args:
    response_mask: int [R], 1 on the row's real response tokens (a prefix: responses are right-padded).
    action_mask: int [R], 1 on the tokens the policy sampled.

  Returns:
    Consecutive spans covering `[0, sum(response_mask))`; kind is ACTION where action_mask is 1, else
    OBSERVATION. Adjacent spans always differ in kind.
  """
  length = int(np.sum(response_mask))
  acts = np.asarray(action_mask[:length]).astype(bool)
  if length == 0:
    return []
  cuts = np.flatnonzero(acts[1:] != acts[:-1]) + 1
  bounds = np.concatenate([[0], cuts, [length]])
  return [(ACTION if acts[a] else OBSERVATION, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def response_segments(batch: TrajectoryBatch, row: int, tokenizer: Any) -> list[tuple[str, str]]:
  """`(kind, decoded text)` of each span of `response_spans` for one row (special tokens kept)."""
  spans = response_spans(batch.response_mask[row], batch.action_mask[row])
  texts = tokenizer.batch_decode([batch.response_ids[row, a:b].tolist() for _, a, b in spans],
                                 skip_special_tokens=False) if spans else []
  return [(kind, text) for (kind, _, _), text in zip(spans, texts)]


def score_batch(batch: TrajectoryBatch, *, reward_style: str = "paper") -> list[dict[str, Any]]:
  """The scorer of each row's data source applied to its decoded response text."""
  scorers: dict[str, Callable] = {}
  out = []
  for text, truth, source in zip(batch.response_text, batch.ground_truth, batch.data_source):
    if source not in scorers:
      scorers[source] = get_scorer(source, style=reward_style)
    out.append(scorers[source](text, truth))
  return out


def evaluate_examples(sampler: Any, params: Any, env: Any, tokenizer: Any, render: Callable[[Mapping], str],
                      examples: Sequence[Mapping[str, Any]], rollout_config: RolloutConfig, sampling: Any,
                      rng: jax.Array, *, batch_size: int, reward_style: str = "paper",
                      slot_options: Mapping[str, Any] | None = None) -> list[EpisodeRecord]:
  """Greedy (or as `sampling` says) episodes for every example; every process returns all n records in example
  order.

  Slot engine (`slot_options`: `run_slot_episodes`' slots_per_device, decode_chunk, tool_workers, as
  `sizing.rollout_sizing.evaluation_slot_options` sizes them from `batch_size`): the examples go in windows of
  W = `SLOT_WINDOW_BATCHES` x `batch_size`; with P processes the window [s, s + L) gives process p the consecutive
  share [s + floor(p L / P), s + floor((p + 1) L / P)), and each process streams its share through its slots in one
  `run_slot_episodes` call with `rng`, example i keyed as episode i (`group_offset` = its share's start). Sampling
  is keyed by (episode, position), so a record depends only on its example, `rng` and `sampling`: not on
  `batch_size`, the slots, W or P. A process whose share is empty (L < P) plays example s as a padding episode
  keyed n + p, its record dropped, so that every process makes the same calls.

  Lockstep (`slot_options` None): process p plays examples i = j P + p for j < m = ceil(n / P) (an i >= n
  replays example i mod n, its record dropped) in rollouts of b = ceil(batch_size / P) prompts, so all processes
  issue the same sampler calls with as many rows; their c-th rollout together holds examples [c b P, (c + 1) b P),
  one process's c-th rollout whenever P divides `batch_size`. Rollout c draws `fold_in(rng, c b P)`.

  Raises:
    ValueError: the processes were given different examples or batch sizes.
  """
  processes, me = jax.process_count(), jax.process_index()
  n = len(examples)
  if processes > 1:
    ids = zlib.crc32("\n".join(str(ex["id"]) for ex in examples).encode())
    agreed = multihost.gather_across_processes([n, batch_size, ids])
    if (agreed != agreed[0]).any():
      raise ValueError(f"the processes evaluate different examples or batch sizes ([n, batch_size, crc32 of the "
                       f"ids] per process: {agreed.tolist()}); every process must load the same evaluation set")
  if slot_options is not None:
    return _play_slots(sampler, params, env, tokenizer, render, examples, rollout_config, sampling, rng,
                       batch_size=batch_size, reward_style=reward_style, slot_options=slot_options)
  if processes == 1:
    return _play(sampler, params, env, tokenizer, render, examples, rollout_config, sampling, rng,
                 batch_size=batch_size, reward_style=reward_style)
  if n == 0:
    return []
  order = [j * processes + me for j in range(-(-n // processes))]
  played = _play(sampler, params, env, tokenizer, render, [examples[i % n] for i in order], rollout_config,
                 sampling, rng, batch_size=-(-batch_size // processes), reward_style=reward_style,
                 rng_stride=processes)
  return gather_records([r for i, r in zip(order, played) if i < n])


def _play_slots(sampler: Any, params: Any, env: Any, tokenizer: Any, render: Callable[[Mapping], str],
                examples: Sequence[Mapping[str, Any]], rollout_config: RolloutConfig, sampling: Any, rng: jax.Array,
                *, batch_size: int, reward_style: str, slot_options: Mapping[str, Any]) -> list[EpisodeRecord]:
  """`evaluate_examples` on the slot engine: this process's shares of each window, then every process's records
  gathered in example order."""
  processes, me = jax.process_count(), jax.process_index()
  n = len(examples)
  if batch_size < 1:
    raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
  if n == 0:
    return []
  window = SLOT_WINDOW_BATCHES * batch_size
  mine: list[EpisodeRecord] = []
  for start in range(0, n, window):
    size = min(window, n - start)
    first, last = start + me * size // processes, start + (me + 1) * size // processes
    share = list(range(first, last))
    played = share or [start]  # an empty share plays a padding episode keyed n + me (dropped)
    chunk = [examples[i] for i in played]
    prompts = [render(ex) for ex in chunk]
    batch = run_slot_episodes(sampler, params, env, tokenizer, prompts, rollout_config, sampling, rng,
                              **slot_options, samples_per_prompt=1, group_offset=first if share else n + me,
                              ground_truths=[list(ex["answers"]) for ex in chunk],
                              data_sources=[ex["data_source"] for ex in chunk], check_env=start == 0)
    if share:
      mine.extend(_records(chunk, prompts, batch, tokenizer, reward_style))
  if processes == 1:
    return mine
  every = gather_bytes(json.dumps([dataclasses.asdict(r) for r in mine]).encode())
  # Process p's records are its shares of the windows in order; the windows' shares, by process, tile [0, n).
  per_process = [[record_from_dict(d) for d in json.loads(b)] for b in every]
  out: list[EpisodeRecord] = []
  taken = [0] * processes
  for start in range(0, n, window):
    size = min(window, n - start)
    for p in range(processes):
      count = (p + 1) * size // processes - p * size // processes
      out.extend(per_process[p][taken[p]:taken[p] + count])
      taken[p] += count
  return out


def _records(chunk: Sequence[Mapping[str, Any]], prompts: Sequence[str], batch: TrajectoryBatch, tokenizer: Any,
             reward_style: str) -> list[EpisodeRecord]:
  """One scored `EpisodeRecord` per row of `batch`, row i being the episode of `chunk[i]` (prompt `prompts[i]`)."""
  records = []
  for i, (ex, scores) in enumerate(zip(chunk, score_batch(batch, reward_style=reward_style))):
    records.append(EpisodeRecord(
        example_id=str(ex["id"]), data_source=ex["data_source"], question=ex["question"],
        answers=list(ex["answers"]), prompt=prompts[i], response=batch.response_text[i], scores=scores,
        num_turns=int(batch.num_turns[i]), num_tool_calls=int(batch.num_tool_calls[i]),
        num_tool_errors=int(batch.num_tool_errors[i]), stop_reason=int(batch.stop_reason[i]),
        segments=response_segments(batch, i, tokenizer), question_type=str(ex.get("type") or "")))
  return records


def _play(sampler: Any, params: Any, env: Any, tokenizer: Any, render: Callable[[Mapping], str],
          examples: Sequence[Mapping[str, Any]], rollout_config: RolloutConfig, sampling: Any, rng: jax.Array, *,
          batch_size: int, reward_style: str, rng_stride: int = 1) -> list[EpisodeRecord]:
  """This process's episodes of `examples`, `batch_size` per rollout; rollout at `start` draws
  `fold_in(rng, start * rng_stride)`."""
  records: list[EpisodeRecord] = []
  for start in range(0, len(examples), batch_size):
    chunk = [examples[i] for i in range(start, min(start + batch_size, len(examples)))]
    prompts = [render(ex) for ex in chunk]
    batch = run_episodes(sampler, params, env, tokenizer, prompts, rollout_config, sampling,
                         jax.random.fold_in(rng, start * rng_stride), samples_per_prompt=1,
                         ground_truths=[list(ex["answers"]) for ex in chunk],
                         data_sources=[ex["data_source"] for ex in chunk], check_env=start == 0)
    records.extend(_records(chunk, prompts, batch, tokenizer, reward_style))
  return records


def record_from_dict(d: Mapping[str, Any]) -> EpisodeRecord:
  """The inverse of `dataclasses.asdict` on an `EpisodeRecord` that went through JSON (segments are tuples)."""
  return EpisodeRecord(**{**d, "segments": [tuple(s) for s in d["segments"]]})


def gather_records(local: Sequence[EpisodeRecord]) -> list[EpisodeRecord]:
  """Every process's records, interleaved: record i of the result is record i // P of process i mod P (the
  order `evaluate_examples` deals examples in on the lockstep driver). A collective: every process calls it, with m or m - 1
  records (process p holds records p, p + P, ...)."""
  blobs = gather_bytes(json.dumps([dataclasses.asdict(r) for r in local]).encode())
  per_process = [[record_from_dict(d) for d in json.loads(b)] for b in blobs]
  total = sum(len(p) for p in per_process)
  return [per_process[i % len(blobs)][i // len(blobs)] for i in range(total)]


def gather_bytes(payload: bytes) -> list[bytes]:
  """Each process's `payload`, by process index (two `process_allgather`s: the lengths, then the bytes padded
  to a power of two of at least 1 KiB, so a handful of sizes compile)."""
  sizes = multihost.gather_across_processes([len(payload)])[:, 0]
  width = max(1024, 1 << int(sizes.max() - 1).bit_length())
  buffer = np.zeros(width, np.uint8)
  buffer[:len(payload)] = np.frombuffer(payload, np.uint8)
  rows = np.asarray(multihost_utils.process_allgather(buffer)).reshape(len(sizes), width)
  return [rows[p, :size].tobytes() for p, size in enumerate(sizes)]


def summarize(records: Sequence[EpisodeRecord]) -> dict[str, float]:
  """Means over records: the scorer's metrics, turns, tool calls per episode and tool-error rate; where the
  records carry question types, also `em_<type>` and `num_<type>` per type (the mixed world's per-type EM)."""
  if not records:
    return {}
  out = {k: float(np.mean([float(r.scores[k]) for r in records])) for k in RECORD_METRICS}
  for kind in sorted({r.question_type for r in records} - {""}):
    of_kind = [float(r.scores["em"]) for r in records if r.question_type == kind]
    out[f"em_{kind}"] = float(np.mean(of_kind))
    out[f"num_{kind}"] = float(len(of_kind))
  calls = sum(r.num_tool_calls for r in records)
  out["turns"] = float(np.mean([r.num_turns for r in records]))
  out["tool_calls"] = calls / len(records)
  out["tool_error_rate"] = sum(r.num_tool_errors for r in records) / calls if calls else 0.0
  out["num_examples"] = float(len(records))
  return out


def evaluate_sources(sampler: Any, params: Any, env: Any, tokenizer: Any, render: Callable[[Mapping], str],
                     sources: Mapping[str, Sequence[Mapping[str, Any]]], rollout_config: RolloutConfig,
                     sampling: Any, rng: jax.Array, *, batch_size: int, max_examples: int | None = None,
                     reward_style: str = "paper", slot_options: Mapping[str, Any] | None = None
                     ) -> tuple[dict[str, dict[str, float]], list[EpisodeRecord]]:
  """Per-source summaries (first `max_examples` of each source) and all records (`evaluate_examples` per source,
  on the slot engine with `slot_options`, else the lockstep driver)."""
  summaries, all_records = {}, []
  for i, (name, examples) in enumerate(sources.items()):
    n = len(examples) if max_examples is None else min(len(examples), max_examples)
    subset = [examples[j] for j in range(n)]
    records = evaluate_examples(sampler, params, env, tokenizer, render, subset, rollout_config, sampling,
                                jax.random.fold_in(rng, i), batch_size=batch_size, reward_style=reward_style,
                                slot_options=slot_options)
    summaries[name] = summarize(records)
    all_records.extend(records)
  return summaries, all_records
