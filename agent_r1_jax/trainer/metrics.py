"""Per-step metrics: one JSON object per line in `metrics.jsonl`, mirrored to TensorBoard.

Every value written is a plain Python float or int (device arrays are fetched once, here), so the JSONL file
is readable by anything and two runs can be compared line by line. Non-finite floats are written as JSON
`null` rather than the non-standard `NaN` token.

In a Cloud Storage workdir (`gs://`) both files are written to a local mirror (`workdir.LocalMirror`: an object
cannot be appended to, and tensorboardX's own gs:// writer needs google-cloud-storage credentials of its own) and
uploaded by `sync()`: at most every `sync_every_s` seconds from `write`, whenever the trainer saves a checkpoint
(so a resumed run finds every row up to its checkpoint), and on `close()`.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping

import numpy as np

from agent_r1_jax import workdir as workdir_lib


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

  def __init__(self, workdir: str | os.PathLike, *, start_step: int = 0, tensorboard: bool = True,
               enabled: bool = True, sync_every_s: float = 60.0):
    """`enabled=False` (every process but the first of a multi-host run) converts metrics, writes nothing.
    `sync_every_s`: the most seconds a bucket workdir's copy lags behind the local mirror between checkpoints."""
    self._mirror = None
    self._file = None
    self._tb = None
    self._sync_every_s = sync_every_s
    self._last_sync = time.monotonic()
    if not enabled:
      return
    self._mirror = workdir_lib.LocalMirror(workdir, fetch=("metrics.jsonl",))
    self._path = self._mirror.local / "metrics.jsonl"
    self._truncate_from(start_step)
    self._file = self._path.open("a", encoding="utf-8")
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

      self._tb = SummaryWriter(str(self._mirror.local / "tensorboard"))

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
    if self._mirror.remote and time.monotonic() - self._last_sync >= self._sync_every_s:
      self.sync()
    return row

  def sync(self) -> None:
    """Flushes both files and, in a bucket workdir, uploads what changed (a flush only for a local one)."""
    if self._file is None:
      return
    self._file.flush()
    if self._tb is not None:
      self._tb.flush()
    self._mirror.sync()
    self._last_sync = time.monotonic()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb.close()
    if self._mirror is not None:
      self._mirror.close()
    self._file = self._tb = self._mirror = None


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """Reads back `<workdir>/metrics.jsonl` (a local or bucket workdir) as a list of dicts (in step order)."""
  path = workdir_lib.workdir_path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
