"""BM25 search over an index directory written by `bm25_build`, every array memory-mapped.

score(d, q) = sum_{t in q} s(d, t), with s the precomputed weights of S^T (CSR: `indptr`, `indices`,
`data`). Per query, the posting list of each query term is added into a dense float64 accumulator
acc [N] (acc[docs(t)] += s(docs(t), t); a posting list names each document once), the touched entries
are read back, cast to float32 and the top k taken (`bm25_scoring.top_k`), then only those entries are
zeroed again. The cost is O(P) in the postings P a query touches, and the sums are formed in the same
order and precision as `BM25Index.search`, so both return the same hits with the same float32 scores.

Resident memory: the pages of the postings, vocabulary and passages that queries touch (shared page
cache, so several server processes on one host share them), plus one accumulator (8 N bytes: 168 MB at
21M passages) per search running at once; at most `max_concurrent_searches` exist, a further search
waits for one.
"""

from __future__ import annotations

import bisect
import functools
import json
import mmap
import os
import pathlib
import queue
import re
import threading
from typing import Sequence

import numpy as np

from agent_r1_jax.retrieval import bm25_scoring
from agent_r1_jax.retrieval.base import check_top_k
from agent_r1_jax.retrieval.bm25_build import MANIFEST
from agent_r1_jax.retrieval.corpus import SearchHit
from agent_r1_jax.retrieval.passage_store import PassageStore


class _SortedTerms:
  """The on-disk vocabulary as a sequence of bytes, for `bisect`."""

  def __init__(self, directory: pathlib.Path):
    self._offsets = np.load(directory / "vocab_offsets.npy", mmap_mode="r")
    with (directory / "vocab.bin").open("rb") as f:
      self._bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""

  def __len__(self) -> int:
    return len(self._offsets) - 1

  def __getitem__(self, i: int) -> bytes:
    return self._bytes[int(self._offsets[i]):int(self._offsets[i + 1])]


class MmapBM25Index:
  """A `Retriever` over a memory-mapped BM25 index directory (see `bm25_build`)."""

  def __init__(self, directory: str | os.PathLike[str], *, max_concurrent_searches: int | None = None,
               term_cache_size: int = 1 << 16):
    directory = pathlib.Path(directory)
    if not (directory / MANIFEST).is_file():
      raise FileNotFoundError(f"{directory} is not a memory-mapped BM25 index (missing {MANIFEST}); build one with "
                              "python -m agent_r1_jax.retrieval.build_index --kind bm25_mmap")
    self.directory = directory
    self.manifest = json.loads((directory / MANIFEST).read_text())
    self.settings = self.manifest["settings"]
    self.passages = PassageStore(directory)
    if len(self.passages) != self.manifest["num_passages"] or self.passages.corpus_hash != self.manifest["corpus_hash"]:
      raise ValueError(f"the passages in {directory} do not match its BM25 manifest; rebuild the index")
    self._indptr = np.load(directory / "indptr.npy", mmap_mode="r")
    self._indices = np.load(directory / "indices.npy", mmap_mode="r")
    self._data = np.load(directory / "data.npy", mmap_mode="r")
    self._terms = _SortedTerms(directory)
    tokenizer = self.manifest["tokenizer"]
    self._split = re.compile(tokenizer["pattern"]).findall
    self._stop = frozenset(tokenizer["stopwords"])
    self._term_id = functools.lru_cache(maxsize=term_cache_size)(self._lookup)
    self._max_accumulators = max_concurrent_searches or os.cpu_count() or 1
    self._accumulators: queue.LifoQueue[np.ndarray] = queue.LifoQueue()
    self._created = 0
    self._lock = threading.Lock()

  @classmethod
  def load(cls, directory: str | os.PathLike[str], **kwargs) -> MmapBM25Index:
    return cls(directory, **kwargs)

  def __len__(self) -> int:
    return len(self.passages)

  def _lookup(self, word: str) -> int:
    """The term id of `word`, or -1 when it is not in the vocabulary."""
    key = word.encode("utf-8")
    i = bisect.bisect_left(self._terms, key)
    return i if i < len(self._terms) and self._terms[i] == key else -1

  def query_token_ids(self, query: str) -> list[int]:
    """The term ids of a query (lower-cased, split, stop words and unknown terms dropped; repeats kept)."""
    ids = (self._term_id(w) for w in self._split(query.lower()) if w not in self._stop)
    return [i for i in ids if i >= 0]

  def _take_accumulator(self) -> np.ndarray:
    try:
      return self._accumulators.get_nowait()
    except queue.Empty:
      pass
    with self._lock:
      if self._created < self._max_accumulators:
        self._created += 1
        return np.zeros(len(self), np.float64)
    return self._accumulators.get()

  def top_docs(self, token_ids: Sequence[int], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(document positions int [k'], float32 scores [k']) of the best k' <= top_k documents for one query."""
    spans = [(int(self._indptr[t]), int(self._indptr[t + 1])) for t in token_ids]
    spans = [(s, e) for s, e in spans if e > s]
    if not spans:
      return np.zeros(0, np.int64), np.zeros(0, np.float32)
    acc = self._take_accumulator()
    touched: list[np.ndarray] = []
    try:
      for s, e in spans:
        docs = np.asarray(self._indices[s:e])
        acc[docs] += self._data[s:e]
        touched.append(docs)
      all_docs = np.concatenate(touched)
      return bm25_scoring.top_k(all_docs, acc[all_docs].astype(np.float32), top_k, copies=len(spans))
    finally:
      for docs in touched:
        acc[docs] = 0.0
      self._accumulators.put(acc)

  def search(self, queries: Sequence[str], top_k: int = 5) -> list[list[SearchHit]]:
    """Top-k passages per query, scores decreasing, ties by corpus order; score-0 passages dropped."""
    check_top_k(top_k)
    out = []
    for q in queries:
      docs, scores = self.top_docs(self.query_token_ids(str(q)), top_k)
      out.append([SearchHit(self.passages[int(d)], float(s)) for d, s in zip(docs, scores)])
    return out
