"""HTTP retriever: talks to a retrieval server in either wire format.

* `protocol="agent_r1"`: `POST {url}/search` with `{"queries": [...], "top_k": k}`, answer
  `{"query_results": [{"query": q, "results": [{"score": s, "document": {...}}, ...]}, ...]}`.
* `protocol="search_r1"`: `POST {url}/retrieve` with `{"queries": [...], "topk": k, "return_scores": true}`,
  answer `{"result": [[{"document": {...}, "score": s}, ...], ...]}` (Search-R1's retrieval_server.py).

A document is `{"id", "contents"}` (FlashRAG) optionally with `title` and `text`. Every transport
failure, timeout, non-200 status or malformed answer raises `RetrievalUnavailableError`, which the search
tool turns into an error observation.
"""

from __future__ import annotations

from typing import Any, Sequence

import httpx

from agent_r1_jax.retrieval.base import RetrievalUnavailableError, check_top_k
from agent_r1_jax.retrieval.corpus import Passage, SearchHit, split_contents

PROTOCOLS = {"agent_r1": "/search", "search_r1": "/retrieve"}


def passage_from_document(doc: Any) -> Passage:
  """Reads a served document (FlashRAG `contents`, or `title`/`text`) back into a Passage."""
  if not isinstance(doc, dict):
    raise ValueError(f"document is a {type(doc).__name__}, not an object")
  pid = str(doc.get("id", ""))
  if isinstance(doc.get("title"), str) and isinstance(doc.get("text"), str):
    return Passage(pid, doc["title"], doc["text"])
  if isinstance(doc.get("contents"), str):
    title, text = split_contents(doc["contents"])
    return Passage(pid, title, text)
  raise ValueError(f"document has keys {sorted(doc)}; expected 'contents' or 'title'+'text'")


class HttpRetriever:
  """A `Retriever` backed by a retrieval server.

  Args:
    url: server base URL (`http://127.0.0.1:8000`) or the full endpoint URL (`.../search`, `.../retrieve`).
    protocol: "agent_r1" (POST /search) or "search_r1" (POST /retrieve); inferred from a full endpoint URL.
    timeout_s: connect/read timeout of one request.
  """

  def __init__(self, url: str, *, protocol: str | None = None, timeout_s: float = 10.0):
    url = url.rstrip("/")
    for proto, path in PROTOCOLS.items():
      if url.endswith(path):
        if protocol not in (None, proto):
          raise ValueError(f"url {url!r} ends with {path}, which is the {proto!r} protocol, not {protocol!r}")
        protocol, url = proto, url[:-len(path)]
    protocol = protocol or "agent_r1"
    if protocol not in PROTOCOLS:
      raise ValueError(f"protocol must be one of {sorted(PROTOCOLS)}, got {protocol!r}")
    if not url.startswith(("http://", "https://")):
      raise ValueError(f"retrieval url must start with http:// or https://, got {url!r}")
    self.base_url = url
    self.protocol = protocol
    self.endpoint = url + PROTOCOLS[protocol]
    self._client = httpx.Client(timeout=timeout_s, trust_env=False)

  def close(self) -> None:
    self._client.close()

  def health(self) -> dict[str, Any]:
    """GET /health of the server; raises RetrievalUnavailableError when it does not answer 200."""
    try:
      r = self._client.get(self.base_url + "/health")
    except httpx.HTTPError as e:
      raise RetrievalUnavailableError(f"{type(e).__name__} for {self.base_url}/health") from e
    if r.status_code != 200:
      raise RetrievalUnavailableError(f"HTTP {r.status_code} from {self.base_url}/health")
    return r.json()

  def _post(self, body: dict[str, Any]) -> Any:
    last: Exception | None = None
    for _ in range(2):  # one retry: a pooled keep-alive connection may be stale after a server restart
      try:
        r = self._client.post(self.endpoint, json=body)
      except httpx.TimeoutException as e:
        raise RetrievalUnavailableError(f"timeout contacting {self.endpoint}") from e
      except httpx.TransportError as e:
        last = e
        continue
      if r.status_code != 200:
        raise RetrievalUnavailableError(f"HTTP {r.status_code} from {self.endpoint}: {r.text[:200]}")
      try:
        return r.json()
      except ValueError as e:
        raise RetrievalUnavailableError(f"non-JSON answer from {self.endpoint}") from e
    raise RetrievalUnavailableError(f"{type(last).__name__} contacting {self.endpoint}") from last

  def search(self, queries: Sequence[str], top_k: int = 5) -> list[list[SearchHit]]:
    check_top_k(top_k)
    queries = [str(q) for q in queries]
    if not queries:
      return []
    if self.protocol == "agent_r1":
      data = self._post({"queries": queries, "top_k": top_k})
      per_query = data.get("query_results") if isinstance(data, dict) else None
      if isinstance(per_query, list):
        per_query = [item.get("results") if isinstance(item, dict) else None for item in per_query]
    else:
      data = self._post({"queries": queries, "topk": top_k, "return_scores": True})
      per_query = data.get("result") if isinstance(data, dict) else None
    if not isinstance(per_query, list) or len(per_query) != len(queries):
      raise RetrievalUnavailableError(f"malformed answer from {self.endpoint}: expected one result list per query")
    out = []
    try:
      for items in per_query:
        if not isinstance(items, list):
          raise ValueError("a query's results are not a list")
        out.append([SearchHit(passage_from_document(it["document"]), float(it.get("score", 0.0)))
                    for it in items[:top_k]])
    except (ValueError, KeyError, TypeError) as e:
      raise RetrievalUnavailableError(f"malformed answer from {self.endpoint}: {e}") from e
    return out
