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
