"""Sampling settings and per-row stop reasons."""

from __future__ import annotations

import dataclasses
import enum


class StopReason(enum.IntEnum):
  """Why a row's segment ended (values are what `Segment.stop_reasons` holds)."""

  NONE = 0        # row inactive this segment (budget 0): sampled nothing
  STOP_TOKEN = 1  # completed a stop sequence, e.g. sampled a stop token (its tokens are in the segment)
  LENGTH = 2      # spent its budget without a stop token


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How the next token is drawn from the logits z (hashable: a static jit argument).

  greedy (or temperature == 0): argmax z. Otherwise sample from softmax(z / temperature) restricted to
  the `top_k` largest (0 = no limit) and then to the smallest set of most likely tokens whose
  probability mass reaches `top_p` (1.0 = no limit). The reported log-prob of a token is always
  log_softmax(z / temperature) (temperature 1 when greedy), untruncated: what the learner recomputes.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

  @property
  def is_greedy(self) -> bool:
    return self.greedy or self.temperature == 0

  @property
  def logprob_temperature(self) -> float:
    return 1.0 if self.is_greedy else float(self.temperature)
