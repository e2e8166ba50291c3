"""Retrieval at Wikipedia scale: what one server gives, measured at 1M and 5M synthetic passages.

  python bench/retrieval.py                                  # BM25 at 1M and 5M passages, dense at 1M
  python bench/retrieval.py --sizes 1000000 --dense 0        # BM25 at 1M only
  python bench/retrieval.py --smoke                          # 3000 passages, 2 clients, 32 dims: that it runs

BM25, per size N: a synthetic JSONL corpus with Wikipedia-like passages (below) is indexed offline by
`build_index --kind bm25_mmap` in a child process (wall time, peak RSS), the index's bytes on disk are
summed, and `python -m agent_r1_jax.retrieval.server --index DIR --workers W` serves it. Figures: the
server's memory after load and after the queries (RSS, PSS = RSS with shared pages divided among the
processes sharing them, anonymous = private heap), queries/s in process (one thread, the baseline), and
over HTTP from C client processes sending one query per request, then batches of B.
Dense, at `--dense` passages: random unit vectors of `--dim` (768 = e5-base) indexed by ScaNN with an int8
reorder copy (sizing, not recall: random vectors are no test of recall), build time and peak RSS, bytes on
disk, RSS of the loaded index, queries/s one at a time and batched against exact numpy search; then the
rate of an e5-base-shaped query encoder (BERT-base, random weights) on this CPU, which a dense server adds.
The ScaNN build peaks at ~3.2 times its float32 input (measured at 1M: 9.3 GiB at the default 1M x 768).

Synthetic passages: a title of 1-4 rare words and 100 words whose ranks follow a Zipf-Mandelbrot law
p(r) ~ (r + 0.8)^-1.05 over 2M words, the 33 most frequent being bm25s's English stop words; 17% of the words
repeat the passage's own topic words (title + 2), as real passages repeat their subject. This gives ~72
tokens and ~57 distinct terms per passage after stop words (printed; the wiki18 sample in shared data has
71.0 and 57.2). Queries: "questions" have the document-frequency profile of real multi-hop questions (HotpotQA,
2Wiki, MuSiQue dev questions from shared data, each term's df measured on the wiki18 sample, then a synthetic
term of about the same df fraction drawn for it): ~0.4 N postings per question, as words like "who",
"first", "he" are no stop words; "keywords" are 4-8 words of a random passage (~0.05 N). Both are timed in
process, exhaustive (every posting) and pruned (the default, exact); questions over HTTP. The page cache is
warm (the index was just written). Nothing is asserted; every figure is printed with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
STOPWORDS = ("the of and in to a was is for as on by with that at it be are this not but or their they an into such "
             "no there if will then these").split()
VOCAB, ZIPF_S, ZIPF_Q, TOPIC_P = 2_000_000, 1.05, 0.8, 0.17


def machine() -> str:
  sys.path.insert(0, str(REPO / "bench"))
  from matmul_rate import cpu_description, matmul_rates  # pylint: disable=import-outside-toplevel
  gflops, _ = matmul_rates(1024, 3)
  vm = psutil.virtual_memory()
  return (f"cpu: {cpu_description()}; {os.cpu_count()} logical CPUs; {vm.total / 2**30:.1f} GiB RAM "
          f"({vm.available / 2**30:.1f} available); float32 1024 x 1024 matmul {gflops:.0f} GFLOP/s (jitted); "
          f"load average {os.getloadavg()[0]:.2f}")


def vocabulary() -> np.ndarray:
  """Word of each rank (object array: a passage's text is one fancy index and a join)."""
  return np.array(STOPWORDS + [f"w{r}" for r in range(len(STOPWORDS), VOCAB)], dtype=object)


def write_corpus(path: pathlib.Path, n: int, num_queries: int, seed: int = 0) -> list[str]:
  """Writes n synthetic passages as JSONL (see the module docstring); returns queries drawn from them."""
  rng = np.random.default_rng(seed)
  p = 1.0 / (np.arange(VOCAB) + ZIPF_Q) ** ZIPF_S
  cdf = np.cumsum(p) / p.sum()
  rare = cdf[1000]
  words = vocabulary()
  asked = set(rng.choice(n, size=min(n, num_queries), replace=False).tolist())
  queries = []
  with path.open("w", encoding="utf-8") as f:
    for start in range(0, n, 50_000):
      m = min(50_000, n - start)
      ranks = np.searchsorted(cdf, rng.random((m, 100)))
      n_title = rng.integers(1, 5, size=m)
      topic = np.searchsorted(cdf, rare + (1 - rare) * rng.random((m, 6)))
      pick = topic[np.arange(m)[:, None], rng.integers(0, 6, size=(m, 100)) % (n_title[:, None] + 2)]
      ranks = np.where(rng.random((m, 100)) < TOPIC_P, pick, ranks)
      lines = []
      for i in range(m):
        text = " ".join(words[ranks[i]])
        title = " ".join(words[topic[i, :n_title[i]]])
        lines.append(json.dumps({"id": str(start + i), "contents": f'"{title}"\n{text}'}))
        if start + i in asked:
          queries.append(" ".join(rng.choice(text.split(), size=int(rng.integers(4, 9)), replace=False)))
      f.write("\n".join(lines) + "\n")
  rng.shuffle(queries)
  return queries


QUESTION_FILES = ("hotpotqa/r1searcher_hotpotqa_dev_500_qa.jsonl", "2wikimultihopqa/r1searcher_2wiki_dev_500_qa.jsonl",
                  "musique/r1searcher_musique_dev_500_qa.jsonl")


def question_profiles() -> list[list[float]] | None:
  """Per question, the df fraction of each of its terms on the wiki18 sample (None without the shared data);
  a term the 1000-passage sample lacks gets -1 (rare: df fraction below 1e-3)."""
  import re  # pylint: disable=import-outside-toplevel
  from agent_r1_jax import paths  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval import load_corpus  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval.bm25_build import TOKEN_PATTERN, stopword_list  # pylint: disable=import-outside-toplevel
  root = paths.shared_data_dir()
  files = [root / "wiki_corpus" / "flashrag_wiki18_sample_1000.jsonl"] + [root / f for f in QUESTION_FILES]
  if not all(f.is_file() for f in files):
    return None
  stop = set(stopword_list("en"))
  split = re.compile(TOKEN_PATTERN).findall
  sample = load_corpus(files[0])
  df: dict[str, int] = {}
  for p in sample:
    for w in set(split(f"{p.title} {p.text}".lower())) - stop:
      df[w] = df.get(w, 0) + 1
  questions = [json.loads(line)["question"] for f in files[1:] for line in f.read_text().splitlines() if line.strip()]
  return [[df.get(w, 0) / len(sample) or -1.0 for w in split(q.lower()) if w not in stop] for q in questions]


def profile_queries(index_dir: pathlib.Path, profiles: list[list[float]], n: int, rng) -> list[str]:
  """Queries whose terms have the df fractions of `profiles` in this index (see the module docstring)."""
  indptr = np.load(index_dir / "indptr.npy")
  offsets = np.load(index_dir / "vocab_offsets.npy")
  vocab = (index_dir / "vocab.bin").read_bytes()
  fraction = np.diff(indptr) / json.loads((index_dir / "agent_r1_bm25_mmap.json").read_text())["num_passages"]
  order = np.argsort(fraction, kind="stable")
  by_fraction = fraction[order]
  out = []
  for i in rng.integers(0, len(profiles), size=n):
    terms = []
    for f in profiles[i]:
      f = f if f > 0 else 10 ** rng.uniform(np.log10(by_fraction[0]), -3)
      at = min(int(np.searchsorted(by_fraction, f)) + int(rng.integers(-20, 21)), len(order) - 1)
      t = int(order[max(at, 0)])
      terms.append(vocab[offsets[t]:offsets[t + 1]].decode())
    out.append(" ".join(terms))
  return out


def corpus_stats(index_dir: pathlib.Path) -> str:
  manifest = json.loads((index_dir / "agent_r1_bm25_mmap.json").read_text())
  lengths = np.load(index_dir / "doc_lengths.npy", mmap_mode="r")
  return (f"{lengths.mean():.1f} tokens and {manifest['num_postings'] / manifest['num_passages']:.1f} distinct "
          f"terms per passage, {manifest['num_terms']} terms")


def build_bm25(corpus: pathlib.Path, out: pathlib.Path, chunk_size: int) -> tuple[float, float]:
  """(seconds, peak RSS GiB) of the offline build in a child process (seconds: the build's own, from its manifest;
  the child's start-up and imports excluded)."""
  code = ("import resource, sys\nfrom agent_r1_jax.retrieval.bm25_build import build_mmap_bm25\n"
          "build_mmap_bm25(sys.argv[1], sys.argv[2], chunk_size=int(sys.argv[3]), show_progress=False)\n"
          "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
  proc = subprocess.run([sys.executable, "-c", code, str(corpus), str(out), str(chunk_size)], capture_output=True,
                        text=True, check=True, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  seconds = json.loads((out / "agent_r1_bm25_mmap.json").read_text())["build_seconds"]
  return seconds, int(proc.stdout.split()[-1]) / 2**20


def disk_bytes(directory: pathlib.Path) -> dict[str, int]:
  groups = {"postings": ("indptr.npy", "indices.npy", "data.npy"), "vocabulary": ("vocab.bin", "vocab_offsets.npy"),
            "passages": ("passages.bin", "passage_offsets.npy"), "lengths": ("doc_lengths.npy",)}
  out = {k: sum((directory / f).stat().st_size for f in files) for k, files in groups.items()}
  out["total"] = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
  return out


def memory(pid: int) -> str:
  """RSS, PSS and anonymous memory summed over a process and its children."""
  procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
  rss = pss = anon = 0
  for p in procs:
    info = p.memory_full_info()
    rss, pss = rss + info.rss, pss + info.pss
    with open(f"/proc/{p.pid}/status", encoding="ascii") as f:
      anon += next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))
  return (f"RSS {rss / 2**30:.2f} GiB, PSS {pss / 2**30:.2f} GiB, anonymous {anon / 2**30:.2f} GiB "
          f"({len(procs)} processes)")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_server(index_dir: pathlib.Path, workers: int) -> tuple[subprocess.Popen, str]:
  import httpx  # pylint: disable=import-outside-toplevel
  port = free_port()
  proc = subprocess.Popen([sys.executable, "-m", "agent_r1_jax.retrieval.server", "--index", str(index_dir), "--port",
                           str(port), "--workers", str(workers), "--max_queries", "4096"], cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  url = f"http://127.0.0.1:{port}"
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
    try:
      # Every worker process answers /health once loaded; a few calls make it likely all are up.
      if all(httpx.get(url + "/health", timeout=2).status_code == 200 for _ in range(2 * workers)):
        return proc, url
    except httpx.HTTPError:
      time.sleep(0.2)
  raise RuntimeError("server did not become healthy")


def client(url: str, batches: list[list[str]], top_k: int, ready, go, results) -> None:
  """One client process: connects, says it is ready, waits for the start, then sends its requests one after
  another; puts the (start, end) of each into `results`."""
  import httpx  # pylint: disable=import-outside-toplevel
  with httpx.Client(timeout=600, trust_env=False) as http:
    http.get(url + "/health")
    ready.put(True)
    go.wait()
    times = []
    for batch in batches:
      t = time.time()
      http.post(url + "/search", json={"queries": batch, "top_k": top_k}).raise_for_status()
      times.append((t, time.time()))
  results.put(times)


def http_load(url: str, queries: list[str], clients: int, batch: int, top_k: int) -> tuple[float, float, float]:
  """(queries/s over all clients, median and 95th-percentile request latency in ms). The clients start together
  once all are connected (spawned processes start slowly on a busy machine)."""
  ctx = multiprocessing.get_context("spawn")
  ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
  per_client = [queries[i::clients] for i in range(clients)]
  procs = [ctx.Process(target=client, args=(url, [qs[j:j + batch] for j in range(0, len(qs), batch)], top_k, ready,
                                            go, results)) for qs in per_client]
  for proc in procs:
    proc.start()
  for _ in procs:
    ready.get(timeout=300)
  go.set()
  spans = [s for _ in procs for s in results.get(timeout=3600)]
  for proc in procs:
    proc.join()
  elapsed = max(e for _, e in spans) - min(s for s, _ in spans)
  latency = np.array([e - s for s, e in spans]) * 1e3
  return len(queries) / elapsed, float(np.median(latency)), float(np.percentile(latency, 95))


def bench_bm25(args, n: int, work: pathlib.Path) -> dict:
  from agent_r1_jax.retrieval.bm25_mmap import MmapBM25Index  # pylint: disable=import-outside-toplevel
  print(f"\n== BM25 (memory-mapped), {n} passages (load average {os.getloadavg()[0]:.2f})")
  corpus, index_dir = work / f"corpus_{n}.jsonl", work / f"bm25_{n}"
  t = time.perf_counter()
  queries = write_corpus(corpus, n, args.queries, seed=args.seed)
  print(f"corpus written in {time.perf_counter() - t:.1f} s: {corpus.stat().st_size / 2**30:.2f} GiB of JSONL")
  seconds, peak = build_bm25(corpus, index_dir, args.chunk_size)
  corpus.unlink()
  size = disk_bytes(index_dir)
  print(f"build: {seconds:.1f} s ({n / seconds:,.0f} passages/s), peak RSS {peak:.2f} GiB; {corpus_stats(index_dir)}")
  print("index on disk: " + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in size.items())
        + f" ({size['total'] / n:.0f} bytes per passage)")

  profiles = question_profiles()
  keywords = queries
  if profiles:
    queries = profile_queries(index_dir, profiles, len(keywords), np.random.default_rng(args.seed + 1))
  else:
    print("questions: shared data not found, the question runs use keyword queries")
  single = queries[:args.single_queries]
  in_process = {}
  for name, qs in (("questions", single), ("keywords", keywords[:args.single_queries])):
    for prune in (False, True):
      index = MmapBM25Index(index_dir, prune=prune)
      index.search(qs[:20], args.top_k)
      index.postings_scanned = 0
      t = time.perf_counter()
      for q in qs:
        index.search([q], args.top_k)
      in_process[name, prune] = len(qs) / (time.perf_counter() - t)
      scanned = index.postings_scanned / len(qs)
      del index
      label = f"in process, {name}, {'pruned' if prune else 'exhaustive'}"
      ratio = (f"{in_process[name, True] / in_process[name, False]:.2f}x exhaustive" if prune else "baseline")
      print(f"{label:<46}: {in_process[name, prune]:9.1f} q/s ({ratio}; {scanned:,.0f} postings read per query, "
            f"{scanned / n:.3f} N)")
  in_process = in_process["questions", True]

  proc, url = start_server(index_dir, args.workers)
  try:
    loaded = memory(proc.pid)
    print(f"server ({args.workers} workers) after load: {loaded}")
    http_load(url, queries[:50], 1, 1, args.top_k)  # warm-up
    one_client = http_load(url, single, 1, 1, args.top_k)
    singles = http_load(url, queries, args.clients, 1, args.top_k)
    batched = http_load(url, queries, args.clients, args.batch, args.top_k)
    after = memory(proc.pid)
  finally:
    proc.terminate()
    proc.wait(timeout=60)
  print("HTTP: questions, pruned search")
  label = f"HTTP, one query per request, {args.clients} clients"
  print(f"{'HTTP, one query per request, 1 client':<46}: {one_client[0]:9.1f} q/s ({one_client[0] / in_process:.2f}x "
        f"in-process), latency p50 {one_client[1]:.1f} ms, p95 {one_client[2]:.1f} ms")
  print(f"{label:<46}: {singles[0]:9.1f} q/s ({singles[0] / in_process:.2f}x in-process), latency p50 "
        f"{singles[1]:.1f} ms, p95 {singles[2]:.1f} ms")
  label = f"HTTP, batches of {args.batch}, {args.clients} clients"
  print(f"{label:<46}: {batched[0]:9.1f} q/s ({batched[0] / singles[0]:.2f}x one per request), latency p50 "
        f"{batched[1]:.1f} ms per batch")
  print(f"server after {2 * len(queries) + len(single) + 50} queries: {after}; load average {os.getloadavg()[0]:.2f}")
  if not args.keep:
    shutil.rmtree(index_dir)
  return {"n": n, "build_s": seconds, "peak": peak, "bytes": size["total"], "loaded": loaded, "after": after,
          "in_process": in_process, "one": one_client[0], "singles": singles[0], "batched": batched[0]}


class PeakRss:
  """Samples this process's RSS every 50 ms while active; `.peak` in bytes."""

  def __enter__(self):
    self.peak, self._stop = psutil.Process().memory_info().rss, threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()
    return self

  def _run(self):
    while not self._stop.wait(0.05):
      self.peak = max(self.peak, psutil.Process().memory_info().rss)

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()


def rate(fn, n: int, repeats: int = 2) -> float:
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return n / best


def bench_dense(args, work: pathlib.Path) -> None:
  from agent_r1_jax.retrieval.scann_index import ScannConfig, ScannIndex  # pylint: disable=import-outside-toplevel
  n, d = args.dense, args.dim
  print(f"\n== ScaNN (int8 reorder), {n} x {d} random unit vectors (sizing, not recall), top-{args.top_k} "
        f"(load average {os.getloadavg()[0]:.2f})")
  rng = np.random.default_rng(args.seed)
  x = np.empty((n, d), np.float32)
  for s in range(0, n, 100_000):
    block = rng.standard_normal((min(100_000, n - s), d), dtype=np.float32)
    x[s:s + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
  qs = rng.standard_normal((args.queries, d), dtype=np.float32)
  qs /= np.linalg.norm(qs, axis=1, keepdims=True)
  before = psutil.Process().memory_info().rss
  t = time.perf_counter()
  with PeakRss() as peak:
    index = ScannIndex.build(x, ScannConfig(num_neighbors=args.top_k, reorder_dtype="int8"))
  c = index.config
  print(f"build: {time.perf_counter() - t:.1f} s, peak RSS {(peak.peak - before) / 2**30:.2f} GiB above the "
        f"{x.nbytes / 2**30:.2f} GiB float32 input ({c.num_leaves} leaves, {c.num_leaves_to_search} searched, "
        f"AH {c.dims_per_block} dims/block, reorder {c.reorder_k})")
  index.save(work / "dense")
  del index
  size = sum(f.stat().st_size for f in (work / "dense").rglob("*") if f.is_file())
  print(f"index on disk: {size / 2**30:.2f} GiB ({size / n:.0f} bytes per passage)")
  n_single = min(len(qs), args.single_queries)

  def exact(batch):
    scores = batch @ x.T  # [batch, n] float32; argpartition's int64 answer is twice its size
    np.negative(scores, out=scores)
    # A copy: the slice alone is a view that would keep the whole [batch, n] answer alive in the timed list.
    return np.argpartition(scores, args.top_k, axis=1)[:, :args.top_k].copy()

  exact_single = rate(lambda: [exact(q[None]) for q in qs[:n_single]], n_single, repeats=1)
  exact_batched = rate(lambda: [exact(qs[i:i + 64]) for i in range(0, len(qs), 64)], len(qs), repeats=1)
  del x
  code = ("import psutil, sys\nfrom agent_r1_jax.retrieval.scann_index import ScannIndex\n"
          "before = psutil.Process().memory_info().rss\nindex = ScannIndex.load(sys.argv[1])\n"
          "print(psutil.Process().memory_info().rss - before)")
  loaded = subprocess.run([sys.executable, "-c", code, str(work / "dense")], capture_output=True, text=True, check=True,
                          cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  print(f"loaded index (a fresh process): RSS +{int(loaded.stdout.split()[-1]) / 2**30:.2f} GiB")
  index = ScannIndex.load(work / "dense")
  single = rate(lambda: [index.search_one(q, args.top_k) for q in qs[:n_single]], n_single)
  batched = rate(lambda: index.search(qs, args.top_k), len(qs))
  parallel = rate(lambda: index.search(qs, args.top_k, parallel=True), len(qs))
  print(f"exact numpy, single query (baseline)     : {exact_single:9.1f} q/s")
  print(f"exact numpy, batches of 64               : {exact_batched:9.1f} q/s")
  print(f"ScaNN single query                       : {single:9.1f} q/s  ({single / exact_single:.1f}x exact single)")
  print(f"ScaNN batched                            : {batched:9.1f} q/s  ({batched / single:.2f}x single, "
        f"{batched / exact_batched:.1f}x exact batched)")
  label = f"ScaNN batched, parallel ({os.cpu_count()} cpus)"
  print(f"{label:<41}: {parallel:9.1f} q/s  ({parallel / single:.2f}x single)")
  if not args.keep:
    shutil.rmtree(work / "dense")


def bench_query_encoder(args) -> None:
  """Queries/s of a BERT-base-shaped encoder (e5-base-v2's shape) on this CPU, 16-token queries."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
  except ImportError:
    print("\nquery encoder: torch/transformers not installed, skipped")
    return
  config = (transformers.BertConfig() if not args.smoke else
            transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64))
  torch.manual_seed(0)
  model = transformers.BertModel(config).eval()
  ids = torch.randint(1000, config.vocab_size, (32, 16))
  with torch.inference_mode():
    model(input_ids=ids[:1])
    single = rate(lambda: [model(input_ids=ids[i:i + 1]) for i in range(8)], 8)
    batched = rate(lambda: model(input_ids=ids), 32)
  print(f"\nquery encoder (BERT-base shape: hidden {config.hidden_size}, {config.num_hidden_layers} layers; random "
        f"weights; 16 tokens; torch {torch.__version__}, {torch.get_num_threads()} threads): {single:.1f} q/s one "
        f"at a time, {batched:.1f} q/s in batches of 32")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sizes", default="1000000,5000000", help="BM25 corpus sizes, comma-separated")
  parser.add_argument("--dense", type=int, default=1_000_000, help="dense passages (0: skip)")
  parser.add_argument("--dim", type=int, default=768)
  parser.add_argument("--queries", type=int, default=4000, help="queries per HTTP run")
  parser.add_argument("--single_queries", type=int, default=500, help="queries timed one client, one at a time")
  parser.add_argument("--clients", type=int, default=8, help="concurrent client processes")
  parser.add_argument("--batch", type=int, default=32, help="queries per request in the batched run")
  parser.add_argument("--workers", type=int, default=os.cpu_count(), help="server processes")
  parser.add_argument("--chunk_size", type=int, default=200_000, help="passages tokenized at a time by the build")
  parser.add_argument("--top_k", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workdir", default=None, help="where corpora and indexes go (default: a temporary dir)")
  parser.add_argument("--keep", action="store_true", help="keep the indexes")
  parser.add_argument("--smoke", action="store_true", help="3000 passages, 200 queries, 2 clients, 32 dims")
  args = parser.parse_args()
  if args.smoke:
    args.sizes, args.dense, args.dim, args.queries, args.single_queries = "3000", 3000, 32, 200, 50
    args.clients, args.batch, args.workers, args.chunk_size = 2, 16, 1, 1000
  print(machine())
  print(f"date {time.strftime('%Y-%m-%d %H:%M')}; python {sys.version.split()[0]}, numpy {np.__version__}")
  work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="retrieval_bench_"))
  work.mkdir(parents=True, exist_ok=True)
  rows = [bench_bm25(args, int(n), work) for n in args.sizes.split(",") if n]
  if args.dense:
    bench_dense(args, work)
  bench_query_encoder(args)
  print("\n| passages | build s | build peak RSS GiB | index GiB | in-process q/s | HTTP q/s 1 client | "
        f"HTTP q/s {args.clients} clients | HTTP q/s batches of {args.batch} |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['n']:,} | {r['build_s']:.0f} | {r['peak']:.2f} | {r['bytes'] / 2**30:.2f} | {r['in_process']:.0f} | "
          f"{r['one']:.0f} | {r['singles']:.0f} | {r['batched']:.0f} |")
  if not args.workdir and not args.keep:
    shutil.rmtree(work)


if __name__ == "__main__":
  main()
