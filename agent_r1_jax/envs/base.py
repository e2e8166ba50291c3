"""`BaseToolEnv`: turns one assistant turn into tool calls, runs them, and renders the observation.

An environment step takes the decoded text of ONE assistant turn (special tokens kept) and returns a
`StepResult(observation, successes, active)`:

* no tool call in the turn -> it is the final answer: `StepResult("", [], False)`;
* otherwise every parsed call (only the first unless `parallel_tool_calls`) is resolved to a tool and run,
  each result is cut to `max_tool_response_length` characters, and the observation is the text that
  closes the assistant turn, shows the results and opens the next assistant turn (format: subclasses).

Bad calls (unparsable, unknown tool, invalid arguments, tool failures) never raise; they become error
results (see `agent_r1_jax.tools.errors`) with success=False and the episode stays active.
`batch_step` gives exactly what `step` gives row by row, but runs each tool's calls of the whole batch
through one `call_batch` (one batched search for the search tool), different tools concurrently.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
from typing import Any, NamedTuple, Sequence

from agent_r1_jax.tools import errors
from agent_r1_jax.tools.base import BaseTool, ToolResult

class StepResult(NamedTuple):
  """The environment's answer to one assistant turn (a plain `(observation, successes, active)` tuple from a
  custom env is accepted too: the rollout driver reads it as this)."""
  observation: str  # the text appended to the context: closes the turn, shows the results, opens the next
  successes: list[bool]  # one per executed tool call
  active: bool  # False: the turn held no tool call, it is the final answer


@dataclasses.dataclass(frozen=True)
class ParsedCall:
  """One tool call found in a turn: a tool name and arguments, or the error observation explaining why not."""

  name: str | None = None
  arguments: Any = None
  error: str | None = None


class BaseToolEnv(abc.ABC):
  """Shared tool-execution logic; subclasses define the text format of calls and observations.

  Args:
    tools: the tools the policy may call (names must be unique).
    max_tool_response_length: characters of each tool result kept (longer ones end with
      `truncation_marker`, total length still at most this).
    parallel_tool_calls: run every call of a turn (True) or only the first (False, the paper's setting).
    truncation_marker: appended to a cut result.
  """

  def __init__(self, tools: Sequence[BaseTool], *, max_tool_response_length: int = 2048,
               parallel_tool_calls: bool = False, truncation_marker: str = "..."):
    tools = list(tools)
    bad = [type(t).__name__ for t in tools if not isinstance(t, BaseTool)]
    if bad:
      raise ValueError(f"every tool must be a BaseTool instance, got {bad}")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
      raise ValueError(f"tool names must be unique, got {names}")
    if max_tool_response_length < 1:
      raise ValueError(f"max_tool_response_length must be positive, got {max_tool_response_length}")
    self.tools = tools
    self.tool_map = {t.name: t for t in tools}
    self.max_tool_response_length = int(max_tool_response_length)
    self.parallel_tool_calls = bool(parallel_tool_calls)
    self.truncation_marker = truncation_marker
    self._pool = concurrent.futures.ThreadPoolExecutor(max(1, len(tools)), thread_name_prefix="tool-env")

  @property
  def tool_schemas(self) -> list[dict[str, Any]]:
    """OpenAI function schemas of the tools, for `apply_chat_template(tools=...)`."""
    return [t.tool_schema for t in self.tools]

  # --- format hooks -------------------------------------------------------------------------------
  @abc.abstractmethod
  def extract_tool_calls(self, raw_response: str) -> list[ParsedCall]:
    """All tool calls written in one assistant turn, in order."""

  @abc.abstractmethod
  def format_tool_response(self, contents: Sequence[str], raw_response: str) -> str:
    """The observation text for already-truncated tool results of the turn `raw_response`."""

  def stop(self, raw_response: str) -> bool:
    """True when the turn holds no tool call, i.e. it is the final answer and the episode ends."""
    return not self.extract_tool_calls(raw_response)

  # --- execution ----------------------------------------------------------------------------------
  def truncate(self, content: str) -> str:
    """Cuts a tool result to at most `max_tool_response_length` characters."""
    limit = self.max_tool_response_length
    if len(content) <= limit:
      return content
    if len(self.truncation_marker) >= limit:
      return content[:limit]
    return content[:limit - len(self.truncation_marker)] + self.truncation_marker

  def _calls_of(self, raw_response: str) -> list[ParsedCall]:
    if not isinstance(raw_response, str):
      raise TypeError(f"raw_response must be the decoded text of a turn (str), got {type(raw_response).__name__}")
    calls = self.extract_tool_calls(raw_response)
    return calls if self.parallel_tool_calls else calls[:1]

  def _resolve(self, call: ParsedCall) -> ToolResult | BaseTool:
    """The tool to run for a parsed call, or the error result when the call cannot be routed."""
    if call.error is not None:
      return ToolResult(call.error, False)
    tool = self.tool_map.get(call.name)  # type: ignore[arg-type]
    if tool is None:
      return ToolResult(errors.unknown_tool(str(call.name), list(self.tool_map)), False)
    return tool

  def _finish(self, raw_response: str, results: Sequence[ToolResult]) -> StepResult:
    # Lone surrogates (e.g. a model-written "\ud800" echoed back) cannot be tokenized; make them "?".
    contents = [self.truncate(r.content).encode("utf-8", "replace").decode("utf-8") for r in results]
    observation = self.format_tool_response(contents, raw_response)
    return StepResult(observation, [bool(r.success) for r in results], True)

  def step(self, raw_response: str) -> StepResult:
    """One turn -> (observation, per-call successes, active)."""
    calls = self._calls_of(raw_response)
    if not calls:
      return StepResult("", [], False)
    results = []
    for call in calls:
      target = self._resolve(call)
      results.append(target if isinstance(target, ToolResult) else target.call(call.arguments))
    return self._finish(raw_response, results)

  def batch_step(self, raw_responses: Sequence[str]) -> list[StepResult]:
    """`step` for every turn of a batch, results in input order; each tool runs one `call_batch`."""
    per_row = [self._calls_of(raw) for raw in raw_responses]
    results: list[list[ToolResult | None]] = [[None] * len(calls) for calls in per_row]
    jobs: dict[str, list[tuple[int, int, Any]]] = {}
    for row, calls in enumerate(per_row):
      for j, call in enumerate(calls):
        target = self._resolve(call)
        if isinstance(target, ToolResult):
          results[row][j] = target
        else:
          jobs.setdefault(target.name, []).append((row, j, call.arguments))
    futures = {name: self._pool.submit(self.tool_map[name].call_batch, [a for _, _, a in job])
               for name, job in jobs.items()}
    for name, future in futures.items():
      try:
        outcome = future.result()
      except Exception as e:  # pylint: disable=broad-except  # call_batch never raises; belt and braces
        outcome = [ToolResult(errors.tool_exception(name, e), False)] * len(jobs[name])
      for (row, j, _), result in zip(jobs[name], outcome):
        results[row][j] = result
    out: list[StepResult] = []
    for raw, row_results in zip(raw_responses, results):
      if not row_results:
        out.append(StepResult("", [], False))
      else:
        out.append(self._finish(raw, row_results))  # type: ignore[arg-type]
    return out

  def close(self) -> None:
    """Stops the worker threads (the environment is unusable afterwards)."""
    self._pool.shutdown(wait=False)
