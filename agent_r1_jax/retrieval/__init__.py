"""Retrieval: corpus loading, BM25 (in memory, or memory-mapped for Wikipedia scale) and ScaNN indexes, query
and passage encoders (PyTorch, JAX), resumable sharded corpus encoding, HTTP server and client.

Heavy optional pieces (ScaNN, the encoders, the server) are imported from their modules.
"""

from agent_r1_jax.retrieval.base import RetrievalUnavailableError, Retriever
from agent_r1_jax.retrieval.bm25 import BM25Index
from agent_r1_jax.retrieval.bm25_mmap import MmapBM25Index
from agent_r1_jax.retrieval.client import HttpRetriever
from agent_r1_jax.retrieval.corpus import Passage, SearchHit, corpus_hash, load_corpus, passages_from_rows

__all__ = ["BM25Index", "HttpRetriever", "MmapBM25Index", "Passage", "RetrievalUnavailableError", "Retriever",
           "SearchHit", "corpus_hash", "load_corpus", "passages_from_rows"]
