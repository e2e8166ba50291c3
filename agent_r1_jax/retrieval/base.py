"""The retriever interface shared by the BM25, dense and HTTP backends."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from agent_r1_jax.retrieval.corpus import SearchHit


class RetrievalUnavailableError(RuntimeError):
  """The retrieval backend cannot be reached (server down, connection refused, timeout, bad status)."""


@runtime_checkable
class Retriever(Protocol):
  """Anything that answers a batch of text queries with ranked passages."""

  def search(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
    """Returns, for each query in order, up to `top_k` hits sorted by decreasing score."""
    ...


def check_top_k(top_k: int, limit: int | None = None) -> int:
  """Validates a user-supplied top-k (a positive int, at most `limit` when given)."""
  if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
    raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
  if limit is not None and top_k > limit:
    raise ValueError(f"top_k={top_k} exceeds the limit {limit}")
  return top_k
