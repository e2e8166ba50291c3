"""BM25 lexical index built with bm25s, with a batched sparse-matrix search.

Indexing uses bm25s: each passage `title + " " + text` is lower-cased, split on `\\b\\w\\w+\\b`, English
stop words are removed, and bm25s precomputes the per-(document, term) BM25 contribution

  s(d, t) = idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl)),
  idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))                      (`lucene` variant)

into a sparse matrix S [num_docs, vocab] (CSC). The score of query q is score(d, q) = sum_{t in q} s(d, t)
(a repeated query term counts again, as in bm25s). `search` scores only the documents in the posting
lists of the query terms, a chunk of queries at a time (see `search`). Passages with score 0 (no shared
term) are never returned.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Sequence

import bm25s
import numpy as np
import scipy.sparse as sp

from agent_r1_jax.retrieval import bm25_scoring
from agent_r1_jax.retrieval.base import check_top_k
from agent_r1_jax.retrieval.corpus import Passage, SearchHit, corpus_hash, passages_from_rows

_MANIFEST = "agent_r1_bm25.json"
_PASSAGES = "passages.jsonl"
_SUPPORTED_METHODS = bm25_scoring.METHODS


class BM25Index:
  """In-process BM25 over a list of passages.

  Args:
    passages: the corpus.
    k1, b: BM25 parameters (defaults are Lucene/Anserini's, as used by Search-R1's pyserini BM25).
    method: bm25s scoring variant, one of "robertson", "lucene", "atire".
    stopwords: bm25s stop-word setting ("en" or None).
    query_chunk: queries whose postings are grouped in one np.unique / np.bincount pass.
  """

  def __init__(self, passages: Sequence[Passage], *, k1: float = 0.9, b: float = 0.4,
               method: str = "lucene", stopwords: str | None = "en", query_chunk: int = 16,
               _retriever: bm25s.BM25 | None = None):
    if not passages:
      raise ValueError("BM25Index needs at least one passage")
    if method not in _SUPPORTED_METHODS:
      raise ValueError(f"BM25 method must be one of {_SUPPORTED_METHODS}, got {method!r}")
    self.passages = list(passages)
    self.settings = {"k1": float(k1), "b": float(b), "method": method, "stopwords": stopwords}
    self.query_chunk = int(query_chunk)
    self._tokenizer = bm25s.tokenization.Tokenizer(lower=True, stopwords=stopwords, stemmer=None)
    if _retriever is None:
      _retriever = bm25s.BM25(k1=k1, b=b, method=method)
      tokens = self._tokenizer.tokenize([self._index_text(p) for p in self.passages], update_vocab=True,
                                        return_as="tuple", show_progress=False)
      _retriever.index(tokens, show_progress=False)
    self.retriever = _retriever
    scores = _retriever.scores
    if int(scores["num_docs"]) != len(self.passages):
      raise ValueError(f"BM25 index holds {scores['num_docs']} documents but the corpus has "
                       f"{len(self.passages)}; rebuild the index for this corpus")
    self._vocab: dict[str, int] = dict(_retriever.vocab_dict)
    # S^T as CSR [vocab, num_docs]: the CSC arrays of S [num_docs, vocab] are exactly CSR arrays of S^T.
    self._doc_term_t = sp.csr_matrix(
        (np.asarray(scores["data"], np.float32), np.asarray(scores["indices"]), np.asarray(scores["indptr"])),
        shape=(len(scores["indptr"]) - 1, len(self.passages)))

  @staticmethod
  def _index_text(p: Passage) -> str:
    return f"{p.title} {p.text}"

  @classmethod
  def build(cls, passages: Sequence[Passage], **kwargs) -> BM25Index:
    """Same as the constructor; reads better at call sites."""
    return cls(passages, **kwargs)

  def __len__(self) -> int:
    return len(self.passages)

  def query_token_ids(self, query: str) -> list[int]:
    """The vocabulary ids of a query's terms (same normalisation as the corpus; unknown terms dropped)."""
    words = self._tokenizer.splitter(query.lower())
    stop = self._tokenizer.stopwords or ()
    stop = set(stop)
    return [self._vocab[w] for w in words if w not in stop and w in self._vocab]

  def score_matrix(self, queries: Sequence[str]) -> np.ndarray:
    """Dense BM25 scores float32 [len(queries), num_docs] (the reference path; `search` avoids it).

    Row i accumulates, term by term, the posting list of each query term (a CSR row of S^T):
    scores[i, docs(t)] += s(docs(t), t).
    """
    out = np.zeros((len(queries), len(self.passages)), np.float32)
    indptr, indices, data = self._doc_term_t.indptr, self._doc_term_t.indices, self._doc_term_t.data
    for i, q in enumerate(queries):
      row = out[i]
      for t in self.query_token_ids(q):
        start, end = indptr[t], indptr[t + 1]
        row[indices[start:end]] += data[start:end]  # doc ids within one posting list are unique
    return out

  def search(self, queries: Sequence[str], top_k: int = 5) -> list[list[SearchHit]]:
    """Top-k passages per query, scores decreasing, ties broken by corpus order; score-0 passages dropped.

    Only documents that share a term with a query are scored. For a chunk of Q queries the postings of
    all their terms are concatenated as keys row * num_docs + doc with their contributions s(doc, t);
    `np.unique` groups equal keys and `np.bincount` sums them, so the cost is O(P log P) in the number P
    of postings touched rather than O(Q * num_docs). Each row's top-k is then selected among its own
    touched documents (`bm25_scoring.top_k`: ties at the k-th score go to the earlier passage). A query's
    result does not depend on the other queries of its chunk.
    """
    check_top_k(top_k)
    token_ids = [self.query_token_ids(str(q)) for q in queries]
    out: list[list[SearchHit]] = []
    for start in range(0, len(token_ids), self.query_chunk):
      out.extend(self._search_chunk(token_ids[start:start + self.query_chunk], top_k))
    return out

  def _search_chunk(self, token_ids: list[list[int]], top_k: int) -> list[list[SearchHit]]:
    indptr, indices, data = self._doc_term_t.indptr, self._doc_term_t.indices, self._doc_term_t.data
    n_docs = len(self.passages)
    keys, vals = [], []
    for row, ids in enumerate(token_ids):
      for t in ids:
        start, end = indptr[t], indptr[t + 1]
        keys.append(indices[start:end].astype(np.int64) + row * n_docs)
        vals.append(data[start:end])
    if not keys:
      return [[] for _ in token_ids]
    unique_keys, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    sums = np.bincount(inverse, weights=np.concatenate(vals)).astype(np.float32)
    rows, docs = np.divmod(unique_keys, n_docs)
    bounds = np.searchsorted(rows, np.arange(len(token_ids) + 1))
    out = []
    for row in range(len(token_ids)):
      seg_docs, seg_scores = bm25_scoring.top_k(docs[bounds[row]:bounds[row + 1]], sums[bounds[row]:bounds[row + 1]],
                                                top_k)
      out.append([SearchHit(self.passages[int(d)], float(v)) for d, v in zip(seg_docs, seg_scores)])
    return out

  # --- persistence -------------------------------------------------------------------------------
  def save(self, directory: str | os.PathLike[str]) -> None:
    """Writes the bm25s index, the passages and a manifest (corpus hash, settings) to `directory`."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self.retriever.save(str(directory), show_progress=False)
    with (directory / _PASSAGES).open("w", encoding="utf-8") as f:
      for p in self.passages:
        f.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
    manifest = {"kind": "bm25", "num_passages": len(self.passages), "corpus_hash": corpus_hash(self.passages),
                "settings": self.settings, "bm25s_version": bm25s.__version__}
    (directory / _MANIFEST).write_text(json.dumps(manifest, indent=2))

  @classmethod
  def load(cls, directory: str | os.PathLike[str], passages: Sequence[Passage] | None = None) -> BM25Index:
    """Loads an index written by `save`; when `passages` is given it must hash to the saved corpus."""
    directory = pathlib.Path(directory)
    manifest_path = directory / _MANIFEST
    if (directory / "agent_r1_bm25_mmap.json").is_file():
      raise ValueError(f"{directory} is a memory-mapped BM25 index: load it with "
                       "agent_r1_jax.retrieval.bm25_mmap.MmapBM25Index, or serve it with "
                       f"python -m agent_r1_jax.retrieval.server --index {directory}")
    if not manifest_path.is_file():
      raise FileNotFoundError(f"{directory} is not a saved BM25Index (missing {_MANIFEST})")
    manifest = json.loads(manifest_path.read_text())
    if passages is None:
      with (directory / _PASSAGES).open("r", encoding="utf-8") as f:
        passages = passages_from_rows(json.loads(line) for line in f if line.strip())
    elif corpus_hash(passages) != manifest["corpus_hash"]:
      raise ValueError(f"the corpus given does not match the one the BM25 index in {directory} was built "
                       "on (corpus hash differs); rebuild the index")
    retriever = bm25s.BM25.load(str(directory), show_progress=False, verbosity=0)
    s = manifest["settings"]
    return cls(passages, k1=s["k1"], b=s["b"], method=s["method"], stopwords=s["stopwords"],
               _retriever=retriever)
