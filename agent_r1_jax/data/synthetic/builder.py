"""Builds, caches and opens the synthetic world's artefacts.

`prepare_synthetic_world(config)` writes, under `cache_dir()/synthetic_world/<hash of every parameter>/`:

  corpus.jsonl             one passage per entity, Search-R1 format {"id", "contents": '"Title"\\ntext'}
  train|validation|test.jsonl   question rows (id, data_source, question, answers, supporting_titles, type,
                           hops, answer_kind, question_entities, ...)
  tfds/synthetic_multihop/1.0.0/   the same splits as a TFDS ArrayRecord dataset (the shared example schema)
  tokenizer/               byte-level BPE trained on the world, a standard HF tokenizer directory
  manifest.json            the parameters and counts; written last, so its presence means "complete"

A second call with the same parameters reuses the directory. Everything is a function of the parameters, so
the same seed gives byte-identical files. `make_search_env` puts the real `WikiSearchTool` (BM25 over the
corpus) behind a `NousToolEnv`: the environment the RL rollout uses and the one the scripted expert plays in.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Iterator, Sequence

from agent_r1_jax import paths
from agent_r1_jax.data import prompts, sft, tfds_store
from agent_r1_jax.data.synthetic import expert as expert_lib
from agent_r1_jax.data.synthetic import tokenizer as tokenizer_lib
from agent_r1_jax.data.synthetic.world import (DATA_SOURCE, SPLITS, World, WorldConfig, corpus_row, example_row,
                                               generate_world)

TFDS_NAME = DATA_SOURCE
DEFAULT_VOCAB_SIZE = 4096
DEFAULT_TOP_K = 3


@dataclasses.dataclass(frozen=True)
class SyntheticWorldFiles:
  """Paths of a prepared world and helpers to open them."""
  root: pathlib.Path
  config: WorldConfig

  @property
  def corpus_path(self) -> pathlib.Path:
    return self.root / "corpus.jsonl"

  @property
  def tokenizer_dir(self) -> pathlib.Path:
    return self.root / "tokenizer"

  @property
  def tfds_dir(self) -> pathlib.Path:
    return self.root / "tfds"

  def split_path(self, split: str) -> pathlib.Path:
    if split not in SPLITS:
      raise ValueError(f"synthetic world split must be one of {SPLITS}, got {split!r}")
    return self.root / f"{split}.jsonl"

  def questions(self, split: str) -> list[dict]:
    """Full question rows of a split (including the expert's `hops`)."""
    with open(self.split_path(split), encoding="utf-8") as f:
      return [json.loads(line) for line in f]

  def examples(self, split: str) -> tfds_store.ExampleSource:
    """The split as stored TFDS examples (the schema every data path shares)."""
    return tfds_store.load_split(self.tfds_dir, TFDS_NAME, split)

  def world(self) -> World:
    """The in-memory world (regenerated from the config; deterministic and fast)."""
    return generate_world(self.config)

  def load_tokenizer(self) -> Any:
    import transformers  # pylint: disable=import-outside-toplevel
    return transformers.AutoTokenizer.from_pretrained(str(self.tokenizer_dir))


def _write_jsonl(path: pathlib.Path, rows: Sequence[dict]) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _search_tool(corpus_path: pathlib.Path, top_k: int):
  # Lazy: these import bm25s, which starts a JAX backend at import; the trainer imports this module.
  from agent_r1_jax.retrieval import BM25Index, load_corpus  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools import WikiSearchTool  # pylint: disable=import-outside-toplevel
  return WikiSearchTool(BM25Index(load_corpus(str(corpus_path))), top_k=top_k)


def make_search_env(files: SyntheticWorldFiles, *, top_k: int = DEFAULT_TOP_K,
                    max_tool_response_length: int = 2048, assistant_prefix: str = "") -> Any:
  """A `NousToolEnv` with the `search` tool over BM25 of the world's corpus."""
  # Lazy: envs imports bm25s, which starts a JAX backend at import; the trainer imports this module.
  from agent_r1_jax.envs import NousToolEnv  # pylint: disable=import-outside-toplevel
  return NousToolEnv([_search_tool(files.corpus_path, top_k)], max_tool_response_length=max_tool_response_length,
                     assistant_prefix=assistant_prefix)


def _tokenizer_texts(world: World, tool_schemas: list[dict]) -> Iterator[str]:
  """Training text for the BPE: passages (raw and as search results), train questions, prompts, expert turns."""
  # Lazy: these import bm25s, which starts a JAX backend at import; the trainer imports this module.
  from agent_r1_jax.retrieval import Passage, SearchHit  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools import format_hits  # pylint: disable=import-outside-toplevel

  for p in world.passages:
    yield corpus_row(p)["contents"]
  hits = [SearchHit(Passage(p["id"], p["title"], p["text"]), 0.0) for p in world.passages]
  for start in range(0, len(hits), 5):
    yield format_hits(hits[start:start + 5])
  offline = expert_lib.ScriptedExpert(env=None, guess_pools={})
  questions = world.splits["train"] or world.splits["validation"]
  # The system block is identical in every prompt: once is enough for the merge statistics' purposes, and
  # repeating it would only multiply the training text.
  for i, q in enumerate(questions):
    if i < 10:
      yield tokenizer_lib.render_chat(prompts.build_messages(q["question"]), tools=tool_schemas,
                                      add_generation_prompt=True)
    else:
      yield prompts.user_message(q["question"])
    yield from offline.action_texts(q)


def prepare_synthetic_world(config: WorldConfig | None = None, *, vocab_size: int = DEFAULT_VOCAB_SIZE,
                            cache_root: str | os.PathLike[str] | None = None, **world_options) -> SyntheticWorldFiles:
  """Generates (or reuses) the world for `config` / `world_options` and returns its files.

  Args:
    config: the world's parameters; or pass them as keyword arguments (`seed=1, num_train=800, ...`).
    vocab_size: BPE vocabulary bound of the world's tokenizer.
    cache_root: where worlds are cached (default `paths.cache_dir()/synthetic_world`).
  """
  if config is not None and world_options:
    raise ValueError("pass either a WorldConfig or world options as keywords, not both")
  config = config or WorldConfig.create(**world_options)
  config.validate()
  root_dir = pathlib.Path(cache_root) if cache_root else paths.cache_dir() / "synthetic_world"
  key = f"{config.cache_key()}-v{vocab_size}"
  files = SyntheticWorldFiles(root=root_dir / key, config=config)
  if (files.root / "manifest.json").exists():
    return files

  root_dir.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root_dir))
  try:
    staged = SyntheticWorldFiles(root=staging, config=config)
    world = generate_world(config)
    _write_jsonl(staged.corpus_path, [corpus_row(p) for p in world.passages])
    for split in SPLITS:
      _write_jsonl(staged.split_path(split), world.splits[split])
    schemas = [_search_tool(staged.corpus_path, DEFAULT_TOP_K).tool_schema]
    tokenizer_lib.train_tokenizer(_tokenizer_texts(world, schemas), staged.tokenizer_dir, vocab_size=vocab_size)
    by_title = {p["title"]: p for p in world.passages}
    tfds_splits = {}
    for split in SPLITS:
      rows = []
      for q in world.splits[split]:
        row = example_row(q)
        row["type"] = q["type"]
        row["contexts"] = [{"title": t, "text": by_title[t]["text"]} for t in q["supporting_titles"]]
        rows.append(row)
      if rows:
        tfds_splits[split] = rows
    tfds_store.write_dataset(TFDS_NAME, tfds_splits, staged.tfds_dir,
                             description="Synthetic multi-hop QA world (agent_r1_jax.data.synthetic).")
    manifest = {"config": config.to_dict(), "vocab_size": vocab_size, "num_passages": len(world.passages),
                "num_questions": {s: len(world.splits[s]) for s in SPLITS}}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    try:
      os.replace(staging, files.root)
    except OSError:  # another process finished the same world first; theirs is identical
      if not (files.root / "manifest.json").exists():
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return files


