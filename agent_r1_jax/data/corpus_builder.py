"""Turns the context paragraphs of prepared splits into a retrieval corpus (Search-R1 JSONL).

For small real experiments without the KILT / wiki-18 index: the distractor-setting paragraphs of HotpotQA,
2Wiki and MuSiQue hold every supporting paragraph plus hard distractors, so BM25 over their union is a small but
honest retrieval task.

  python -m agent_r1_jax.data.corpus_builder --data_dir=DIR --splits=validation_hotpotqa --output=corpus.jsonl

Rows: `{"id": "<n>", "contents": "\\"<title>\\"\\n<text>"}`, one per distinct (title, text), in first-seen order.
"""

from __future__ import annotations

import json
import pathlib
from typing import Iterable, Mapping, Sequence

from absl import app, flags

from agent_r1_jax.data import tfds_store


def corpus_rows(examples: Iterable[Mapping]) -> list[dict[str, str]]:
  """Distinct context paragraphs of `examples` as Search-R1 corpus rows."""
  seen: dict[tuple[str, str], None] = {}
  for example in examples:
    for context in example.get("contexts", []):
      title, text = str(context["title"]).strip(), str(context["text"]).strip()
      if title or text:
        seen.setdefault((title, text), None)
  return [{"id": str(i), "contents": f"\"{title}\"\n{text}"} for i, (title, text) in enumerate(seen)]


def write_corpus(examples: Iterable[Mapping], output: str | pathlib.Path) -> int:
  """Writes the corpus JSONL; returns the number of passages.

  Raises:
    ValueError: when the examples carry no context paragraphs (e.g. question/answer-only files).
  """
  rows = corpus_rows(examples)
  if not rows:
    raise ValueError("the examples have no context paragraphs to build a corpus from; prepare splits from "
                     "releases that include them (HotpotQA distractor, 2Wiki, MuSiQue, IRCoT files)")
  output = pathlib.Path(output)
  output.parent.mkdir(parents=True, exist_ok=True)
  with open(output, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  return len(rows)


def build_from_prepared(data_dir: str | pathlib.Path, splits: Sequence[str], output: str | pathlib.Path, *,
                        dataset_name: str = "multihopqa") -> int:
  """Corpus of the contexts of prepared `splits` of `dataset_name` under `data_dir`."""

  def examples():
    for split in splits:
      yield from tfds_store.load_split(data_dir, dataset_name, split)

  return write_corpus(examples(), output)


def _define_flags() -> None:
  flags.DEFINE_string("data_dir", None, "Directory of prepared TFDS datasets.")
  flags.DEFINE_string("dataset_name", "multihopqa", "Prepared dataset name.")
  flags.DEFINE_list("splits", None, "Splits whose context paragraphs form the corpus.")
  flags.DEFINE_string("output", None, "Output corpus JSONL path.")


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  if not (f.data_dir and f.splits and f.output):
    raise app.UsageError("--data_dir, --splits and --output are required")
  count = build_from_prepared(f.data_dir, f.splits, f.output, dataset_name=f.dataset_name)
  print(f"wrote {count} passages to {f.output}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
