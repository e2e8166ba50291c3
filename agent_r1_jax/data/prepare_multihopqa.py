"""Converts the official multi-hop QA releases into TFDS ArrayRecord datasets (no TensorFlow needed).

  python -m agent_r1_jax.data.prepare_multihopqa \\
      --hotpotqa_train=hotpot_train_v1.1.json --hotpotqa_dev=hotpot_dev_distractor_v1.json \\
      --twowiki_train=2wiki/train.json --twowiki_dev=2wiki/dev.json --musique_dev=musique_ans_v1.0_dev.jsonl \\
      --output_dir=~/data/agent_r1 [--train_size=51200] [--tokenizer=PATH] [--corpus_output=corpus.jsonl]

Writes dataset `multihopqa` with splits
  train                         the paper's mix: `train_size` examples drawn equally and at random (seeded)
                                from the HotpotQA and 2Wiki train sets, shuffled (51,200 in the paper)
  validation_hotpotqa, validation_2wikimultihopqa, validation_musique   the dev sets given
and prints, per input file, the rows kept and skipped (with ids and reasons), the split sizes, and with
`--tokenizer` the prompt token counts (min / mean / max) of each split as the agent will see them.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
import statistics
from typing import Any, Mapping, Sequence

from absl import app, flags, logging

from agent_r1_jax import paths
from agent_r1_jax.data import corpus_builder, prompts, sources, tfds_store

DATASET_NAME = "multihopqa"
PAPER_TRAIN_SIZE = 51200


@dataclasses.dataclass
class PrepareReport:
  """What `prepare` read, kept, skipped and wrote."""
  dataset_dir: pathlib.Path
  reads: list[sources.ReadReport]
  split_sizes: dict[str, int]
  train_composition: dict[str, int]
  prompt_tokens: dict[str, dict[str, float]]
  corpus_passages: int | None = None
  dropped_overlap: dict[str, int] = dataclasses.field(default_factory=dict)  # split -> questions also in train

  def lines(self, max_ids: int = 10) -> list[str]:
    out = []
    for r in self.reads:
      line = (f"{r.data_source:16s} {r.path} ({r.row_format or 'empty'}): {r.num_rows} rows, "
              f"{len(r.examples)} kept, {len(r.skipped)} skipped")
      if r.unanswerable:
        line += f", {r.unanswerable} unanswerable left out"
      out.append(line)
      for row_id, reason in r.skipped[:max_ids]:
        out.append(f"    skipped {row_id}: {reason}")
      if len(r.skipped) > max_ids:
        out.append(f"    ... and {len(r.skipped) - max_ids} more")
    for split, size in self.split_sizes.items():
      extra = (" (" + ", ".join(f"{k} {v}" for k, v in self.train_composition.items()) + ")"
               if split == "train" else "")
      if self.dropped_overlap.get(split):
        extra += f" ({self.dropped_overlap[split]} questions also in train left out)"
      out.append(f"split {split}: {size} examples{extra}")
    for split, stats in self.prompt_tokens.items():
      out.append(f"prompt tokens {split} (first {int(stats['count'])}): min {int(stats['min'])}, "
                 f"mean {stats['mean']:.1f}, max {int(stats['max'])}")
    if self.corpus_passages is not None:
      out.append(f"corpus: {self.corpus_passages} passages")
    out.append(f"dataset written to {self.dataset_dir}")
    return out


def mix_train(pools: Mapping[str, Sequence[dict]], train_size: int | None, seed: int) -> list[dict]:
  """Draws `train_size` examples equally from each pool (without replacement), then shuffles.

  A pool smaller than its share contributes all its examples. `train_size=None` keeps every example.
  """
  rng = random.Random(seed)
  names = sorted(pools)
  drawn: list[dict] = []
  for i, name in enumerate(names):
    pool = list(pools[name])
    if train_size is None:
      drawn.extend(pool)
      continue
    share = train_size // len(names) + (1 if i < train_size % len(names) else 0)
    drawn.extend(rng.sample(pool, min(share, len(pool))))
  rng.shuffle(drawn)
  return drawn


def normalized_question(text: str) -> str:
  """A question's identity across releases (case and whitespace differ between processed copies)."""
  return " ".join(str(text).lower().split())


