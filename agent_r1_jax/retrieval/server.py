"""Retrieval HTTP server (FastAPI + uvicorn), wire-compatible with Agent-R1 and Search-R1 clients.

  python -m agent_r1_jax.retrieval.server --corpus wiki.jsonl [--index DIR] --port 8000
  python -m agent_r1_jax.retrieval.server --index idx/bm25 --workers 8 --host 0.0.0.0   # memory-mapped BM25

`--index` is a directory from `build_index` (BM25, memory-mapped BM25 or dense/ScaNN; its manifest says
which). Without it a BM25 index is built from the corpus at start-up. A memory-mapped BM25 index holds
its passages, so it needs no `--corpus`; a dense index can take its passages from such a directory
(`--passages DIR`) instead of loading the corpus. `--workers N` runs N server processes on one port: a
memory-mapped index is then shared through the page cache, not copied per process. The server binds
127.0.0.1 unless `--host` says otherwise.

Endpoints
  GET  /health   -> {"status": "ok", "retriever": "bm25"|"dense", "num_passages": N}
  POST /search   {"queries": [str], "top_k": k}  (Agent-R1)
                 -> {"query_results": [{"query": q, "results": [{"score": s, "document": doc}]}]}
  POST /retrieve {"queries": [str], "topk": k, "return_scores": bool}  (Search-R1)
                 -> {"result": [[{"document": doc, "score": s}]]}, or {"result": [[doc]]} without scores
  doc = {"id", "contents" ("\\"Title\\"\\ntext", FlashRAG), "title", "text"}

Requests are size-checked: body bytes (413), number of queries, characters per query and top-k (422).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any, Sequence

import fastapi
import pydantic
from fastapi.responses import JSONResponse

from agent_r1_jax.retrieval.base import Retriever
from agent_r1_jax.retrieval.bm25 import BM25Index
from agent_r1_jax.retrieval.bm25_build import MANIFEST as MMAP_MANIFEST
from agent_r1_jax.retrieval.bm25_mmap import MmapBM25Index
from agent_r1_jax.retrieval.corpus import load_corpus
from agent_r1_jax.retrieval.dense import DenseRetriever

_ARGS_ENV = "AGENT_R1_RETRIEVAL_SERVER_ARGS"  # the command line, handed to `--workers` processes


class SearchRequest(pydantic.BaseModel):
  """Agent-R1 request."""

  queries: list[str]
  top_k: int | None = None


class RetrieveRequest(pydantic.BaseModel):
  """Search-R1 request."""

  queries: list[str]
  topk: int | None = None
  return_scores: bool = False


def create_app(retriever: Retriever, *, retriever_kind: str, num_passages: int, default_top_k: int = 3,
               max_top_k: int = 100, max_queries: int = 512, max_query_chars: int = 4096,
               max_body_bytes: int = 4 * 1024 * 1024):
  """The FastAPI application serving `retriever`."""
  app = fastapi.FastAPI(title="agent_r1_jax retrieval server")

  @app.middleware("http")
  async def limit_body(request: fastapi.Request, call_next):
    if request.method == "POST":
      length = request.headers.get("content-length")
      if length is None:
        return JSONResponse({"detail": "Content-Length header required"}, status_code=411)
      if not length.isdigit() or int(length) > max_body_bytes:
        return JSONResponse({"detail": f"request body larger than {max_body_bytes} bytes"}, status_code=413)
    return await call_next(request)

  def run(queries: list[str], top_k: int | None):
    k = default_top_k if top_k is None else top_k
    if not 1 <= k <= max_top_k:
      raise fastapi.HTTPException(422, f"top_k must be in [1, {max_top_k}], got {k}")
    if len(queries) > max_queries:
      raise fastapi.HTTPException(422, f"at most {max_queries} queries per request, got {len(queries)}")
    longest = max((len(q) for q in queries), default=0)
    if longest > max_query_chars:
      raise fastapi.HTTPException(422, f"queries are limited to {max_query_chars} characters, got {longest}")
    return retriever.search(queries, k)

  @app.get("/health")
  def health() -> dict[str, Any]:
    return {"status": "ok", "retriever": retriever_kind, "num_passages": num_passages}

  # Plain `def` endpoints: FastAPI runs them in its thread pool, so CPU-bound searches do not block the loop.
  @app.post("/search")
  def search(request: SearchRequest) -> dict[str, Any]:
    hits = run(request.queries, request.top_k)
    return {"query_results": [
        {"query": q, "results": [{"score": h.score, "document": h.passage.to_document()} for h in row]}
        for q, row in zip(request.queries, hits)]}

  @app.post("/retrieve")
  def retrieve(request: RetrieveRequest) -> dict[str, Any]:
    hits = run(request.queries, request.topk)
    if request.return_scores:
      return {"result": [[{"document": h.passage.to_document(), "score": h.score} for h in row] for row in hits]}
    return {"result": [[h.passage.to_document() for h in row] for row in hits]}

  return app


def load_retriever(corpus: str | None, index: str | None, *, encoder: str | None = None,
                   encoder_kind: str | None = None, device: str = "cpu",
                   passages: str | None = None) -> tuple[Retriever, str, int]:
  """(retriever, kind, number of passages) for the server's command-line arguments."""
  if index and (pathlib.Path(index) / MMAP_MANIFEST).is_file():
    mmapped = MmapBM25Index(index)
    return mmapped, "bm25", len(mmapped)
  if index and (pathlib.Path(index) / "agent_r1_scann.json").is_file():
    dense = DenseRetriever.load(index, corpus_path=corpus, passages_dir=passages, encoder_path=encoder,
                                encoder_kind=encoder_kind, device=device)
    return dense, "dense", len(dense.passages)
  if not corpus:
    raise ValueError("--corpus is required unless --index is a memory-mapped BM25 index (build_index --kind bm25_mmap)")
  loaded = load_corpus(corpus)
  bm25 = BM25Index.load(index, loaded) if index else BM25Index(loaded)
  return bm25, "bm25", len(loaded)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--corpus", default=None, help="JSONL corpus (not needed for a memory-mapped BM25 index)")
  parser.add_argument("--index", default=None, help="index directory from build_index (default: BM25 at start-up)")
  parser.add_argument("--passages", default=None,
                      help="dense: a directory with a passage store (e.g. a bm25_mmap index) instead of --corpus")
  parser.add_argument("--encoder", default=None, help="query encoder directory (dense; default from the manifest)")
  parser.add_argument("--encoder_kind", choices=["bge", "e5"], default=None)
  parser.add_argument("--device", default="cpu")
  parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback only)")
  parser.add_argument("--port", type=int, default=8000)
  parser.add_argument("--workers", type=int, default=1, help="server processes sharing the port")
  parser.add_argument("--topk", type=int, default=3, help="top-k when a request does not say")
  parser.add_argument("--max_top_k", type=int, default=100)
  parser.add_argument("--max_queries", type=int, default=512)
  parser.add_argument("--max_query_chars", type=int, default=4096)
  parser.add_argument("--max_body_bytes", type=int, default=4 * 1024 * 1024)
  return parser


