"""`BaseTool`: a function the policy can call, with schema validation, timeouts and batching.

A tool declares `name`, `description` and `parameters` (an OpenAI function-calling JSON schema for its
arguments). The environment never calls `execute` directly: it calls `call` / `call_batch`, which turn
every failure (oversized or schema-invalid arguments, an exception in the tool, a timeout, an unreachable
backend) into an error `ToolResult` instead of raising. Timeouts run the tool in a daemon thread and stop
*waiting* after `timeout_s`; Python cannot kill a thread, so a tool that hangs keeps its thread until it
returns. Tools doing blocking I/O should also set their own I/O timeouts (the HTTP retriever does) and
tools running untrusted work should use a subprocess (the python tool does).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import threading
from typing import Any, Callable, Mapping, Sequence

import jsonschema

from agent_r1_jax.retrieval.base import RetrievalUnavailableError
from agent_r1_jax.tools import errors


@dataclasses.dataclass(frozen=True)
class ToolResult:
  """What a tool call returns to the environment: the text the model will read and whether it worked."""

  content: str
  success: bool


def check_parameters_schema(name: str, parameters: Any) -> None:
  """Raises ValueError unless `parameters` is an object JSON schema whose `required` ⊆ `properties`."""
  if not isinstance(parameters, Mapping):
    raise ValueError(f"tool {name!r}: parameters must be a JSON-schema dict, got {type(parameters).__name__}")
  if parameters.get("type") != "object":
    raise ValueError(f"tool {name!r}: parameters must have \"type\": \"object\", got {parameters.get('type')!r}")
  properties = parameters.get("properties")
  if not isinstance(properties, Mapping):
    raise ValueError(f"tool {name!r}: parameters must have a \"properties\" dict")
  required = parameters.get("required", [])
  if not isinstance(required, (list, tuple)) or not all(isinstance(r, str) for r in required):
    raise ValueError(f"tool {name!r}: \"required\" must be a list of property names")
  missing = [r for r in required if r not in properties]
  if missing:
    raise ValueError(f"tool {name!r}: required {missing} not declared in properties {sorted(properties)}")
  try:
    jsonschema.Draft202012Validator.check_schema(dict(parameters))
  except jsonschema.SchemaError as e:
    raise ValueError(f"tool {name!r}: parameters is not a valid JSON schema: {e.message}") from e


class _Timeout:
  """Marker for a call that did not finish in time."""


def run_with_timeout(fn: Callable[[], Any], timeout_s: float | None) -> Any:
  """Runs `fn()` in a daemon thread; returns its value, the exception it raised, or a `_Timeout`."""
  if timeout_s is None:
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      return e
  box: list[Any] = []

  def target() -> None:
    try:
      box.append(fn())
    except BaseException as e:  # pylint: disable=broad-except
      box.append(e)

  thread = threading.Thread(target=target, daemon=True, name="tool-call")
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive() or not box:
    return _Timeout()
  return box[0]


class BaseTool(abc.ABC):
  """Base class of every tool.

  Subclasses set the class attributes `name`, `description`, `parameters` (or pass them to `__init__`)
  and implement `execute`. They may override `batch_execute` to do the work of many calls at once.

  Args:
    timeout_s: wall-clock limit for one `execute` or one `batch_execute` call (None = no limit).
    max_argument_chars: limit on the JSON-serialised arguments of one call.
  """

  name: str = ""
  description: str = ""
  parameters: dict[str, Any] = {}

  def __init__(self, *, name: str | None = None, description: str | None = None,
               parameters: Mapping[str, Any] | None = None, timeout_s: float | None = 30.0,
               max_argument_chars: int = 4096):
    if name is not None:
      self.name = name
    if description is not None:
      self.description = description
    if parameters is not None:
      self.parameters = parameters  # type: ignore[assignment]  # checked below
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"{type(self).__name__}: a tool needs a non-empty string name")
    if not isinstance(self.description, str):
      raise ValueError(f"tool {self.name!r}: description must be a string")
    check_parameters_schema(self.name, self.parameters)
    self.parameters = dict(self.parameters)
    if timeout_s is not None and timeout_s <= 0:
      raise ValueError(f"tool {self.name!r}: timeout_s must be positive or None, got {timeout_s}")
    if max_argument_chars < 1:
      raise ValueError(f"tool {self.name!r}: max_argument_chars must be positive")
    self.timeout_s = timeout_s
    self.max_argument_chars = int(max_argument_chars)
    self._validator = jsonschema.Draft202012Validator(self.parameters)

  # --- what subclasses implement -----------------------------------------------------------------
  @abc.abstractmethod
  def execute(self, args: dict[str, Any]) -> ToolResult:
    """Runs one call with already-validated arguments."""

  def batch_execute(self, args_list: Sequence[dict[str, Any]]) -> list[ToolResult]:
    """Runs many validated calls; one result per call, in order. Default: `execute` one by one."""
    return [self.execute(args) for args in args_list]

  # --- schema --------------------------------------------------------------------------------------
  @property
  def tool_schema(self) -> dict[str, Any]:
    """OpenAI function form, accepted by `tokenizer.apply_chat_template(tools=[...])`."""
    return {"type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

  def validate_args(self, args: Any) -> str | None:
    """None when `args` may be executed, else the error observation text."""
    if not isinstance(args, dict):
      return errors.arguments_not_object(args)
    try:
      size = len(json.dumps(args, ensure_ascii=False))
    except (TypeError, ValueError) as e:
      return errors.invalid_arguments(self.name, f"not JSON-serialisable ({e})")
    if size > self.max_argument_chars:
      return errors.arguments_too_large(self.name, size, self.max_argument_chars)
    error = jsonschema.exceptions.best_match(self._validator.iter_errors(args))
    if error is not None:
      where = "/".join(str(p) for p in error.absolute_path)
      return errors.invalid_arguments(self.name, f"{where + ': ' if where else ''}{error.message}")
    return None

  # --- safe entry points used by environments ----------------------------------------------------
  def _error_for(self, outcome: Any) -> ToolResult | None:
    if isinstance(outcome, _Timeout):
      return ToolResult(errors.timeout(self.name, self.timeout_s or 0.0), False)
    if isinstance(outcome, RetrievalUnavailableError):
      return ToolResult(errors.unavailable(self.name, str(outcome)), False)
    if isinstance(outcome, BaseException):
      return ToolResult(errors.tool_exception(self.name, outcome), False)
    return None

  def _checked(self, result: Any) -> ToolResult:
    if not isinstance(result, ToolResult) or not isinstance(result.content, str):
      return ToolResult(errors.tool_exception(
          self.name, TypeError(f"execute returned {type(result).__name__}, not a ToolResult with str content")),
                        False)
    return result

  def call(self, args: Any) -> ToolResult:
    """Validates and executes one call; never raises."""
    error = self.validate_args(args)
    if error is not None:
      return ToolResult(error, False)
    outcome = run_with_timeout(lambda: self.execute(args), self.timeout_s)
    failure = self._error_for(outcome)
    return failure if failure is not None else self._checked(outcome)

  def call_batch(self, args_list: Sequence[Any]) -> list[ToolResult]:
    """Validates all calls, runs the valid ones in ONE `batch_execute`; never raises.

    If `batch_execute` raises (or returns the wrong number of results), the valid calls are retried one
    by one through `call`, so a single bad call gets the same observation as under `call`. If it times
    out or its backend is unreachable, every valid call gets that observation (no retries).
    """
    results: list[ToolResult | None] = [None] * len(args_list)
    valid_idx: list[int] = []
    for i, args in enumerate(args_list):
      error = self.validate_args(args)
      if error is None:
        valid_idx.append(i)
      else:
        results[i] = ToolResult(error, False)
    if valid_idx:
      valid = [args_list[i] for i in valid_idx]
      outcome = run_with_timeout(lambda: self.batch_execute(valid), self.timeout_s)
      if isinstance(outcome, (_Timeout, RetrievalUnavailableError)):
        failure = self._error_for(outcome)
        for i in valid_idx:
          results[i] = failure
      elif isinstance(outcome, BaseException) or not isinstance(outcome, list) or len(outcome) != len(valid):
        for i in valid_idx:
          results[i] = self.call(args_list[i])
      else:
        for i, r in zip(valid_idx, outcome):
          results[i] = self._checked(r)
    return results  # type: ignore[return-value]

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r})"
