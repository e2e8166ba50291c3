"""Parsing a decoded multi-turn response into assistant turns and checking each turn's format.

A response (everything the rollout appended after the prompt, special tokens kept) looks like

  <think>..</think>\n<tool_call>\n{json}\n</tool_call>            <- assistant turn 1 (its header is in the prompt)
  <|im_end|>\n<|im_start|>user\n<tool_response>\n..\n</tool_response><|im_end|>\n<|im_start|>assistant\n
  <think>..</think>\n<answer>X</answer><|im_end|>                  <- final assistant turn

so splitting `"<|im_start|>assistant\n" + response` on `<|im_start|>` gives one piece per chat turn whose first
line is the role. A turn is *closed* when its text reached `<|im_end|>` (a length-truncated turn is not).
"""

from __future__ import annotations

import dataclasses
import json
import re

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE,
         TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)

# Lenient (paper) shapes: optional whitespace around and between the blocks.
_FINAL_TURN = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_TOOL_TURN = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<tool_call>(?P<call>.*?)</tool_call>\s*",
                        re.DOTALL)
# Strict shapes of the released Agent-R1 scorer: exactly one newline between the blocks, nothing around.
_STRICT_FINAL_TURN = re.compile(r"<think>.*?</think>\n<answer>.*?</answer>", re.DOTALL)
_STRICT_TOOL_TURN = re.compile(r"<think>.*?</think>\n<tool_call>.*?</tool_call>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Turn:
  """One chat turn of a response: role, text between its header and `<|im_end|>`, and whether it closed."""
  role: str
  content: str
  closed: bool


def split_turns(solution_str: str) -> list[Turn]:
  """Split a decoded response into chat turns (the first is the assistant turn the prompt opened)."""
  text = solution_str
  while text.endswith(END_OF_TEXT):  # right padding decoded with special tokens kept
    text = text[: -len(END_OF_TEXT)]
  turns = []
  for piece in (IM_START + "assistant\n" + text).split(IM_START)[1:]:
    header, newline, body = piece.partition("\n")
    if not newline:  # a bare `<|im_start|>role` with nothing after it
      header, body = piece, ""
    content, im_end, _ = body.partition(IM_END)
    turns.append(Turn(role=header.strip(), content=content, closed=bool(im_end)))
  return turns


def assistant_turns(solution_str: str) -> list[Turn]:
  """The assistant turns of a response, in order (never empty: the first turn always exists)."""
  return [t for t in split_turns(solution_str) if t.role == "assistant"]


def _tag_counts(text: str) -> dict[str, int]:
  return {tag: text.count(tag) for tag in _TAGS}


def _only_these_tags(text: str, allowed: tuple[str, ...]) -> bool:
  """Each tag in `allowed` occurs exactly once and every other tag never."""
  return all(count == (1 if tag in allowed else 0) for tag, count in _tag_counts(text).items())


def parse_tool_call(body: str) -> dict | None:
  """The `{"name": str, "arguments": object}` dict inside a `<tool_call>` block, or None if malformed."""
  try:
    call = json.loads(body)
  except (json.JSONDecodeError, RecursionError):
    return None
  if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
    return None
  if not isinstance(call.get("arguments"), dict):
    return None
  return call


def is_final_answer_turn(content: str) -> bool:
  """`<think>R</think> <answer>A</answer>` with R and A non-blank and no other tags (whitespace allowed)."""
  match = _FINAL_TURN.fullmatch(content)
  return bool(match and _only_these_tags(content, (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE))
              and match["think"].strip() and match["answer"].strip())


def is_tool_call_turn(content: str) -> bool:
  """`<think>R</think> <tool_call>J</tool_call>` with R non-blank, J a JSON object with `name` and object
  `arguments`, and no other tags."""
  match = _TOOL_TURN.fullmatch(content)
  return bool(match and _only_these_tags(content, (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE))
              and match["think"].strip() and parse_tool_call(match["call"].strip()) is not None)


def is_strict_final_answer_turn(content: str) -> bool:
  """The released Agent-R1 final-turn shape: `^<think>..</think>\\n<answer>..</answer>$`, one of each."""
  return bool(_STRICT_FINAL_TURN.fullmatch(content)
              and _only_these_tags(content, (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)))


def is_strict_tool_call_turn(content: str) -> bool:
  """The released Agent-R1 tool-turn shape: `^<think>..</think>\\n<tool_call>..</tool_call>$`, one of each
  (the JSON inside is not inspected, as in the released scorer)."""
  return bool(_STRICT_TOOL_TURN.fullmatch(content)
              and _only_these_tags(content, (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)))


def extract_answer(content: str) -> str | None:
  """The stripped text of the first `<answer>..</answer>` block of a turn, or None when there is none."""
  match = _ANSWER.search(content)
  return match.group(1).strip() if match else None