def drop_overlap(examples: Sequence[dict], train: Sequence[dict]) -> tuple[list[dict], int]:
  """`examples` without those whose question (`normalized_question`) is also a train question; and how many."""
  seen = {normalized_question(e["question"]) for e in train}
  kept = [e for e in examples if normalized_question(e["question"]) not in seen]
  return kept, len(examples) - len(kept)


def prompt_token_stats(tokenizer: Any, examples: Sequence[Mapping], limit: int = 1000) -> dict[str, float]:
  """Token counts of rendered prompts (with the search tool schema) over the first `limit` examples."""
  schema = [prompts.search_tool_schema()]
  texts = [prompts.render_prompt(tokenizer, e["question"], schema) for e in list(examples)[:limit]]
  counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
  return {"count": len(counts), "min": min(counts), "mean": statistics.fmean(counts), "max": max(counts)}


def prepare(*, hotpotqa_train: str | None = None, hotpotqa_dev: str | None = None,
            twowiki_train: str | None = None, twowiki_dev: str | None = None, twowiki_aliases: str | None = None,
            musique_dev: str | None = None, output_dir: str | pathlib.Path | None = None,
            dataset_name: str = DATASET_NAME, train_size: int | None = PAPER_TRAIN_SIZE, seed: int = 0,
            overwrite: bool = False, tokenizer: Any = None, prompt_stats_limit: int = 1000,
            corpus_output: str | pathlib.Path | None = None, corpus_with_train: bool = False,
            drop_dev_overlap: bool = False) -> PrepareReport:
  """Reads the given release files and writes the TFDS dataset; returns the report.

  The corpus holds the validation splits' context paragraphs, and the train split's too with `corpus_with_train`
  (a run that trains on real questions must be able to retrieve their passages). With `drop_dev_overlap`, a
  validation question that is also a train question (different processed copies of one dev set share rows) is
  left out of its split, so held-out numbers are held out.

  Raises:
    ValueError: when no input file is given, a file is missing or unreadable, a source yields no usable
      example, or the dataset exists and `overwrite` is False.
  """
  aliases = sources.read_2wiki_aliases(twowiki_aliases) if twowiki_aliases else None
  inputs = [("train", "hotpotqa", hotpotqa_train), ("train", "2wikimultihopqa", twowiki_train),
            ("validation", "hotpotqa", hotpotqa_dev), ("validation", "2wikimultihopqa", twowiki_dev),
            ("validation", "musique", musique_dev)]
  inputs = [(kind, source, path) for kind, source, path in inputs if path]
  if not inputs:
    raise ValueError("give at least one input file (--hotpotqa_train, --hotpotqa_dev, --twowiki_train, "
                     "--twowiki_dev, --musique_dev)")
  reads, train_pools, splits = [], {}, {}
  for kind, source, path in inputs:
    report = sources.read_source(path, source, aliases if source == "2wikimultihopqa" else None)
    reads.append(report)
    if not report.examples:
      raise ValueError(f"{path} gave no usable {source} examples ({len(report.skipped)} skipped); check the file")
    if kind == "train":
      train_pools[source] = report.examples
    else:
      splits[f"validation_{source}"] = report.examples
  composition = {}
  if train_pools:
    if train_size is not None and train_size < 1:
      raise ValueError(f"train_size must be positive (or None for everything), got {train_size}")
    train = mix_train(train_pools, train_size, seed)
    composition = {s: sum(1 for e in train if e["data_source"] == s) for s in sorted(train_pools)}
    splits = {"train": train, **splits}
  dropped = {}
  if drop_dev_overlap and "train" in splits:
    for split in [name for name in splits if name != "train"]:
      splits[split], dropped[split] = drop_overlap(splits[split], splits["train"])
      if not splits[split]:
        raise ValueError(f"every question of {split} is also a train question; give a different dev file")
  output_dir = pathlib.Path(output_dir) if output_dir else paths.cache_dir() / "datasets"
  dataset_dir = tfds_store.write_dataset(dataset_name, splits, output_dir, overwrite=overwrite,
                                         description="Multi-hop QA (HotpotQA, 2WikiMultihopQA, MuSiQue) for "
                                                     "agent_r1_jax.")
  stats = ({split: prompt_token_stats(tokenizer, rows, prompt_stats_limit) for split, rows in splits.items()}
           if tokenizer is not None else {})
  corpus_count = None
  if corpus_output:
    corpus_count = corpus_builder.write_corpus(
        (e for split, rows in splits.items() if corpus_with_train or split != "train" for e in rows), corpus_output)
  return PrepareReport(dataset_dir=dataset_dir, reads=reads, split_sizes={s: len(r) for s, r in splits.items()},
                       train_composition=composition, prompt_tokens=stats, corpus_passages=corpus_count,
                       dropped_overlap=dropped)


