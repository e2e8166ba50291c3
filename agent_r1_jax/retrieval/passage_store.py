"""Passages on disk, read back by position through a memory map.

Layout of a store directory:

  passages.bin          record i = UTF-8 JSON `[id, title, text]`, records back to back
  passage_offsets.npy   int64 [N + 1]; record i is bytes offsets[i] : offsets[i + 1] of passages.bin
  agent_r1_passages.json  {"num_passages", "corpus_hash", "bytes"}

`PassageStore[i]` reads one record, so a server's resident memory grows with the passages its answers
touch, not with the corpus (21M Wikipedia passages are ~14 GB as a file, several times that as Python
objects). Both files are written in one streaming pass (`PassageStoreWriter`).
"""

from __future__ import annotations

import json
import mmap
import os
import pathlib
from typing import Iterator

import numpy as np

from agent_r1_jax.retrieval.corpus import CorpusHasher, Passage

MANIFEST = "agent_r1_passages.json"
_RECORDS = "passages.bin"
_OFFSETS = "passage_offsets.npy"


class PassageStoreWriter:
  """Appends passages to a store directory; `close()` writes the offsets and the manifest.

  Offsets are collected in a growing int64 buffer (8 bytes per passage: 170 MB at 21M).
  """

  def __init__(self, directory: str | os.PathLike[str]):
    self.directory = pathlib.Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)
    self._file = (self.directory / _RECORDS).open("wb")
    self._offsets = np.zeros(1 << 16, np.int64)
    self._count = 0
    self._position = 0
    self._hasher = CorpusHasher()

  def add(self, p: Passage) -> None:
    record = json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode("utf-8")
    self._file.write(record)
    self._position += len(record)
    self._count += 1
    if self._count >= len(self._offsets):
      self._offsets = np.concatenate([self._offsets, np.zeros_like(self._offsets)])
    self._offsets[self._count] = self._position
    self._hasher.update(p)

  def __len__(self) -> int:
    return self._count

  def close(self) -> dict:
    """Finishes the store; returns its manifest."""
    self._file.close()
    np.save(self.directory / _OFFSETS, self._offsets[:self._count + 1])
    manifest = {"num_passages": self._count, "corpus_hash": self._hasher.hexdigest(), "bytes": self._position}
    (self.directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def write_passage_store(passages, directory: str | os.PathLike[str]) -> dict:
  """Writes an iterable of passages as a store; returns its manifest."""
  writer = PassageStoreWriter(directory)
  for p in passages:
    writer.add(p)
  return writer.close()


class PassageStore:
  """A read-only, memory-mapped sequence of passages (`len`, `store[i]`, iteration)."""

  def __init__(self, directory: str | os.PathLike[str]):
    directory = pathlib.Path(directory)
    if not (directory / MANIFEST).is_file():
      raise FileNotFoundError(f"{directory} holds no passage store (missing {MANIFEST})")
    self.directory = directory
    self.manifest = json.loads((directory / MANIFEST).read_text())
    self.corpus_hash = self.manifest["corpus_hash"]
    self._offsets = np.load(directory / _OFFSETS, mmap_mode="r")
    if len(self._offsets) != self.manifest["num_passages"] + 1:
      raise ValueError(f"{directory}: {_OFFSETS} does not match the manifest; rewrite the store")
    with (directory / _RECORDS).open("rb") as f:
      # mmap refuses empty files; a store always holds at least the JSON of one passage.
      self._records = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

  def __len__(self) -> int:
    return len(self._offsets) - 1

  def __getitem__(self, i: int) -> Passage:
    i = int(i)
    if not 0 <= i < len(self):
      raise IndexError(f"passage {i} out of range for a store of {len(self)}")
    pid, title, text = json.loads(self._records[int(self._offsets[i]):int(self._offsets[i + 1])])
    return Passage(pid, title, text)

  def __iter__(self) -> Iterator[Passage]:
    return (self[i] for i in range(len(self)))
