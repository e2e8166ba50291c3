"""Offline, streaming build of a memory-mapped BM25 index (21M Wikipedia passages without holding them).

  python -m agent_r1_jax.retrieval.build_index --kind bm25_mmap --corpus psgs_w100.tsv --out idx/bm25

Two passes, memory bounded by the chunk and the vocabulary, never by the corpus:

1. tokenize: passages are read `chunk_size` at a time (JSONL or DPR TSV); each `title + " " + text` is
   lower-cased, split on `\\b\\w\\w+\\b` and stop words dropped (the tokenization of `BM25Index`), the
   words mapped to ids through one dict, straight into an int64 buffer. Per chunk the distinct
   (term, doc) keys and their counts tf come out of one `np.unique`; postings (term, doc, tf) go to
   temporary files, document lengths and df(t) are accumulated, and the passages are appended to a
   `PassageStore`.
2. write: terms are renumbered in UTF-8 byte order (the vocabulary on disk is searched by bisection),
   the CSC pointers come from df, and each chunk's postings are scattered into their columns with
   their weights s(d, t) (`bm25_scoring.weights`, computed as bm25s does). Chunks arrive in document
   order, so each column's documents are increasing.

Output directory (all arrays `.npy`, loaded with `mmap_mode="r"` by `MmapBM25Index`):

  indptr int64 [V + 1], indices int32 [P], data float32 [P]   S^T in CSR (= S [N, V] in CSC, as bm25s)
  max_weight float32 [V]                                        u(t) = max_d s(d, t), for pruned search
  vocab.bin, vocab_offsets int64 [V + 1]                       sorted terms, UTF-8, back to back
  doc_lengths int32 [N]                                        |d| after stop words (>= 1)
  passages.bin, passage_offsets.npy                            the `PassageStore`
  agent_r1_bm25_mmap.json                                      manifest: sizes, settings, corpus hash
"""

from __future__ import annotations

import array
import collections
import itertools
import json
import pathlib
import re
import shutil
import time
from typing import Iterable, Sequence

import bm25s
import numpy as np

from agent_r1_jax.retrieval import bm25_scoring
from agent_r1_jax.retrieval.corpus import Passage, iter_passages
from agent_r1_jax.retrieval.passage_store import PassageStoreWriter

MANIFEST = "agent_r1_bm25_mmap.json"
TOKEN_PATTERN = r"(?u)\b\w\w+\b"  # bm25s.tokenization.Tokenizer's default splitter


def stopword_list(stopwords: str | Sequence[str] | None) -> list[str]:
  """The stop words bm25s uses for a `stopwords` setting ("en", a list, or None)."""
  return sorted(bm25s.tokenization.Tokenizer(lower=True, stopwords=stopwords, stemmer=None).stopwords or ())


class _Postings:
  """Temporary (term, doc, tf) files appended chunk by chunk and read back chunk by chunk."""

  def __init__(self, directory: pathlib.Path):
    directory.mkdir(parents=True, exist_ok=True)
    self.directory = directory
    self.files = {name: (directory / f"{name}.bin").open("wb") for name in ("term", "doc", "tf")}
    self.sizes: list[int] = []

  def append(self, term: np.ndarray, doc: np.ndarray, tf: np.ndarray) -> None:
    for name, values in (("term", term), ("doc", doc), ("tf", tf)):
      self.files[name].write(np.ascontiguousarray(values, np.int32).tobytes())
    self.sizes.append(len(term))

  def chunks(self):
    for f in self.files.values():
      f.close()
    readers = {name: (self.directory / f"{name}.bin").open("rb") for name in self.files}
    try:
      for size in self.sizes:
        yield tuple(np.fromfile(readers[name], np.int32, size) for name in ("term", "doc", "tf"))
    finally:
      for f in readers.values():
        f.close()


def _column_max(data: np.ndarray, indptr: np.ndarray, block: int = 1 << 26) -> np.ndarray:
  """max of each column's weights (every column is non-empty), about `block` postings read at a time."""
  out = np.empty(len(indptr) - 1, np.float32)
  first = 0
  while first < len(out):
    last = max(first + 1, int(np.searchsorted(indptr, indptr[first] + block, side="right")) - 1)
    last = min(last, len(out))
    out[first:last] = np.maximum.reduceat(data[indptr[first]:indptr[last]], indptr[first:last] - indptr[first])
    first = last
  return out


def _chunks(passages: Iterable[Passage], size: int):
  it = iter(passages)
  while chunk := list(itertools.islice(it, size)):
    yield chunk


