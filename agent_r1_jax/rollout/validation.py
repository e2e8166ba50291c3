"""Up-front checks of a rollout's inputs: each raises one ValueError/TypeError saying what to change.

They run before the first jitted call, so a bad tokenizer, prompt or env fails in a second, not after a
prefill and several turns of generation.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.sampling import multihost
from agent_r1_jax.rollout.stop_strings import TOOL_CALL_CLOSE, TURN_END, turn_stop_strings

# What the Qwen2.5 / Hermes tool format needs as single tokens: the turn framing the env writes into
# observations (`<|im_start|>role\n ... <|im_end|>`). The tool-call delimiters may be several tokens (they are
# parsed as text; the sampler stops on `</tool_call>`'s token sequence, see `stop_strings`).
TURN_START = "<|im_start|>"
TOOL_CALL_OPEN = "<tool_call>"
REQUIRED_SPECIAL_TOKENS = (TURN_START, TURN_END)

# A tool call to a tool no env registers: a Nous-style env answers it with an error observation without
# running anything, which exercises the observation path's types.
_PROBE_RESPONSES = (
    "probe answer without a tool call",
    f'{TOOL_CALL_OPEN}\n{{"name": "__rollout_probe_no_such_tool__", "arguments": {{}}}}\n{TOOL_CALL_CLOSE}',
)


def special_token_ids(tokenizer: Any, tokens: Sequence[str] = REQUIRED_SPECIAL_TOKENS) -> dict[str, int]:
  """Maps each required special token to its single id; raises if any is missing or splits."""
  missing = []
  ids = {}
  for token in tokens:
    encoded = tokenizer.encode(token, add_special_tokens=False)
    if len(encoded) != 1:
      missing.append(f"{token!r} -> {list(encoded)}")
    else:
      ids[token] = int(encoded[0])
  if missing:
    raise ValueError(
        "the tokenizer does not encode these special tokens as single ids: " + ", ".join(missing)
        + ". Use a Qwen2.5-style tokenizer (or add them with tokenizer.add_special_tokens) so observations "
        "and stop tokens keep the chat-template framing.")
  if getattr(tokenizer, "pad_token_id", None) is None:
    raise ValueError("the tokenizer has no pad token; set tokenizer.pad_token (Qwen2.5 uses <|endoftext|>)")
  return ids


def _sampler_stops(sampler: Any) -> set[tuple[int, ...]] | None:
  """The sampler's stop sequences (`stop_sequences`, else its single `stop_token_ids`), or None if it has neither."""
  seqs = getattr(sampler, "stop_sequences", None)
  if seqs is not None:
    return {tuple(int(t) for t in s) for s in seqs}
  ids = getattr(sampler, "stop_token_ids", None)
  return None if ids is None else {(int(t),) for t in ids}


def check_sampler(sampler: Any, config: RolloutConfig, ids: dict[str, int | Sequence[int]], *,
                  parallel_tool_calls: bool = False) -> None:
  """The sampler's cache holds the prompt bucket + R slots and it stops on `turn_stop_strings`: the turn end,
  and `</tool_call>` exactly when a turn holds one call (with parallel calls it must not stop there).

  Args:
    ids: the standalone tokenization of `<|im_end|>` and `</tool_call>` (`stop_strings.standalone_ids`); a
      single id stands for a one-token sequence.
  """
  cache = getattr(sampler, "max_cache_length", None)
  if cache is not None and cache < config.cache_length:
    raise ValueError(
        f"the sampler's max_cache_length ({cache}) cannot hold a prompt bucket plus max_response_length "
        f"({config.cache_length}); build the Sampler with max_cache_length >= config.cache_length = "
        f"{config.cache_length}")
  stops = _sampler_stops(sampler)
  if stops is None:
    return
  as_seq = lambda v: (int(v),) if isinstance(v, (int, np.integer)) else tuple(int(t) for t in v)  # noqa: E731
  needed = {name: as_seq(ids[name]) for name in turn_stop_strings(parallel_tool_calls)}
  absent = [f"{name} ({list(seq)})" for name, seq in needed.items() if seq not in stops]
  absent += [f"end_of_text id {i}" for i in config.end_of_text_ids if (int(i),) not in stops]
  if absent:
    raise ValueError(f"the sampler's stop sequences {sorted(list(s) for s in stops)} lack {', '.join(absent)}; a turn must stop "
                     "on the turn end and, unless the env runs parallel tool calls, on </tool_call>, so each "
                     "segment is one assistant action (build it with stop_sequences=stop_strings."
                     "turn_stop_sequences(tokenizer, parallel_tool_calls))")
  close = as_seq(ids[TOOL_CALL_CLOSE])
  if parallel_tool_calls and close in stops:
    raise ValueError(f"the env runs parallel tool calls but the sampler stops on {TOOL_CALL_CLOSE} "
                     f"({list(close)}), so a turn could never hold a second call; leave it out of the stop "
                     "sequences")


