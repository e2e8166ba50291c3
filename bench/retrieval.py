"""Retrieval throughput: BM25 and ScaNN over 100k synthetic passages, one query at a time vs batched.

  python bench/retrieval.py [--passages 100000] [--queries 1000] [--dim 768] [--top_k 5]
  python bench/retrieval.py --smoke    # 5000 passages (ScaNN still builds its tree), 100 queries, 32 dims

Synthetic corpus: passages of 60-120 words drawn from a Zipf(1.1) distribution over a 50k-word vocabulary
(the long tail makes BM25 postings realistic); a query is 3-8 content words (not among the 300 most
frequent) taken from a random passage.
Dense side: embeddings are a mixture of 1,000 Gaussian clusters in `--dim` dimensions, L2-normalised (real
sentence embeddings are clustered; isotropic noise is ScaNN's worst case), queries are perturbed database
points. Baselines measured in the same run: bm25s's own per-query `retrieve`, and exact numpy
inner-product search (matmul + argpartition). Prints queries/s and ratios; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agent_r1_jax.retrieval import BM25Index, Passage  # noqa: E402
from agent_r1_jax.retrieval.scann_index import ScannConfig, ScannIndex  # noqa: E402


def synthetic_corpus(n: int, rng: np.random.Generator, vocab_size: int = 50_000) -> list[Passage]:
  vocab = np.array([f"w{i}" for i in range(vocab_size)])
  lengths = rng.integers(60, 121, size=n)
  words = (rng.zipf(1.1, size=int(lengths.sum())) - 1) % vocab_size
  out, pos = [], 0
  for i, length in enumerate(lengths):
    out.append(Passage(str(i), f"Title {i}", " ".join(vocab[words[pos:pos + length]])))
    pos += length
  return out


def synthetic_queries(passages, q: int, rng, skip_top: int = 300) -> list[str]:
  """3-8 content words of a random passage (the `skip_top` most frequent words play the stop words)."""
  out = []
  for i in rng.integers(0, len(passages), size=q):
    words = [w for w in passages[i].text.split() if int(w[1:]) >= skip_top] or passages[i].text.split()
    out.append(" ".join(rng.choice(words, size=min(len(words), int(rng.integers(3, 9))), replace=False)))
  return out


def rate(fn, n_queries: int, repeats: int = 1) -> float:
  """Best-of-`repeats` queries per second of `fn()` which answers `n_queries` queries."""
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return n_queries / best


def bench_bm25(args, rng):
  print(f"== BM25: {args.passages} passages, {args.queries} queries, top-{args.top_k}")
  t = time.perf_counter()
  passages = synthetic_corpus(args.passages, rng)
  print(f"corpus generated in {time.perf_counter() - t:.1f} s")
  t = time.perf_counter()
  index = BM25Index(passages)
  print(f"index built in {time.perf_counter() - t:.1f} s (vocab {index._doc_term_t.shape[0]})")
  queries = synthetic_queries(passages, args.queries, rng)
  n_single = min(len(queries), args.single_queries)
  single = rate(lambda: [index.search([q], args.top_k) for q in queries[:n_single]], n_single)
  batched = rate(lambda: index.search(queries, args.top_k), len(queries), repeats=2)
  tokens = [[w for w in index._tokenizer.splitter(q.lower()) if w in index._vocab] for q in queries[:n_single]]
  reference = rate(lambda: index.retriever.retrieve(tokens, k=args.top_k, show_progress=False), n_single)
  print(f"bm25s retrieve (per-query loop, baseline): {reference:9.1f} q/s")
  print(f"BM25Index single query                   : {single:9.1f} q/s  ({single / reference:.2f}x baseline)")
  print(f"{f'BM25Index batched ({len(queries)} per call)':<41}: {batched:9.1f} q/s  ({batched / single:.2f}x single)")


def bench_scann(args, rng):
  n, d = args.passages, args.dim
  print(f"== ScaNN: {n} x {d} clustered unit vectors, {args.queries} queries, top-{args.top_k}")
  centers = rng.standard_normal((1000, d)).astype(np.float32)
  x = centers[rng.integers(0, 1000, size=n)] + 0.6 * rng.standard_normal((n, d)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  qs = x[rng.integers(0, n, size=args.queries)] + 0.3 * rng.standard_normal((args.queries, d)).astype(np.float32)
  qs /= np.linalg.norm(qs, axis=1, keepdims=True)
  t = time.perf_counter()
  index = ScannIndex.build(x, ScannConfig(num_neighbors=args.top_k))
  c = index.config
  print(f"index built in {time.perf_counter() - t:.1f} s ({c.num_leaves} leaves, {c.num_leaves_to_search} searched, "
        f"AH {c.dims_per_block} dims/block, reorder {c.reorder_k})")
  n_single = min(args.queries, args.single_queries)

  def exact(batch):
    scores = batch @ x.T
    return np.argpartition(-scores, args.top_k, axis=1)[:, :args.top_k]

  exact_single = rate(lambda: [exact(q[None]) for q in qs[:n_single]], n_single)
  exact_batched = rate(lambda: [exact(qs[i:i + 256]) for i in range(0, len(qs), 256)], len(qs))
  single = rate(lambda: [index.search_one(q, args.top_k) for q in qs[:n_single]], n_single, repeats=2)
  batched = rate(lambda: index.search(qs, args.top_k), len(qs), repeats=2)
  parallel = rate(lambda: index.search(qs, args.top_k, parallel=True), len(qs), repeats=2)
  found, _ = index.search(qs, args.top_k)
  truth = np.argsort(-(qs @ x.T), axis=1)[:, :args.top_k]
  recall = np.mean([len(set(a) & set(b)) / args.top_k for a, b in zip(found.tolist(), truth.tolist())])
  print(f"exact numpy, single query (baseline)     : {exact_single:9.1f} q/s")
  print(f"exact numpy, batches of 256              : {exact_batched:9.1f} q/s")
  print(f"ScaNN single query                       : {single:9.1f} q/s  ({single / exact_single:.1f}x exact single)")
  print(f"ScaNN batched                            : {batched:9.1f} q/s  ({batched / single:.2f}x single, "
        f"{batched / exact_batched:.1f}x exact batched)")
  label = f"ScaNN batched, parallel ({os.cpu_count()} cpus)"
  print(f"{label:<41}: {parallel:9.1f} q/s  ({parallel / single:.2f}x single)")
  print(f"ScaNN recall@{args.top_k} vs exact: {recall:.3f}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--passages", type=int, default=100_000)
  parser.add_argument("--queries", type=int, default=1000)
  parser.add_argument("--single_queries", type=int, default=300, help="queries timed one by one")
  parser.add_argument("--dim", type=int, default=768)
  parser.add_argument("--top_k", type=int, default=5)
  parser.add_argument("--only", choices=["bm25", "scann"], default=None)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--smoke", action="store_true",
                      help="5000 passages, 100 queries (20 one by one), 32 dims: checks that the bench runs")
  args = parser.parse_args()
  if args.smoke:
    args.passages, args.queries, args.single_queries, args.dim = 5000, 100, 20, 32
  rng = np.random.default_rng(args.seed)
  if args.only in (None, "bm25"):
    bench_bm25(args, rng)
  if args.only in (None, "scann"):
    bench_scann(args, rng)


if __name__ == "__main__":
  main()