def build_mmap_bm25(corpus: str | pathlib.Path | Iterable[Passage], out_dir: str | pathlib.Path, *, k1: float = 0.9,
                    b: float = 0.4, method: str = "lucene", stopwords: str | Sequence[str] | None = "en",
                    chunk_size: int = 200_000, show_progress: bool = True) -> dict:
  """Builds the index of `corpus` (a JSONL/TSV path, or an iterable of passages) into `out_dir`.

  Returns the manifest. Defaults are `BM25Index`'s (Lucene BM25, k1 = 0.9, b = 0.4, English stop words),
  so both return the same hits and scores for the same corpus. `chunk_size` passages are tokenized at
  a time (about 1 KB of memory each); it does not change the index.
  """
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  if method not in bm25_scoring.METHODS:
    raise ValueError(f"BM25 method must be one of {bm25_scoring.METHODS}, got {method!r}")
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be positive, got {chunk_size}")
  start_time = time.perf_counter()
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  stop = stopword_list(stopwords)
  split = re.compile(TOKEN_PATTERN).findall
  vocab = collections.defaultdict(itertools.count().__next__)  # a new word gets the next id
  for w in stop:
    vocab[w] = -1
  store = PassageStoreWriter(out)
  postings = _Postings(out / "tmp_postings")
  lengths = array.array("i")
  df = np.zeros(0, np.int64)

  if isinstance(corpus, (str, pathlib.Path)):
    bar = tqdm(total=pathlib.Path(corpus).stat().st_size, unit="B", unit_scale=True, desc="tokenizing corpus",
               disable=not show_progress)
    passages = iter_passages(corpus, on_bytes=bar.update)
  else:
    bar = tqdm(unit="passage", desc="tokenizing passages", disable=not show_progress)
    passages = (bar.update(1) or p for p in corpus)
  with bar:
    for chunk in _chunks(passages, chunk_size):
      first_doc = len(store)
      ids, words_per_doc = array.array("q"), array.array("q")
      for p in chunk:
        before = len(ids)
        ids.extend(map(vocab.__getitem__, split(f"{p.title} {p.text}".lower())))
        words_per_doc.append(len(ids) - before)
        store.add(p)
      n = len(chunk)
      ids_np = np.frombuffer(ids, np.int64)
      doc_local = np.repeat(np.arange(n, dtype=np.int64), np.frombuffer(words_per_doc, np.int64))
      keep = ids_np >= 0
      ids_np, doc_local = ids_np[keep], doc_local[keep]
      # A passage left without tokens counts as length 1, as bm25s's empty token makes it.
      lengths.frombytes(np.maximum(np.bincount(doc_local, minlength=n), 1).astype(np.int32).tobytes())
      keys, tf = np.unique(ids_np * n + doc_local, return_counts=True)
      term, doc = np.divmod(keys, n)
      if len(df) < len(vocab):
        df = np.concatenate([df, np.zeros(len(vocab) - len(df), np.int64)])
      df += np.bincount(term, minlength=len(df))
      postings.append(term, doc + first_doc, tf)
  store_manifest = store.close()
  num_docs = len(lengths)
  if num_docs >= 2**31 or len(vocab) >= 2**31:
    raise ValueError("the index stores document and term ids as int32: at most 2^31 - 1 of each")

  # Terms renumbered in byte order; stop words (id -1) are not terms.
  terms = [w.encode("utf-8") for w, i in sorted(((w, i) for w, i in vocab.items() if i >= 0), key=lambda x: x[1])]
  del vocab
  order = sorted(range(len(terms)), key=terms.__getitem__)
  rank = np.empty(len(terms), np.int64)
  rank[order] = np.arange(len(terms))
  sorted_terms = [terms[i] for i in order]
  del terms
  (out / "vocab.bin").write_bytes(b"".join(sorted_terms))
  np.save(out / "vocab_offsets.npy", np.concatenate([[0], np.cumsum([len(t) for t in sorted_terms], dtype=np.int64)]))
  del sorted_terms
  df = df[:len(rank)][order]
  indptr = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
  doc_lengths = np.frombuffer(lengths, np.int32)
  np.save(out / "doc_lengths.npy", doc_lengths)
  avgdl = int(doc_lengths.sum(dtype=np.int64)) / num_docs
  idf32 = bm25_scoring.idf(np.maximum(df, 1), num_docs, method)

  num_postings = int(indptr[-1])
  data = np.lib.format.open_memmap(out / "data.npy", mode="w+", dtype=np.float32, shape=(num_postings,))
  indices = np.lib.format.open_memmap(out / "indices.npy", mode="w+", dtype=np.int32, shape=(num_postings,))
  heads = indptr[:-1].copy()
  with tqdm(total=num_postings, unit="posting", unit_scale=True, desc="writing postings",
            disable=not show_progress) as bar:
    for term, doc, tf in postings.chunks():
      t = rank[term]
      o = np.argsort(t, kind="stable")  # within a term the chunk's postings are already in document order
      t, doc, tf = t[o], doc[o], tf[o]
      unique_terms, first, counts = np.unique(t, return_index=True, return_counts=True)
      pos = np.repeat(heads[unique_terms] - first, counts) + np.arange(len(t))
      heads[unique_terms] += counts
      indices[pos] = doc
      data[pos] = bm25_scoring.weights(tf, doc_lengths[doc], idf32[t], avgdl, k1=k1, b=b, method=method)
      bar.update(len(t))
  assert (heads == indptr[1:]).all(), "postings do not fill their columns exactly"
  data.flush()
  indices.flush()
  np.save(out / "max_weight.npy", _column_max(data, indptr))
  del data, indices
  np.save(out / "indptr.npy", indptr)
  shutil.rmtree(out / "tmp_postings")
  manifest = {
      "kind": "bm25_mmap", "num_passages": num_docs, "num_terms": len(rank), "num_postings": num_postings,
      "avgdl": avgdl, "corpus_hash": store_manifest["corpus_hash"],
      "settings": {"k1": float(k1), "b": float(b), "method": method,
                   "stopwords": stopwords if isinstance(stopwords, (str, type(None))) else list(stopwords)},
      "tokenizer": {"lower": True, "pattern": TOKEN_PATTERN, "stopwords": stop},
      "chunk_size": chunk_size, "build_seconds": round(time.perf_counter() - start_time, 3),
      "bm25s_version": bm25s.__version__,
  }
  (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
  return manifest
