"""BM25 term weights as bm25s computes them, and the top-k selection shared by the BM25 indexes.

For a term t with document frequency df(t) among N documents, and a document d of length |d| (its
token count after stop-word removal, 1 for a document left with no token: bm25s gives it the empty
token), with avgdl the mean length:

  lucene     idf = ln(1 + (N - df + 0.5) / (df + 0.5))   tfc = tf / (tf + k1 (1 - b + b |d| / avgdl))
  robertson  idf = ln(max(1, (N - df + 0.5) / (df + 0.5)))  tfc as lucene
  atire      idf = ln(N / df)                                tfc = tf (k1 + 1) / (tf + k1 (1 - b + b |d| / avgdl))

s(d, t) = idf(t) tfc(t, d), stored as float32. The arithmetic follows bm25s operation by operation
(idf through `math.log` rounded to float32, tfc in float64 with tf float32, the atire numerator in
float32), so an index built here holds bit-for-bit bm25s's weights and ranks ties identically.
"""

from __future__ import annotations

import math

import numpy as np

METHODS = ("robertson", "lucene", "atire")


def idf(df: np.ndarray, num_docs: int, method: str) -> np.ndarray:
  """float32 idf per entry of `df` (int array, all >= 1), with bm25s's formula for `method`."""
  if method not in METHODS:
    raise ValueError(f"BM25 method must be one of {METHODS}, got {method!r}")
  values, inverse = np.unique(np.asarray(df, np.int64), return_inverse=True)
  out = np.empty(len(values), np.float32)
  for i, d in enumerate(values.tolist()):  # math.log per distinct df: numpy's vector log may differ by an ulp
    if method == "lucene":
      out[i] = math.log(1 + (num_docs - d + 0.5) / (d + 0.5))
    elif method == "robertson":
      out[i] = math.log(max(1.0, (num_docs - d + 0.5) / (d + 0.5)))
    else:
      out[i] = math.log(num_docs / d)
  return out[inverse.reshape(-1)]


def weights(tf: np.ndarray, doc_len: np.ndarray, idf32: np.ndarray, avgdl: float, *, k1: float, b: float,
            method: str) -> np.ndarray:
  """float32 s(d, t) for postings with term frequency `tf`, document length `doc_len` and term idf `idf32`."""
  tf32 = np.asarray(tf, np.float32)
  tf64 = tf32.astype(np.float64)
  norm = k1 * ((1 - b) + b * np.asarray(doc_len, np.float64) / np.float64(avgdl))
  if method == "atire":
    tfc = (tf32 * np.float32(k1 + 1)).astype(np.float64) / (tf64 + norm)
  else:
    tfc = tf64 / (norm + tf64)
  return (np.asarray(idf32, np.float32).astype(np.float64) * tfc).astype(np.float32)


def top_k(docs: np.ndarray, scores: np.ndarray, k: int, copies: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """The k best distinct documents: (docs, scores) sorted by score decreasing, then document id increasing.

  `docs` may list a document up to `copies` times, each time with its (same) score. Only scores > 0 are
  kept. Selection: the (k * copies)-th largest entry is at most the k-th best distinct score (the best
  k * copies entries name at least k documents), so the entries at or above it hold every document of
  the top k, ties at the boundary included; those few are deduplicated and sorted.
  """
  docs, scores = np.asarray(docs), np.asarray(scores)
  keep = scores > 0
  docs, scores = docs[keep], scores[keep]
  cut = k * copies
  if len(scores) > cut:
    threshold = np.partition(scores, len(scores) - cut)[len(scores) - cut]
    keep = scores >= threshold
    docs, scores = docs[keep], scores[keep]
  if copies > 1:
    docs, first = np.unique(docs, return_index=True)
    scores = scores[first]
  order = np.lexsort((docs, -scores))[:k]
  return docs[order], scores[order]
