"""Run directories on a local disk or in Cloud Storage (`--workdir=gs://bucket/run`), behind one path type.

Everything a run writes or reads back under its workdir (config.json, orbax checkpoints, metrics.jsonl and
TensorBoard events, summary.json, samples.jsonl, curves.png, the Hugging Face export, evaluation outputs, the
paper tables) goes through `workdir_path`, which returns an `etils.epath.Path`: the path type orbax itself takes.
A local path behaves exactly like `pathlib.Path`; a `gs://` path goes through fsspec's `gcsfs` for files and
listings, while orbax writes the checkpoint arrays with tensorstore's own GCS driver. Both use the machine's
Google credentials (a TPU VM's service account, or `gcloud auth application-default login`).

Two kinds of writer cannot address a bucket directly, and get a local directory instead:
  - `staged_dir`: writers that need a real directory (safetensors, `tokenizer.save_pretrained`) write into a
    temporary one that is uploaded when they finish;
  - `LocalMirror`: files that grow line by line (metrics.jsonl, TensorBoard event files), since a Cloud Storage
    object cannot be appended to; they live in a local directory whose changed files `sync()` uploads.
For a local workdir both hand out the workdir itself and upload nothing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import re
import shutil
import tempfile
from typing import Iterable, Iterator

from etils import epath

# Schemes a workdir may use, with the package that epath's fsspec backend needs for each.
_BACKENDS = {"gs": "gcsfs"}
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_COPY_CHUNK = 16 << 20


def scheme(path: str | os.PathLike) -> str | None:
  """`"gs"` for `gs://bucket/dir`, None for a local path."""
  match = _SCHEME.match(os.fspath(path))
  return match.group(1).lower() if match else None


def is_remote(path: str | os.PathLike) -> bool:
  """Whether `path` names an object store (`gs://...`) rather than the local file system."""
  return scheme(path) is not None


def require_backend(path: str | os.PathLike) -> None:
  """Raises one ValueError, naming what to install or use instead, when `path` cannot be opened here: an
  unsupported scheme, or `gs://` without the `gcsfs` package."""
  name = scheme(path)
  if name is None:
    return
  package = _BACKENDS.get(name)
  if package is None:
    raise ValueError(f"{path}: {name}:// is not supported; use a local directory or gs://bucket/dir")
  if importlib.util.find_spec(package) is None:
    raise ValueError(f"{path} needs the {package} package, which is missing from this environment: install the "
                     f"pinned requirements (pip install -r requirements.txt, or pip install -e .)")


def workdir_path(path: str | os.PathLike) -> epath.Path:
  """`path` (a local directory or `gs://bucket/dir`) as the `epath.Path` every workdir read and write goes
  through; a local path is kept as given (relative stays relative)."""
  require_backend(path)
  return epath.Path(path)


def absolute(path: str | os.PathLike) -> epath.Path:
  """A local path made absolute with symlinks resolved (orbax wants one); a bucket path unchanged."""
  if is_remote(path):
    return workdir_path(path)
  return epath.Path(pathlib.Path(path).resolve())


def copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
  """Copies one file between any two places (local or bucket), streaming it in chunks."""
  src, dst = workdir_path(src), workdir_path(dst)
  if not is_remote(dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
  with src.open("rb") as fin, dst.open("wb") as fout:
    shutil.copyfileobj(fin, fout, _COPY_CHUNK)


def upload_tree(local: pathlib.Path, dst: str | os.PathLike, *, files: Iterable[pathlib.Path] | None = None
                ) -> None:
  """Copies every file under the local directory `local` (or only `files`, paths inside it) to `dst`,
  keeping the relative layout."""
  dst = workdir_path(dst)
  for f in sorted(local.rglob("*")) if files is None else files:
    if f.is_file():
      copy_file(f, dst / f.relative_to(local).as_posix())


@contextlib.contextmanager
def staged_dir(dst: str | os.PathLike) -> Iterator[pathlib.Path]:
  """A local directory path for writers that need one: `dst` itself when local (not created here: the writer
  makes it, as it would without this); for a bucket, a temporary directory whose files are uploaded to `dst`
  when the block ends without an error (nothing is uploaded otherwise)."""
  if not is_remote(dst):
    yield pathlib.Path(dst)
    return
  with tempfile.TemporaryDirectory(prefix="agent_r1_stage_") as tmp:
    yield pathlib.Path(tmp)
    upload_tree(pathlib.Path(tmp), dst)


class LocalMirror:
  """A local directory standing in for the workdir `target`, for files that are appended to.

  For a local `target`, `local` is `target` itself and `sync` does nothing. For a bucket, `local` is a temporary
  directory: `fetch` names files copied down first (so a resumed run continues its metrics.jsonl), and `sync()`
  uploads every file that changed (size or modification time) since the last sync; `close()` syncs a last time
  and removes the directory.
  """

  def __init__(self, target: str | os.PathLike, *, fetch: Iterable[str] = ()):
    self.target = workdir_path(target)
    self._tmp = None
    self._synced: dict[pathlib.Path, tuple[int, int]] = {}
    if not is_remote(target):
      self.local = pathlib.Path(target)
      self.local.mkdir(parents=True, exist_ok=True)
      return
    self._tmp = tempfile.TemporaryDirectory(prefix="agent_r1_mirror_")
    self.local = pathlib.Path(self._tmp.name)
    for name in fetch:
      if (self.target / name).exists():
        copy_file(self.target / name, self.local / name)

  @property
  def remote(self) -> bool:
    return self._tmp is not None

  def sync(self) -> None:
    """Uploads the files changed since the last sync (a no-op for a local target)."""
    if self._tmp is None:
      return
    changed = []
    for f in sorted(self.local.rglob("*")):
      if f.is_file():
        stat = f.stat()
        if self._synced.get(f) != (stat.st_size, stat.st_mtime_ns):
          changed.append((f, (stat.st_size, stat.st_mtime_ns)))
    upload_tree(self.local, self.target, files=[f for f, _ in changed])
    self._synced.update(changed)

  def close(self) -> None:
    """Syncs a last time and removes the local copy."""
    if self._tmp is None:
      return
    self.sync()
    self._tmp.cleanup()
    self._tmp = None
