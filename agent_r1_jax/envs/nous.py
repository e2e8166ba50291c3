"""`NousToolEnv`: the Hermes / Qwen2.5 tool-call format.

The model writes calls as

  <tool_call>
  {"name": "search", "arguments": {"query": "..."}}
  </tool_call>

and, exactly as the Qwen2.5 chat template renders a `tool` message, the observation after a turn that
ends with `</tool_call>` is

  <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n{result 1}\\n</tool_response>\\n<tool_response>\\n{result 2}
  \\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n{assistant_prefix}

(one `<tool_response>` block per executed call, all in one user turn). When the turn already ends with
`<|im_end|>` (the model closed its turn after the call) the leading `<|im_end|>` is left out, so the
context never holds two. With `assistant_prefix=""`, prompt + turn + observation is token-for-token what
`apply_chat_template(messages + [assistant tool_calls, tool results], add_generation_prompt=True)` gives
(tested with the real Qwen2.5 tokenizer).

A turn is parsed as: every non-overlapping `<tool_call>...</tool_call>` span, in order (an unclosed
`<tool_call>` is not a call); the text inside, stripped, must be a JSON object with a string `name` and an
object `arguments`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from agent_r1_jax.envs.base import BaseToolEnv, ParsedCall
from agent_r1_jax.tools import errors
from agent_r1_jax.tools.base import BaseTool

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_START, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
_CALL_RE = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


def parse_call(body: str) -> ParsedCall:
  """Parses the text between <tool_call> and </tool_call> into a call or an error observation."""
  try:
    obj = json.loads(body.strip())
  except json.JSONDecodeError as e:
    return ParsedCall(error=errors.invalid_json(e.msg))
  except RecursionError:
    return ParsedCall(error=errors.invalid_json("nested too deeply"))
  except ValueError as e:  # e.g. an integer literal longer than Python's int_max_str_digits
    return ParsedCall(error=errors.invalid_json(str(e)))
  if not isinstance(obj, dict):
    return ParsedCall(error=errors.not_object(obj))
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return ParsedCall(error=errors.missing_name())
  if "arguments" not in obj:
    return ParsedCall(error=errors.missing_arguments())
  arguments = obj["arguments"]
  if not isinstance(arguments, dict):
    return ParsedCall(error=errors.arguments_not_object(arguments))
  return ParsedCall(name=name, arguments=arguments)


class NousToolEnv(BaseToolEnv):
  """Tool environment for Qwen2.5-style `<tool_call>` JSON calls.

  Args:
    tools: the tools the policy may call.
    max_tool_response_length: characters of each tool result kept before framing.
    parallel_tool_calls: execute all calls of a turn (True) or only the first (False).
    assistant_prefix: text forced at the start of the next assistant turn (e.g. "<think>\\n"); "" matches
      the chat template's generation prompt exactly.
    truncation_marker: appended to a cut tool result.
  """

  def __init__(self, tools: Sequence[BaseTool], *, max_tool_response_length: int = 2048,
               parallel_tool_calls: bool = False, assistant_prefix: str = "", truncation_marker: str = "..."):
    super().__init__(tools, max_tool_response_length=max_tool_response_length,
                     parallel_tool_calls=parallel_tool_calls, truncation_marker=truncation_marker)
    self.assistant_prefix = assistant_prefix

  def extract_tool_calls(self, raw_response: str) -> list[ParsedCall]:
    return [parse_call(body) for body in _CALL_RE.findall(raw_response)]

  def format_tool_response(self, contents: Sequence[str], raw_response: str) -> str:
    head = "" if raw_response.endswith(IM_END) else IM_END
    blocks = "".join(f"\n{TOOL_RESPONSE_START}\n{c}\n{TOOL_RESPONSE_END}" for c in contents)
    return f"{head}\n{IM_START}user{blocks}{IM_END}\n{IM_START}assistant\n{self.assistant_prefix}"

  @staticmethod
  def render_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as the Qwen2.5 template renders it (what a well-behaved model writes)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_START}\n{body}\n{TOOL_CALL_END}"
