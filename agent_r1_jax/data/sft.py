"""Supervised warm-up examples: prompt ids, response ids and the action mask, tokenized like the rollout.

The rollout driver tokenizes the rendered prompt once (`add_special_tokens=False`), appends the ids the policy
samples for each assistant turn, and appends each observation tokenized on its own. An SFT example built here
follows the same rule, piece by piece, so warm-up trains on exactly the token sequences RL will later see:

  prompt_ids   = enc(prompt_text)
  response_ids = enc(seg_1) ++ enc(obs_1) ++ enc(seg_2) ++ ... ++ enc(seg_n)
  action_mask  = [1]*|enc(seg_1)| ++ [0]*|enc(obs_1)| ++ ...        (1 = written by the assistant)

with enc(s) = tokenizer(s, add_special_tokens=False).input_ids.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass
class SFTExample:
  """One tokenized trajectory: int32 arrays `prompt_ids` [P], `response_ids` [R], `action_mask` [R]."""
  prompt_ids: np.ndarray
  response_ids: np.ndarray
  action_mask: np.ndarray
  example_id: str = ""


def tokenize_segments(tokenizer: Any, segments: Sequence[tuple[str, bool]]) -> tuple[np.ndarray, np.ndarray]:
  """Tokenizes each (text, is_action) piece separately; returns (ids [R], action_mask [R]) as int32."""
  texts = [text for text, _ in segments]
  encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
  ids = [t for piece in encoded for t in piece]
  mask = [int(is_action) for piece, (_, is_action) in zip(encoded, segments) for _ in piece]
  return np.asarray(ids, np.int32), np.asarray(mask, np.int32)


def tokenize_trajectory(tokenizer: Any, prompt_text: str, segments: Sequence[tuple[str, bool]],
                        example_id: str = "") -> SFTExample:
  """The SFT example for one rendered prompt and its response pieces."""
  prompt_ids = np.asarray(tokenizer(prompt_text, add_special_tokens=False)["input_ids"], np.int32)
  response_ids, action_mask = tokenize_segments(tokenizer, segments)
  return SFTExample(prompt_ids=prompt_ids, response_ids=response_ids, action_mask=action_mask,
                    example_id=example_id)


def first_turns(example: SFTExample, turns: int) -> SFTExample:
  """`example` cut right after its `turns`-th assistant turn (the whole example when it has fewer turns).

  The result is a prefix of the same token sequence, so a model's loss on its action tokens equals the loss
  on those tokens inside the full example; it just costs less attention. `turns` <= 0 keeps everything.
  """
  if turns <= 0:
    return example
  mask = np.asarray(example.action_mask)
  turn_ends = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])) == -1)  # one past each action run
  if len(turn_ends) <= turns:
    return example
  end = int(turn_ends[turns - 1])
  return dataclasses.replace(example, response_ids=example.response_ids[:end], action_mask=mask[:end])


def collate(examples: Sequence[SFTExample], *, prompt_length: int, response_length: int,
            pad_id: int) -> dict[str, np.ndarray]:
  """Fixed-shape arrays in the rollout's `TrajectoryBatch` layout (B = len(examples)).

  Returns:
    prompt_ids int32 [B, P] left-padded with `pad_id`, prompt_mask int32 [B, P] (1 on real tokens),
    response_ids int32 [B, R] right-padded, response_mask int32 [B, R], action_mask int32 [B, R]
    (0 on padding), and truncated bool [B] (response longer than R and cut on the right).

  Raises:
    ValueError: if a prompt is longer than `prompt_length` (raise it; prompts are never cut) or the batch is
      empty.
  """
  if not examples:
    raise ValueError("collate needs at least one example")
  b = len(examples)
  out = {
      "prompt_ids": np.full((b, prompt_length), pad_id, np.int32),
      "prompt_mask": np.zeros((b, prompt_length), np.int32),
      "response_ids": np.full((b, response_length), pad_id, np.int32),
      "response_mask": np.zeros((b, response_length), np.int32),
      "action_mask": np.zeros((b, response_length), np.int32),
      "truncated": np.zeros((b,), bool),
  }
  for i, ex in enumerate(examples):
    p = len(ex.prompt_ids)
    if p > prompt_length:
      raise ValueError(f"example {ex.example_id or i} has a {p}-token prompt, longer than prompt_length="
                       f"{prompt_length}; raise the prompt length")
    out["prompt_ids"][i, prompt_length - p:] = ex.prompt_ids
    out["prompt_mask"][i, prompt_length - p:] = 1
    r = min(len(ex.response_ids), response_length)
    out["response_ids"][i, :r] = ex.response_ids[:r]
    out["response_mask"][i, :r] = 1
    out["action_mask"][i, :r] = ex.action_mask[:r]
    out["truncated"][i] = len(ex.response_ids) > response_length
  return out
