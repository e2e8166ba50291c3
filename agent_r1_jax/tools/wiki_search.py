"""`WikiSearchTool`: the paper's `search` tool over a retriever backend.

The model sees one function, `search(query: str)`. A call returns the top-k passages as numbered lines

  Doc 1 (Title: "Tinted Windows (band)") Tinted Windows was an American pop-rock supergroup ...
  Doc 2 (Title: "...") ...

(the Search-R1 layout with a space before the parenthesis and the title always quoted), or
`No results found.` when nothing matches. All queries of a turn go to the backend in one batched search.
"""

from __future__ import annotations

from typing import Any, Sequence

from agent_r1_jax.retrieval.base import Retriever, check_top_k
from agent_r1_jax.retrieval.bm25 import BM25Index
from agent_r1_jax.retrieval.client import HttpRetriever
from agent_r1_jax.retrieval.corpus import SearchHit, load_corpus
from agent_r1_jax.retrieval.dense import DenseRetriever
from agent_r1_jax.tools.base import BaseTool, ToolResult

NO_RESULTS = "No results found."
RETRIEVER_BACKENDS = ("bm25", "dense", "http")


def format_hits(hits: Sequence[SearchHit]) -> str:
  """Renders ranked passages for the model: `Doc {rank} (Title: "{title}") {text}`, one per line."""
  if not hits:
    return NO_RESULTS
  return "\n".join(f'Doc {i} (Title: "{h.passage.title}") {h.passage.text}' for i, h in enumerate(hits, start=1))


class WikiSearchTool(BaseTool):
  """Searches a passage corpus (Wikipedia in the paper) and returns the top-k passages.

  Args:
    retriever: any `Retriever` (`BM25Index`, `DenseRetriever`, `HttpRetriever`).
    top_k: passages per query.
    **kwargs: `BaseTool` options (timeout_s, max_argument_chars).
  """

  name = "search"
  description = ("Search Wikipedia for passages relevant to a query. Returns the most relevant passages, "
                 "each with its article title.")
  parameters = {
      "type": "object",
      "properties": {"query": {"type": "string", "description": "The search query."}},
      "required": ["query"],
  }

  def __init__(self, retriever: Retriever, *, top_k: int = 5, **kwargs: Any):
    super().__init__(**kwargs)
    if not hasattr(retriever, "search"):
      raise ValueError(f"retriever must have a search(queries, top_k) method, got {type(retriever).__name__}")
    self.retriever = retriever
    self.top_k = check_top_k(top_k)

  def execute(self, args: dict[str, Any]) -> ToolResult:
    return self.batch_execute([args])[0]

  def batch_execute(self, args_list: Sequence[dict[str, Any]]) -> list[ToolResult]:
    hits = self.retriever.search([args["query"] for args in args_list], self.top_k)
    return [ToolResult(format_hits(h), True) for h in hits]

  @classmethod
  def from_config(cls, *, backend: str = "bm25", corpus_path: str | None = None, index_dir: str | None = None,
                  url: str | None = None, protocol: str | None = None, request_timeout_s: float = 10.0,
                  encoder_path: str | None = None, encoder_kind: str = "bge", encoder_max_length: int = 256,
                  top_k: int = 5, **kwargs: Any) -> WikiSearchTool:
    """Builds the tool and its backend from config values.

    backend "bm25": `index_dir` (a saved BM25Index) or `corpus_path` (JSONL, indexed at start-up).
    backend "dense": `index_dir` (a saved ScannIndex), `corpus_path`, `encoder_path` (+ `encoder_kind`).
    backend "http": `url` of a retrieval server (+ `protocol`, `request_timeout_s`).
    """
    if backend == "bm25":
      if index_dir:
        retriever: Any = BM25Index.load(index_dir, load_corpus(corpus_path) if corpus_path else None)
      elif corpus_path:
        retriever = BM25Index(load_corpus(corpus_path))
      else:
        raise ValueError("wiki_search backend 'bm25' needs corpus_path (JSONL) or index_dir (a saved BM25Index)")
    elif backend == "dense":
      if not (index_dir and corpus_path and encoder_path):
        raise ValueError("wiki_search backend 'dense' needs index_dir, corpus_path and encoder_path")
      retriever = DenseRetriever.load(index_dir, corpus_path=corpus_path, encoder_path=encoder_path,
                                      encoder_kind=encoder_kind, max_length=encoder_max_length)
    elif backend == "http":
      if not url:
        raise ValueError("wiki_search backend 'http' needs url (e.g. http://127.0.0.1:8000)")
      retriever = HttpRetriever(url, protocol=protocol, timeout_s=request_timeout_s)
    else:
      raise ValueError(f"wiki_search backend must be one of {RETRIEVER_BACKENDS}, got {backend!r}")
    return cls(retriever, top_k=top_k, **kwargs)
