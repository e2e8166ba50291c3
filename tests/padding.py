"""Left padding for test batches: prompts end at the last column, as the sampler and the models expect."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def left_pad(rows: Sequence[Sequence[int]], *, pad: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """`rows` right-aligned in int32 `[B, width]` ids (default width: the longest row), and their 0/1 mask."""
  width = width or max(len(r) for r in rows)
  ids = np.full((len(rows), width), pad, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, width - len(r):] = r
    mask[i, width - len(r):] = 1
  return ids, mask