def held_out_entities(files: SyntheticWorldFiles) -> set[str]:
  """The entities named in the world's validation and test questions (no training question names one)."""
  return {name for split in ("validation", "test") for q in files.questions(split) for name in q["question_entities"]}


def guess_pools(world: World) -> dict[str, list[str]]:
  """Guess candidates by answer kind: entity names per kind, and every year that occurs in the world."""
  pools: dict[str, list[str]] = {}
  for entity in world.entities.values():
    pools.setdefault(entity.kind, []).append(entity.name)
  pools["year"] = sorted({v for e in world.entities.values() for k, v in e.attrs.items() if k.endswith("year")})
  return pools


def expert_trajectories(files: SyntheticWorldFiles, split: str = "train", *, guess_rate: float = 0.0,
                        guess_at: str = "each_hop", seed: int = 0, env: Any = None,
                        limit: int | None = None) -> list[expert_lib.Trajectory]:
  """The scripted expert's trajectories for (the first `limit`) questions of a split.

  `env` defaults to `make_search_env(files)`; pass the rollout's own env so warm-up sees its exact framing.
  """
  questions = files.questions(split)[:limit]
  env = env if env is not None else make_search_env(files)
  expert = expert_lib.ScriptedExpert(env, guess_pools(files.world()), guess_rate=guess_rate, guess_at=guess_at,
                                     seed=seed)
  return expert.run(questions)


def sft_examples(tokenizer: Any, trajectories: Sequence[expert_lib.Trajectory], tool_schemas: Sequence[dict], *,
                 system_prompt: str | None = None, instruction: str = prompts.INSTRUCTION,
                 require_grounded: bool = True) -> list[sft.SFTExample]:
  """Tokenized SFT examples (prompt ids, response ids, action mask) for expert trajectories.

  With `require_grounded`, trajectories in which a value the expert wrote was missing from the observation it
  had just seen (a retrieval miss) are dropped, so warm-up never teaches the model to invent facts.
  """
  out = []
  for traj in trajectories:
    if require_grounded and not traj.grounded:
      continue
    prompt_text = prompts.render_prompt(tokenizer, traj.question["question"], tool_schemas,
                                        system_prompt=system_prompt, instruction=instruction)
    out.append(sft.tokenize_trajectory(tokenizer, prompt_text, traj.segments, example_id=traj.question["id"]))
  return out
