"""Dense retriever: a query encoder + a ScaNN index over precomputed passage embeddings."""

from __future__ import annotations

import os
from typing import Sequence

from agent_r1_jax.retrieval.base import check_top_k
from agent_r1_jax.retrieval.corpus import Passage, SearchHit, corpus_hash, load_corpus
from agent_r1_jax.retrieval.encoders import HFEncoder, QueryEncoder
from agent_r1_jax.retrieval.passage_store import PassageStore
from agent_r1_jax.retrieval.scann_index import ScannIndex


class DenseRetriever:
  """`search(queries, k)`: embed the queries [Q, D], ScaNN top-k by inner product, map rows to passages."""

  def __init__(self, passages: Sequence[Passage], index: ScannIndex, encoder: QueryEncoder):
    if len(passages) != index.num_points:
      raise ValueError(f"the ScaNN index holds {index.num_points} embeddings but the corpus has {len(passages)} "
                       "passages; rebuild the index for this corpus")
    if getattr(encoder, "dim", index.dim) != index.dim:
      raise ValueError(f"encoder dimension {encoder.dim} != index dimension {index.dim}; use the encoder the "
                       "index was built with")
    self.passages = passages if isinstance(passages, PassageStore) else list(passages)
    self.index = index
    self.encoder = encoder

  def search(self, queries: Sequence[str], top_k: int = 5) -> list[list[SearchHit]]:
    check_top_k(top_k)
    if not queries:
      return []
    idx, scores = self.index.search(self.encoder.encode_queries([str(q) for q in queries]), top_k)
    return [[SearchHit(self.passages[int(i)], float(s)) for i, s in zip(row_i, row_s)]
            for row_i, row_s in zip(idx, scores)]

  @classmethod
  def load(cls, index_dir: str | os.PathLike[str], *, corpus_path: str | os.PathLike[str] | None = None,
           passages_dir: str | os.PathLike[str] | None = None, encoder_path: str | os.PathLike[str] | None = None,
           encoder_kind: str | None = None, max_length: int | None = None, device: str = "cpu") -> DenseRetriever:
    """Loads a directory written by `build_index --kind dense`; unset arguments come from its manifest.

    The passages come from `passages_dir` (a memory-mapped `PassageStore`, e.g. a `bm25_mmap` index
    directory: nothing loaded up front) when given, else from the corpus file.
    """
    extra = ScannIndex.read_manifest(index_dir).get("extra", {})
    corpus_path = corpus_path or extra.get("corpus_path")
    encoder_path = encoder_path or extra.get("encoder_path")
    if not (corpus_path or passages_dir) or not encoder_path:
      raise ValueError("DenseRetriever.load needs corpus_path (or passages_dir) and encoder_path (not recorded in "
                       "the manifest)")
    if passages_dir:
      passages = PassageStore(passages_dir)
      expected_hash = passages.corpus_hash
    else:
      passages = load_corpus(corpus_path)
      expected_hash = corpus_hash(passages)
    index = ScannIndex.load(index_dir, expected_corpus_hash=expected_hash)
    encoder = HFEncoder(encoder_path, encoder_kind or extra.get("encoder_kind", "bge"),
                        max_length=max_length or extra.get("max_length", 256), device=device)
    return cls(passages, index, encoder)