def _define_flags() -> None:
  flags.DEFINE_string("hotpotqa_train", None, "HotpotQA train file (official JSON, HF JSONL/parquet, IRCoT).")
  flags.DEFINE_string("hotpotqa_dev", None, "HotpotQA dev file (distractor setting).")
  flags.DEFINE_string("twowiki_train", None, "2WikiMultihopQA train.json.")
  flags.DEFINE_string("twowiki_dev", None, "2WikiMultihopQA dev.json.")
  flags.DEFINE_string("twowiki_aliases", None, "2WikiMultihopQA id_aliases.json (optional extra gold aliases).")
  flags.DEFINE_string("musique_dev", None, "MuSiQue musique_ans_v1.0_dev.jsonl.")
  flags.DEFINE_string("output_dir", None, "Where the TFDS dataset is written (default: the cache dir).")
  flags.DEFINE_string("dataset_name", DATASET_NAME, "TFDS dataset name.")
  flags.DEFINE_integer("train_size", PAPER_TRAIN_SIZE, "Size of the train mix; 0 keeps every train example.")
  flags.DEFINE_integer("seed", 0, "Seed of the train draw and shuffle.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing dataset of the same name.")
  flags.DEFINE_string("tokenizer", None, "HF tokenizer directory: report prompt token counts with it.")
  flags.DEFINE_string("corpus_output", None, "Also write the validation contexts as a retrieval corpus JSONL.")
  flags.DEFINE_bool("corpus_with_train", False, "Put the train split's contexts in the corpus too.")
  flags.DEFINE_bool("drop_dev_overlap", False, "Leave out validation questions that are also train questions.")
  flags.DEFINE_alias("out_dir", "output_dir")
  flags.DEFINE_alias("corpus_out", "corpus_output")


def main(argv: Sequence[str]) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)  # TFDS logs every shard it writes; the summary below says it all
  f = flags.FLAGS
  tokenizer = None
  if f.tokenizer:
    import transformers  # pylint: disable=import-outside-toplevel
    tokenizer = transformers.AutoTokenizer.from_pretrained(f.tokenizer)
  try:
    report = prepare(hotpotqa_train=f.hotpotqa_train, hotpotqa_dev=f.hotpotqa_dev, twowiki_train=f.twowiki_train,
                     twowiki_dev=f.twowiki_dev, twowiki_aliases=f.twowiki_aliases, musique_dev=f.musique_dev,
                     output_dir=f.output_dir, dataset_name=f.dataset_name, train_size=f.train_size or None,
                     seed=f.seed, overwrite=f.overwrite, tokenizer=tokenizer, corpus_output=f.corpus_output,
                     corpus_with_train=f.corpus_with_train, drop_dev_overlap=f.drop_dev_overlap)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  print("\n".join(report.lines()))


if __name__ == "__main__":
  _define_flags()
  app.run(main)