def _app(args: argparse.Namespace):
  retriever, kind, n = load_retriever(args.corpus, args.index, encoder=args.encoder, encoder_kind=args.encoder_kind,
                                      device=args.device, passages=args.passages)
  app = create_app(retriever, retriever_kind=kind, num_passages=n, default_top_k=args.topk,
                   max_top_k=args.max_top_k, max_queries=args.max_queries, max_query_chars=args.max_query_chars,
                   max_body_bytes=args.max_body_bytes)
  return app, kind, n


def app_from_environment():
  """The app of one `--workers` process (uvicorn imports this factory in each process it starts)."""
  return _app(_parser().parse_args(json.loads(os.environ[_ARGS_ENV])))[0]


def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  import uvicorn  # pylint: disable=import-outside-toplevel
  if args.workers > 1:
    os.environ[_ARGS_ENV] = json.dumps(list(sys.argv[1:] if argv is None else argv))
    print(f"serving the index in {args.index or args.corpus} from {args.workers} processes on "
          f"http://{args.host}:{args.port}", flush=True)
    uvicorn.run("agent_r1_jax.retrieval.server:app_from_environment", factory=True, host=args.host, port=args.port,
                workers=args.workers, log_level="warning")
    return 0
  app, kind, n = _app(args)
  print(f"serving {kind} retrieval over {n} passages on http://{args.host}:{args.port}", flush=True)
  uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
  return 0


if __name__ == "__main__":
  sys.exit(main())