def check_prompts(prompts: Sequence[Sequence[int]], config: RolloutConfig) -> None:
  """Every prompt is non-empty, fits P, and leaves room for at least one sampled token."""
  if not prompts:
    raise ValueError("run_episodes got no prompts")
  limit = min(config.max_prompt_length, config.context_limit - 1)
  bad = [(i, len(p)) for i, p in enumerate(prompts) if not 0 < len(p) <= limit]
  if bad:
    shown = ", ".join(f"#{i} ({n} tokens)" for i, n in bad[:5]) + (" ..." if len(bad) > 5 else "")
    raise ValueError(
        f"{len(bad)} prompt(s) are empty or longer than {limit} tokens (the smaller of max_prompt_length="
        f"{config.max_prompt_length} and the context limit {config.context_limit} minus one token to sample): "
        f"{shown}. Filter or truncate them, or raise max_prompt_length / max_context_length.")


def check_step_results(results: Any, expected: int) -> None:
  """`env.batch_step` returned `expected` tuples (observation: str, successes: list[bool], active: bool)."""
  if not isinstance(results, (list, tuple)) or len(results) != expected:
    raise TypeError(f"env.batch_step must return a list of {expected} (observation, successes, active) "
                    f"tuples, got {type(results).__name__} of length {len(results) if hasattr(results, '__len__') else '?'}")
  for result in results:
    if not (isinstance(result, (list, tuple)) and len(result) == 3):
      raise TypeError(f"env.batch_step items must be (observation, successes, active) tuples, got {result!r}")
    observation, successes, active = result
    if not isinstance(observation, str):
      raise TypeError(f"env observations must be str (the text appended to the context), got "
                      f"{type(observation).__name__}: {observation!r:.80}")
    if not isinstance(successes, (list, tuple)) or not all(isinstance(s, bool) for s in successes):
      raise TypeError(f"env successes must be a list of bool (one per tool call), got {successes!r}")
    if not isinstance(active, bool):
      raise TypeError(f"env 'active' must be a bool, got {type(active).__name__}")


def probe_env(env: Any) -> None:
  """Calls `env.batch_step` on a final answer and on a call to a nonexistent tool; checks the types."""
  if not callable(getattr(env, "batch_step", None)):
    raise TypeError(f"the env {type(env).__name__} has no batch_step(list[str]) method")
  try:
    check_step_results(env.batch_step(list(_PROBE_RESPONSES)), len(_PROBE_RESPONSES))
  except TypeError as error:
    raise TypeError(f"{type(env).__name__} failed the rollout's up-front probe: {error}") from None


def check_slot_processes(slots_per_device: int, decode_chunk: int, episode_offset: int, batch_size: int) -> None:
  """One all-gather (a collective: every process calls it once per rollout, before any slot program): the processes
  run the same slots_per_device and decode_chunk (else their programs' shapes would differ and the run hang), and
  their episodes [episode_offset, episode_offset + B) do not overlap (else two processes would draw the same keys)."""
  table = multihost.gather_across_processes([slots_per_device, decode_chunk, episode_offset, batch_size])
  for column, name in ((0, "slots_per_device"), (1, "decode_chunk")):
    if len(set(table[:, column].tolist())) > 1:
      raise ValueError(f"every process must pass the same {name}; the processes passed {table[:, column].tolist()}")
  spans = sorted((int(start), int(start + b), p) for p, (start, b) in enumerate(table[:, 2:]) if b > 0)
  for (_, end, p), (start, _, q) in zip(spans, spans[1:]):
    if start < end:
      raise ValueError(f"processes {p} and {q} have overlapping episode ranges (episode_offset, rows per process: "
                       f"{table[:, 2:].tolist()}): pass each process's global group_offset (or episode_offset)")
  if spans and spans[-1][1] > np.iinfo(np.int32).max:
    raise ValueError(f"episode numbers up to {spans[-1][1]} do not fit the int32 keys; lower group_offset or "
                     "episode_offset")


def check_slot_arguments(tool_workers: Any, tool_poll_s: Any, episode_offset: Any) -> None:
  """`run_slot_episodes`' own arguments: one ValueError naming the bad one."""
  if not isinstance(tool_workers, (int, np.integer)) or tool_workers < 1:
    raise ValueError(f"tool_workers must be a positive integer, got {tool_workers!r}")
  if not isinstance(tool_poll_s, (int, float)) or not tool_poll_s > 0:
    raise ValueError(f"tool_poll_s must be a positive number of seconds, got {tool_poll_s!r}")
  if not isinstance(episode_offset, (int, np.integer)) or episode_offset < 0:
    raise ValueError(f"episode_offset must be an integer >= 0, got {episode_offset!r}")
