"""Passages and corpus loading.

Two JSONL row formats are accepted (one JSON object per line):

* Search-R1 / FlashRAG: `{"id": "0", "contents": "\"Title\"\\ntext"}`. The first line of `contents` is
  the title (FlashRAG keeps the surrounding double quotes; we strip one pair), the rest is the text.
* Plain: `{"title": ..., "text": ...}` with an optional `"id"`.

A `.json` file holding one JSON list of such objects (the HippoRAG corpus files) is read as well. Rows
without an id get their 0-based row number as id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Iterable, Sequence


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


def corpus_hash(passages: Sequence[Passage]) -> str:
  """SHA-256 over (id, title, text) of every passage in order; identifies the corpus an index was built on."""
  h = hashlib.sha256()
  for p in passages:
    for field in (p.id, p.title, p.text):
      data = field.encode("utf-8")
      h.update(len(data).to_bytes(8, "little"))
      h.update(data)
  return h.hexdigest()
