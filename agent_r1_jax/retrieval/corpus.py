"""Passages and corpus loading.

Two JSONL row formats are accepted (one JSON object per line):

* Search-R1 / FlashRAG: `{"id": "0", "contents": "\"Title\"\\ntext"}`. The first line of `contents` is
  the title (FlashRAG keeps the surrounding double quotes; we strip one pair), the rest is the text.
* Plain: `{"title": ..., "text": ...}` with an optional `"id"`.

A `.json` file holding one JSON list of such objects (the HippoRAG corpus files) is read as well. Rows
without an id get their 0-based row number as id. `iter_passages` streams a corpus instead of loading it
(JSONL, and DPR's `psgs_w100.tsv`: a header `id, text, title`, tab-separated, CSV-quoted), for the offline
builders of corpora that do not fit in memory as Python objects (21M Wikipedia passages).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Callable, Iterable, Iterator, Sequence


@dataclasses.dataclass(frozen=True)
class Passage:
  """One retrievable passage."""

  id: str
  title: str
  text: str

  @property
  def contents(self) -> str:
    """The FlashRAG `contents` string: `"Title"` on the first line, then the text."""
    return f'"{self.title}"\n{self.text}'

  def to_document(self) -> dict[str, str]:
    """The JSON document served over HTTP: FlashRAG keys (`id`, `contents`) plus `title` and `text`."""
    return {"id": self.id, "contents": self.contents, "title": self.title, "text": self.text}


@dataclasses.dataclass(frozen=True)
class SearchHit:
  """A passage returned for a query, with its retriever score (higher is better)."""

  passage: Passage
  score: float


def split_contents(contents: str) -> tuple[str, str]:
  """Splits a FlashRAG `contents` string into (title, text); one pair of surrounding quotes is dropped."""
  title, _, text = contents.partition("\n")
  title = title.strip()
  if len(title) >= 2 and title.startswith('"') and title.endswith('"'):
    title = title[1:-1]
  return title, text.strip()


def passage_from_row(row: Any, row_index: int) -> Passage:
  """Builds a `Passage` from one corpus row; raises ValueError naming the row when it has neither format."""
  if not isinstance(row, dict):
    raise ValueError(f"corpus row {row_index} is a {type(row).__name__}, expected a JSON object with "
                     "'contents' or 'title'+'text'")
  pid = str(row["id"]) if row.get("id") is not None else str(row_index)
  if isinstance(row.get("contents"), str):
    title, text = split_contents(row["contents"])
    return Passage(pid, title, text)
  if isinstance(row.get("title"), str) and isinstance(row.get("text"), str):
    return Passage(pid, row["title"].strip(), row["text"].strip())
  raise ValueError(f"corpus row {row_index} has keys {sorted(row)}; expected 'contents' (FlashRAG) or "
                   "'title' and 'text'")


def passages_from_rows(rows: Iterable[Any]) -> list[Passage]:
  """Converts corpus rows (dicts) to passages; ids must be unique."""
  passages = [passage_from_row(row, i) for i, row in enumerate(rows)]
  seen: set[str] = set()
  for p in passages:
    if p.id in seen:
      raise ValueError(f"duplicate passage id {p.id!r} in the corpus; ids must be unique")
    seen.add(p.id)
  return passages


def load_corpus(path: str | os.PathLike[str], limit: int | None = None) -> list[Passage]:
  """Reads a JSONL (or JSON list) corpus file into passages.

  Args:
    path: the corpus file.
    limit: read at most this many rows (None = all).

  Returns:
    The passages in file order.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"corpus file not found: {path}")
  with path.open("r", encoding="utf-8") as f:
    first = f.read(1)
    while first and first.isspace():
      first = f.read(1)
    f.seek(0)
    if first == "[":
      rows = json.load(f)
      if limit is not None:
        rows = rows[:limit]
    else:
      rows = []
      for line_no, line in enumerate(f, start=1):
        if limit is not None and len(rows) >= limit:
          break
        if not line.strip():
          continue
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{line_no} is not valid JSON ({e.msg}); the corpus must be JSONL") from e
  if not rows:
    raise ValueError(f"corpus file {path} holds no passages")
  return passages_from_rows(rows)


class CorpusHasher:
  """SHA-256 over (id, title, text) of passages fed in order, each field length-prefixed (8 bytes, little end)."""

  def __init__(self):
    self._h = hashlib.sha256()

  def update(self, p: Passage) -> None:
    for field in (p.id, p.title, p.text):
      data = field.encode("utf-8")
      self._h.update(len(data).to_bytes(8, "little"))
      self._h.update(data)

  def hexdigest(self) -> str:
    return self._h.hexdigest()


def corpus_hash(passages: Iterable[Passage]) -> str:
  """SHA-256 over (id, title, text) of every passage in order; identifies the corpus an index was built on."""
  h = CorpusHasher()
  for p in passages:
    h.update(p)
  return h.hexdigest()


def iter_passages(path: str | os.PathLike[str], *, on_bytes: Callable[[int], None] | None = None) -> Iterator[Passage]:
  """Streams the passages of a corpus file in order, holding one line at a time.

  JSONL rows as `load_corpus` reads them; a `.tsv` file is DPR's format (header `id\ttext\ttitle`, fields
  CSV-quoted with doubled quotes). A `.json` list file is loaded whole (those corpora are small).
  `on_bytes(n)` is called with the size of each line read, for a progress bar over the file's bytes.
  Ids are not checked for uniqueness here (that would hold every id in memory).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"corpus file not found: {path}")
  with path.open("rb") as f:
    head = f.read(64).lstrip()
  if head.startswith(b"["):
    yield from load_corpus(path)
    return
  tsv = path.suffix == ".tsv"
  count = 0
  with path.open("rb") as f:
    for line_no, raw in enumerate(f, start=1):
      if on_bytes is not None:
        on_bytes(len(raw))
      line = raw.decode("utf-8")
      if not line.strip():
        continue
      if tsv:
        fields = next(csv.reader([line.rstrip("\r\n")], delimiter="\t"))
        if line_no == 1 and fields[:3] == ["id", "text", "title"]:
          continue
        if len(fields) != 3:
          raise ValueError(f"{path}:{line_no} has {len(fields)} tab-separated fields; DPR's TSV has id, text, title")
        yield Passage(fields[0], fields[2].strip(), fields[1].strip())
      else:
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{line_no} is not valid JSON ({e.msg}); the corpus must be JSONL") from e
        yield passage_from_row(row, count)
      count += 1
  if count == 0:
    raise ValueError(f"corpus file {path} holds no passages")
