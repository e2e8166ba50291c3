"""The error observations a model sees when its tool call goes wrong.

A bad tool call is the model's mistake, never the user's: it must not raise. Each failure below becomes
the content of a `<tool_response>` with success=False, so the model can learn from it. The texts are
distinct (each starts with its own fixed prefix, listed in `PREFIXES`) so that logs and tests can tell
them apart; anything echoed from the model is clipped to `_ECHO_CHARS` characters.

| failure                                   | text begins with                                         |
|-------------------------------------------|----------------------------------------------------------|
| text in <tool_call> is not JSON           | `Error: the tool call is not valid JSON`                 |
| JSON but not an object                    | `Error: the tool call must be a JSON object`             |
| no "name" string                          | `Error: the tool call has no "name" string`              |
| no "arguments"                            | `Error: the tool call has no "arguments" object`         |
| "arguments" not an object                 | `Error: the tool call's "arguments" must be a JSON object` |
| name not among the tools                  | `Error: unknown tool`                                    |
| arguments larger than the tool's limit    | `Error: the arguments are too large for tool`            |
| arguments fail the tool's JSON schema     | `Error: invalid arguments for tool`                      |
| the tool raised an exception              | `Error: tool ... failed with`                            |
| the tool exceeded its time limit          | `Error: tool ... timed out`                              |
| the tool's backend (server) is unreachable| `Error: tool ... could not reach its backend`            |
"""

from __future__ import annotations

_ECHO_CHARS = 120

PREFIXES = {
    "invalid_json": "Error: the tool call is not valid JSON",
    "not_object": "Error: the tool call must be a JSON object",
    "missing_name": 'Error: the tool call has no "name" string',
    "missing_arguments": 'Error: the tool call has no "arguments" object',
    "arguments_not_object": "Error: the tool call's \"arguments\" must be a JSON object",
    "unknown_tool": "Error: unknown tool",
    "arguments_too_large": "Error: the arguments are too large for tool",
    "invalid_arguments": "Error: invalid arguments for tool",
    "tool_exception": "failed with",
    "timeout": "timed out after",
    "unavailable": "could not reach its backend",
}

_CALL_FORMAT = '{"name": <tool-name>, "arguments": {...}}'


def clip(text: str, limit: int = _ECHO_CHARS) -> str:
  """Shortens model-provided or exception text that is echoed back in an error message."""
  text = str(text).replace("\n", " ")
  return text if len(text) <= limit else text[:limit] + "..."


def json_kind(value: object) -> str:
  """The JSON type name of a decoded value."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "boolean"
  if isinstance(value, (int, float)):
    return "number"
  if isinstance(value, str):
    return "string"
  if isinstance(value, list):
    return "array"
  if isinstance(value, dict):
    return "object"
  return type(value).__name__


def invalid_json(detail: str) -> str:
  return f"{PREFIXES['invalid_json']} ({clip(detail)}). Write {_CALL_FORMAT} inside <tool_call></tool_call>."


def not_object(value: object) -> str:
  return f"{PREFIXES['not_object']} {_CALL_FORMAT}, got a JSON {json_kind(value)}."


def missing_name() -> str:
  return f"{PREFIXES['missing_name']}. Write {_CALL_FORMAT}."


def missing_arguments() -> str:
  return f"{PREFIXES['missing_arguments']}. Write {_CALL_FORMAT}."


def arguments_not_object(value: object) -> str:
  return f"{PREFIXES['arguments_not_object']}, got a JSON {json_kind(value)}."


def unknown_tool(name: str, available: list[str]) -> str:
  return f"{PREFIXES['unknown_tool']} \"{clip(name, 60)}\". Available tools: {', '.join(available) or 'none'}."


def arguments_too_large(tool: str, size: int, limit: int) -> str:
  return f"{PREFIXES['arguments_too_large']} \"{tool}\" ({size} characters; the limit is {limit})."


def invalid_arguments(tool: str, detail: str) -> str:
  return f"{PREFIXES['invalid_arguments']} \"{tool}\": {clip(detail, 200)}."


def tool_exception(tool: str, exc: BaseException) -> str:
  return f"Error: tool \"{tool}\" {PREFIXES['tool_exception']} {type(exc).__name__}: {clip(exc, 200)}"


def timeout(tool: str, seconds: float) -> str:
  return f"Error: tool \"{tool}\" {PREFIXES['timeout']} {seconds:g} s."


def unavailable(tool: str, detail: str) -> str:
  return f"Error: tool \"{tool}\" {PREFIXES['unavailable']} ({clip(detail, 200)}); try again later."
