"""Readers for the official multi-hop QA releases, each row mapped to the shared example dict.

Example dict: `id, data_source, question, answers (gold first, then aliases), supporting_titles, contexts
([{title, text}], the release's paragraphs), type`.

Row shapes recognised (per file, from the first row's keys):

* `official`  HotpotQA `hotpot_train_v1.1.json` / `hotpot_dev_distractor_v1.json` and 2WikiMultihopQA
              `train.json` / `dev.json`: `_id, question, answer, supporting_facts [[title, sent_id]],
              context [[title, [sentences]]]` (+ `type`).
* `hf`        the Hugging Face `hotpot_qa` schema (JSONL or parquet): `id, question, answer, type,
              supporting_facts {title: [..], sent_id: [..]}, context {title: [..], sentences: [[..]]}`.
* `musique`   MuSiQue `musique_ans_v1.0_*.jsonl`: `id, question, answer, answer_aliases, answerable,
              paragraphs [{title, paragraph_text, is_supporting}]`; unanswerable rows are left out.
* `ircot`     the IRCoT processed files: `question_id, question_text, answers_objects [{spans}],
              contexts [{title, paragraph_text, is_supporting}]`.
* `qa`        question/answer files: `question` and `answer` (a string or a list) or `golden_answers`, with an
              optional `id` / `_id` / `idx`.

A row with an empty question or no answer is skipped and reported with its id; so is a repeated id.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Callable, Iterable, Mapping

DATA_SOURCES = ("hotpotqa", "2wikimultihopqa", "musique")


@dataclasses.dataclass
class ReadReport:
  """What a reader kept and what it skipped (with reasons), for the prepare command's summary."""
  path: str
  data_source: str
  row_format: str = ""
  examples: list[dict] = dataclasses.field(default_factory=list)
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (row id, reason)
  unanswerable: int = 0

  @property
  def num_rows(self) -> int:
    return len(self.examples) + len(self.skipped) + self.unanswerable


def read_rows(path: str | pathlib.Path) -> list[dict]:
  """All rows of a `.json` (a list), `.jsonl` or `.parquet` file.

  Raises:
    ValueError: for a missing file, an unknown extension, or content that is not a list of JSON objects.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f"data file not found: {path}")
  suffix = path.suffix.lower()
  if suffix == ".parquet":
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
    rows = pq.read_table(path).to_pylist()
  elif suffix == ".jsonl":
    rows = []
    with open(path, encoding="utf-8") as f:
      for line_no, line in enumerate(f, start=1):
        if line.strip():
          try:
            rows.append(json.loads(line))
          except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{line_no} is not valid JSON ({e.msg}); fix or remove that line") from e
  elif suffix == ".json":
    with open(path, encoding="utf-8") as f:
      try:
        rows = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg}); JSON Lines files must end in .jsonl") from e
  else:
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .json, .jsonl or .parquet")
  if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
    raise ValueError(f"{path} must hold a list of JSON objects (one example each)")
  return rows


def detect_format(row: Mapping[str, Any]) -> str:
  """The row shape (`official`, `hf`, `musique`, `ircot`, `qa`) from a row's keys."""
  if "paragraphs" in row and "question" in row:
    return "musique"
  if "question_text" in row and "answers_objects" in row:
    return "ircot"
  if "context" in row and "question" in row:
    return "hf" if isinstance(row["context"], Mapping) else "official"
  if "question" in row and ("answer" in row or "golden_answers" in row):
    return "qa"
  raise ValueError(f"unrecognised row shape with keys {sorted(row)}; expected a HotpotQA/2Wiki official, "
                   f"Hugging Face hotpot_qa, MuSiQue, IRCoT or question/answer row")


def _join_sentences(sentences: Iterable[str]) -> str:
  """Paragraph text from sentences. The releases keep each sentence's leading space (" She was ..."), so the
  paragraph is their plain concatenation, as the official HotpotQA tooling builds it."""
  return "".join(str(s) for s in sentences).strip()


def _unique(items: Iterable[str]) -> list[str]:
  return list(dict.fromkeys(items))


def _answers(value: Any) -> list[str]:
  if value is None:
    return []
  values = value if isinstance(value, (list, tuple)) else [value]
  return [str(v).strip() for v in values if v is not None and str(v).strip()]


def _official(row: Mapping[str, Any]) -> dict:
  facts = row.get("supporting_facts") or []
  return {
      "id": row.get("_id", row.get("id")),
      "question": row.get("question"),
      "answers": _answers(row.get("answer")),
      "supporting_titles": _unique(str(f[0]) for f in facts if f),
      "contexts": [{"title": str(c[0]), "text": _join_sentences(c[1])} for c in row.get("context") or []],
      "type": str(row.get("type") or ""),
  }


