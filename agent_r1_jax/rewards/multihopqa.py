"""Rewards for multi-hop QA agents: answer correctness gated by the multi-turn format.

Two styles, chosen by `style` (config `algorithm.reward_style`):

`paper` (default; Agent-R1, arXiv:2511.14460, the multi-hop QA reward):
  r_format_answer = 1 if the final assistant turn is `<think>R</think>` followed by exactly one
                    `<answer>A</answer>` (R, A non-blank, whitespace allowed between blocks, no other tags);
  r_format_tool   = 1 if the response made at least one tool call and every non-final assistant turn is
                    `<think>R</think>` + exactly one `<tool_call>J</tool_call>` whose J is a JSON object with a
                    string `name` and an object `arguments`;
  r_format = (r_format_answer + r_format_tool) / 2
  score    = EM(A, gold)       if r_format == 1
           = r_format - 1      otherwise              (so score is in {-1, -0.5, 0, 1})

`partial_credit` (the scoring of the paper's released code: partial credit for each well-formed tool turn and
for an answer found in the final turn):
  blocks   = assistant turns that reached `<|im_end|>`
  format   = min(1, 0.5 * #{non-final blocks == `<think>..</think>\\n<tool_call>..</tool_call>`}
                    + 0.5 * [last block == `<think>..</think>\\n<answer>..</answer>`])
  answer   = 1.0 if normalize(gold) is a substring of normalize(A); else 0.2 if normalize(gold) is a
             substring of the normalised last block; else 0
  score    = -1 + format + answer   if format >= 0.5
           = -1 + format            otherwise

Both return the same metric dict; `em`, `f1` and `substring_acc` are computed on the extracted answer A (the
first `<answer>` block of the final turn) against the best gold alias, whatever the format.
"""

from __future__ import annotations

from typing import Sequence

from agent_r1_jax.rewards import trajectory_format as tf
from agent_r1_jax.rewards.answer_metrics import (as_aliases, exact_match, exact_match_any, f1, f1_any,
                                                 normalize_answer, substring_match_any)

__all__ = ["STYLES", "compute_score", "exact_match", "f1", "normalize_answer"]

STYLES = ("paper", "partial_credit")


def _answer_metrics(answer: str | None, aliases: list[str]) -> dict[str, float]:
  if answer is None:
    return {"em": 0.0, "f1": 0.0, "substring_acc": 0.0}
  return {"em": exact_match_any(answer, aliases), "f1": f1_any(answer, aliases),
          "substring_acc": substring_match_any(answer, aliases)}


def _score_paper(solution_str: str, aliases: list[str]) -> dict:
  turns = tf.assistant_turns(solution_str)
  final, tool_turns = turns[-1], turns[:-1]
  format_answer = float(tf.is_final_answer_turn(final.content))
  format_tool = float(bool(tool_turns) and all(tf.is_tool_call_turn(t.content) for t in tool_turns))
  r_format = (format_answer + format_tool) / 2.0
  answer = tf.extract_answer(final.content)
  metrics = _answer_metrics(answer, aliases)
  score = metrics["em"] if r_format == 1.0 else r_format - 1.0
  return {"score": score, **metrics, "format": r_format, "format_answer": format_answer,
          "format_tool": format_tool, "answer": answer}


def _score_partial_credit(solution_str: str, aliases: list[str]) -> dict:
  blocks = [t for t in tf.assistant_turns(solution_str) if t.closed]
  if not blocks:
    return {"score": -1.0, **_answer_metrics(None, aliases), "format": 0.0, "format_answer": 0.0,
            "format_tool": 0.0, "answer": None}
  final, tool_blocks = blocks[-1], blocks[:-1]
  good_tool_turns = sum(tf.is_strict_tool_call_turn(t.content) for t in tool_blocks)
  final_ok = tf.is_strict_final_answer_turn(final.content)
  fmt = min(1.0, 0.5 * good_tool_turns + 0.5 * final_ok)
  answer = tf.extract_answer(final.content)
  metrics = _answer_metrics(answer, aliases)
  if answer is not None and metrics["substring_acc"] == 1.0:
    answer_reward = 1.0
  elif substring_match_any(final.content, aliases) == 1.0:
    answer_reward = 0.2
  else:
    answer_reward = 0.0
  score = -1.0 + fmt + answer_reward if fmt >= 0.5 else -1.0 + fmt
  format_tool = float(bool(tool_blocks) and good_tool_turns == len(tool_blocks))
  return {"score": score, **metrics, "format": fmt, "format_answer": float(final_ok),
          "format_tool": format_tool, "answer": answer}


def compute_score(solution_str: str, ground_truth: str | Sequence[str], style: str = "paper") -> dict:
  """Scores one decoded response against the gold answer(s).

  Args:
    solution_str: the decoded response (assistant turns and tool observations after the prompt, special
      tokens kept), as the rollout produced it.
    ground_truth: the gold answer or a list of acceptable aliases.
    style: `paper` or `partial_credit` (see the module docstring).

  Returns:
    dict with `score` (the scalar reward), `em`, `f1`, `substring_acc`, `format`, `format_answer`,
    `format_tool` (floats) and `answer` (the extracted answer string, or None).

  Raises:
    ValueError: for an unknown style or an empty/non-string ground truth (a configuration or data error;
      whatever the model wrote never raises).
  """
  aliases = as_aliases(ground_truth)
  if style == "paper":
    return _score_paper(solution_str, aliases)
  if style == "partial_credit":
    return _score_partial_credit(solution_str, aliases)
  raise ValueError(f"unknown reward style {style!r}; set algorithm.reward_style to one of {STYLES}")
