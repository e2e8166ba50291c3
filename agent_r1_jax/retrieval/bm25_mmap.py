"""BM25 search over an index directory written by `bm25_build`, every array memory-mapped.

score(d, q) = sum_{t in q} s(d, t), with s the precomputed weights of S^T (CSR: `indptr`, `indices`,
`data`; each column's documents increasing) and u(t) = max_d s(d, t) stored per term (`max_weight`).

Candidates are gathered in a dense float32 accumulator acc [N], term by term (acc[docs(t)] +=
s(docs(t), t); a posting list names each document once), keeping the k best documents so far (the
new k best are among the old ones and the term's documents, so theta, the k-th best partial score, is
exact at every step). Exhaustive (`prune=False`): every posting of every query term is added.
Pruned (default; exact, "term at a time, quit and continue"): terms are taken rarest first; with R the
sum of u over the terms not yet added, a document not yet touched scores at most R, so once R < theta
no new document can enter the top k. The candidates C are then the touched documents whose partial
score + R reaches theta, and when they are few (16 |C| < the postings left) the remaining (common,
long) posting lists are only probed for them by binary search, O(|C| log P_t) instead of O(P_t),
dropping a candidate whose partial score + R falls below theta. Question-like queries touch ~0.4 N
postings (common words: "who", "first", "he"); this scans a part of them.

Comparisons carry a relative margin of 2e-4, above the float32 accumulation error of any query the
server admits (at most ~1,400 terms, each adding at most 2^-24 relative). The final candidates (all
documents within the margin of the k-th score) are rescored term by term in query order in float64
and cast to float32, the order and precision of `BM25Index.search`: both return the same hits with
the same scores.

Resident memory: the pages of the postings, vocabulary and passages that queries touch (shared page
cache, so several server processes on one host share them), plus one accumulator (4 N bytes: 84 MB at
21M passages) per search running at once; at most `max_concurrent_searches` exist per process (a
further search waits for one).
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


_PROBE_COST = 16  # a binary-search probe against a scanned posting, in time
_MARGIN = 2e-4


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

  def __init__(self, directory: str | os.PathLike[str], *, max_concurrent_searches: int = 2, prune: bool = True,
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
    self._max_weight = np.load(directory / "max_weight.npy")
    self.prune = prune
    self.postings_scanned = 0  # read whole by the searches so far (a statistic: unlocked across threads)
    self._terms = _SortedTerms(directory)
    tokenizer = self.manifest["tokenizer"]
    self._split = re.compile(tokenizer["pattern"]).findall
    self._stop = frozenset(tokenizer["stopwords"])
    self._term_id = functools.lru_cache(maxsize=term_cache_size)(self._lookup)
    self._max_accumulators = max(1, int(max_concurrent_searches))
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
        return np.zeros(len(self), np.float32)
    return self._accumulators.get()

  def top_docs(self, token_ids: Sequence[int], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(document positions int [k'], float32 scores [k']) of the best k' <= top_k documents for one query."""
    terms = [int(t) for t in token_ids if self._indptr[t + 1] > self._indptr[t]]
    if not terms:
      return np.zeros(0, np.int64), np.zeros(0, np.float32)
    acc = self._take_accumulator()
    touched: list[np.ndarray] = []
    try:
      candidates = self._candidates(terms, acc, top_k, touched)
      return bm25_scoring.top_k(candidates, self._rescore(terms, candidates).astype(np.float32), top_k)
    finally:
      for docs in touched:
        acc[docs] = 0.0
      self._accumulators.put(acc)

  def _probe(self, t: int, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask over `docs` (sorted) of those in t's posting list, their weights s(d, t))."""
    start, end = int(self._indptr[t]), int(self._indptr[t + 1])
    column = self._indices[start:end]
    pos = np.minimum(np.searchsorted(column, docs), end - start - 1)
    hit = column[pos] == docs
    return hit, self._data[start + pos[hit]]

  def _candidates(self, terms: list[int], acc: np.ndarray, k: int, touched: list[np.ndarray]) -> np.ndarray:
    """Sorted documents that may be in the top k (see the module docstring); `touched` collects what acc holds."""
    keep = 1.0 - _MARGIN
    order = sorted(terms, key=lambda t: int(self._indptr[t + 1] - self._indptr[t])) if self.prune else terms
    bounds = self._max_weight[order].astype(np.float64)
    remaining = np.concatenate([np.cumsum(bounds[::-1])[::-1], [0.0]])  # remaining[j] = sum of u over terms j..
    lengths = np.array([self._indptr[t + 1] - self._indptr[t] for t in order], np.int64)
    postings_left = np.cumsum(lengths[::-1])[::-1]
    best = np.zeros(0, np.int64)  # the k best documents so far
    candidates = None
    for j, t in enumerate(order):
      theta = float(acc[best].min()) if len(best) == k else 0.0
      if self.prune and candidates is None and remaining[j] < theta * keep:
        docs = np.concatenate(touched)
        survive = acc[docs] + remaining[j] >= theta * keep
        # Probing costs ~ log2(P) per candidate and posting list: worth it only for few candidates.
        if np.count_nonzero(survive) * _PROBE_COST < postings_left[j]:
          candidates = np.unique(docs[survive])
      if candidates is None:
        start, end = int(self._indptr[t]), int(self._indptr[t + 1])
        docs = np.asarray(self._indices[start:end])
        acc[docs] += self._data[start:end]
        touched.append(docs)
        self.postings_scanned += len(docs)
        if self.prune:  # the k best now are among the k best before and this term's documents (unique, sorted)
          pos = np.minimum(np.searchsorted(docs, best), len(docs) - 1)
          pool = np.concatenate([best[docs[pos] != best], docs])
          best = pool[np.argpartition(acc[pool], len(pool) - k)[len(pool) - k:]] if len(pool) > k else pool
        continue
      hit, weights = self._probe(t, candidates)
      acc[candidates[hit]] += weights
      scores = acc[candidates]
      theta = float(np.partition(scores, len(scores) - k)[len(scores) - k]) if len(scores) > k else 0.0
      candidates = candidates[scores + remaining[j + 1] >= theta * keep]
    if candidates is None:
      docs = np.concatenate(touched)
      scores = acc[docs]
      cut = k * len(order)  # a document appears once per term: the (k T)-th entry bounds the k-th best below
      theta = float(np.partition(scores, len(scores) - cut)[len(scores) - cut]) if len(scores) >= cut else 0.0
      return np.unique(docs[scores >= max(theta, float(acc[best].min()) if len(best) == k else 0.0) * keep])
    scores = acc[candidates]
    theta = float(np.partition(scores, len(scores) - k)[len(scores) - k]) if len(scores) > k else 0.0
    return candidates[scores >= theta * keep]

  def _rescore(self, terms: list[int], docs: np.ndarray) -> np.ndarray:
    """float64 scores of sorted `docs`, summed term by term in query order (as `BM25Index.search` sums)."""
    scores = np.zeros(len(docs), np.float64)
    for t in terms:
      hit, weights = self._probe(t, docs)
      scores[hit] += weights
    return scores

  def search(self, queries: Sequence[str], top_k: int = 5) -> list[list[SearchHit]]:
    """Top-k passages per query, scores decreasing, ties by corpus order; score-0 passages dropped."""
    check_top_k(top_k)
    out = []
    for q in queries:
      docs, scores = self.top_docs(self.query_token_ids(str(q)), top_k)
      out.append([SearchHit(self.passages[int(d)], float(s)) for d, s in zip(docs, scores)])
    return out