def _hf(row: Mapping[str, Any]) -> dict:
  facts = row.get("supporting_facts") or {}
  context = row.get("context") or {}
  return {
      "id": row.get("id", row.get("_id")),
      "question": row.get("question"),
      "answers": _answers(row.get("answer")),
      "supporting_titles": _unique(str(t) for t in facts.get("title", [])),
      "contexts": [{"title": str(t), "text": _join_sentences(s)}
                   for t, s in zip(context.get("title", []), context.get("sentences", []))],
      "type": str(row.get("type") or ""),
  }


def _musique(row: Mapping[str, Any]) -> dict:
  paragraphs = row.get("paragraphs") or []
  row_id = str(row.get("id", ""))
  return {
      "id": row.get("id"),
      "question": row.get("question"),
      "answers": _unique(_answers(row.get("answer")) + _answers(row.get("answer_aliases"))),
      "supporting_titles": _unique(str(p["title"]) for p in paragraphs if p.get("is_supporting")),
      "contexts": [{"title": str(p["title"]), "text": str(p["paragraph_text"]).strip()} for p in paragraphs],
      "type": row_id.split("__")[0] if "__" in row_id else "",
  }


def _ircot(row: Mapping[str, Any]) -> dict:
  spans = [s for obj in row.get("answers_objects") or [] for s in obj.get("spans", [])]
  contexts = row.get("contexts") or []
  return {
      "id": row.get("question_id"),
      "question": row.get("question_text"),
      "answers": _unique(_answers(spans)),
      "supporting_titles": _unique(str(c["title"]) for c in contexts if c.get("is_supporting")),
      "contexts": [{"title": str(c["title"]), "text": str(c["paragraph_text"]).strip()} for c in contexts],
      "type": "",
  }


def _qa(row: Mapping[str, Any]) -> dict:
  row_id = row.get("id", row.get("_id", row.get("idx")))
  answers = _answers(row.get("answer")) if "answer" in row else _answers(row.get("golden_answers"))
  return {"id": row_id, "question": row.get("question"), "answers": answers, "supporting_titles": [],
          "contexts": [], "type": ""}


_PARSERS: dict[str, Callable[[Mapping[str, Any]], dict]] = {
    "official": _official, "hf": _hf, "musique": _musique, "ircot": _ircot, "qa": _qa}


def read_source(path: str | pathlib.Path, data_source: str,
                aliases: Mapping[str, list[str]] | None = None) -> ReadReport:
  """Reads one release file as examples of `data_source`.

  Args:
    path: the file (.json / .jsonl / .parquet).
    data_source: `hotpotqa`, `2wikimultihopqa` or `musique` (stored with each example; picks the scorer).
    aliases: optional extra gold aliases by example id (2Wiki's `id_aliases.json`).
  """
  if data_source not in DATA_SOURCES:
    raise ValueError(f"data_source must be one of {DATA_SOURCES}, got {data_source!r}")
  rows = read_rows(path)
  report = ReadReport(path=str(path), data_source=data_source)
  if not rows:
    return report
  report.row_format = detect_format(rows[0])
  parse = _PARSERS[report.row_format]
  seen: set[str] = set()
  for index, row in enumerate(rows):
    if report.row_format == "musique" and row.get("answerable") is False:
      report.unanswerable += 1
      continue
    try:
      example = parse(row)
    except (KeyError, TypeError, IndexError, AttributeError) as e:
      report.skipped.append((str(row.get("_id", row.get("id", f"row {index}"))), f"malformed row ({e!r})"))
      continue
    example_id = str(example["id"]) if example["id"] not in (None, "") else f"{data_source}-{index}"
    example["id"] = example_id
    question = example["question"]
    if not isinstance(question, str) or not question.strip():
      report.skipped.append((example_id, "empty question"))
      continue
    if aliases and example_id in aliases:
      example["answers"] = _unique(example["answers"] + _answers(aliases[example_id]))
    if not example["answers"]:
      report.skipped.append((example_id, "missing answer"))
      continue
    if example_id in seen:
      report.skipped.append((example_id, "duplicate id"))
      continue
    seen.add(example_id)
    example["question"] = question.strip()
    example["data_source"] = data_source
    report.examples.append(example)
  return report


def read_2wiki_aliases(path: str | pathlib.Path) -> dict[str, list[str]]:
  """2WikiMultihopQA `id_aliases.json` (JSON Lines of {"Q_id", "aliases", "demonyms"}) -> {id: aliases}."""
  out: dict[str, list[str]] = {}
  for row in read_rows(pathlib.Path(path)) if str(path).endswith((".jsonl", ".parquet")) else _read_json_lines(path):
    out[str(row["Q_id"])] = _answers(row.get("aliases")) + _answers(row.get("demonyms"))
  return out


def _read_json_lines(path: str | pathlib.Path) -> list[dict]:
  """`id_aliases.json` is JSON Lines despite its extension; accept either layout."""
  text = pathlib.Path(path).read_text(encoding="utf-8").strip()
  if text.startswith("["):
    return json.loads(text)
  return [json.loads(line) for line in text.splitlines() if line.strip()]
