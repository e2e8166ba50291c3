"""Per-step metrics: one JSON object per line in `metrics.jsonl`, mirrored to TensorBoard.

Every value written is a plain Python float or int (device arrays are fetched once, here), so the JSONL file
is readable by anything and two runs can be compared line by line. Non-finite floats are written as JSON
`null` rather than the non-standard `NaN` token.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Mapping

import numpy as np


def to_python_scalars(metrics: Mapping[str, Any]) -> dict[str, float | int | str | None]:
  """Converts numpy / JAX scalars to Python numbers; non-finite floats become None."""
  out: dict[str, float | int | str | None] = {}
  for key, value in metrics.items():
    if isinstance(value, str):
      out[key] = value
      continue
    array = np.asarray(value)
    if array.size != 1:
      raise ValueError(f"metric {key!r} must be a scalar, got shape {array.shape}")
    item = array.item()
    if isinstance(item, float) and not math.isfinite(item):
      out[key] = None
    else:
      out[key] = item
  return out


class MetricsWriter:
  """Appends step metrics to `<workdir>/metrics.jsonl` and to TensorBoard event files.

  On resume the JSONL file is truncated to the steps strictly before `start_step`, so a run interrupted
  after logging but before checkpointing does not leave duplicate or orphaned lines.
  """

  def __init__(self, workdir: str | pathlib.Path, *, start_step: int = 0, tensorboard: bool = True,
               enabled: bool = True):
    """`enabled=False` (every process but the first of a multi-host run) converts metrics, writes nothing."""
    self._path = pathlib.Path(workdir) / "metrics.jsonl"
    self._file = None
    self._tb = None
    if not enabled:
      return
    self._path.parent.mkdir(parents=True, exist_ok=True)
    self._truncate_from(start_step)
    self._file = self._path.open("a", encoding="utf-8")
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

      self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tensorboard"))

  def _truncate_from(self, start_step: int) -> None:
    if not self._path.exists():
      return
    kept = []
    for line in self._path.read_text(encoding="utf-8").splitlines():
      if line.strip() and json.loads(line).get("step", -1) < start_step:
        kept.append(line)
    self._path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Writes one step's metrics and returns them as Python scalars."""
    row = {"step": int(step), **to_python_scalars(metrics)}
    if self._file is None:
      return row
    self._file.write(json.dumps(row, sort_keys=True) + "\n")
    self._file.flush()
    if self._tb is not None:
      for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)):
          self._tb.add_scalar(key, value, global_step=step)
    return row

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb.close()


def read_metrics(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
  """Reads back `<workdir>/metrics.jsonl` as a list of dicts (in step order)."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
