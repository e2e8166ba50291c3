"""ScaNN maximum-inner-product index over passage embeddings.

Search returns, for each query q [D], the k rows x_i of the database X [N, D] with the largest q . x_i
(cosine similarity when both sides are L2-normalised, as the BGE/E5 encoders produce). ScaNN
approximates it in three stages, each configured by `ScannConfig`:

1. tree: k-means partitions X into `num_leaves` leaves; a query only scores the points in its
   `num_leaves_to_search` closest leaves;
2. asymmetric hashing (AH): points are product-quantised in blocks of `dims_per_block` dimensions
   (anisotropic loss weighted by `anisotropic_quantization_threshold`) and scored with lookup tables;
3. reorder: the best `reorder_k` AH candidates are re-scored and the top k returned, from the database
   kept in float32 (exact), or quantized to int8 (one scale per dimension) or bfloat16 (`reorder_dtype`).

Bytes per point on disk, D dimensions: AH codes D / dims_per_block (one byte per block, 16 centres each),
the reorder copy 4 D (float32), 2 D (bfloat16) or D (int8), and 4 for the point's leaf; e5-base
(D = 768), 2 dims per block, int8 reorder: 384 + 768 + 4 = 1156.

`save` writes ScaNN's own assets plus a manifest (kind, corpus hash, N, D, settings) that `load` checks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from typing import Any

import numpy as np

_MANIFEST = "agent_r1_scann.json"
_ASSETS = "scann"


@dataclasses.dataclass(frozen=True)
class ScannConfig:
  """ScaNN build settings.

  num_leaves: k-means leaves; None = round(sqrt(N)); 0 = no tree (every point is AH-scored).
  num_leaves_to_search: leaves probed per query; None = max(1, ceil(leaves_to_search_fraction * num_leaves)).
    Clustered real embeddings reach high recall probing 5-20% of leaves; isotropic random vectors need
    about half (measured in tests/test_retrieval_scann.py).
  min_points_for_tree: below this N the tree is skipped when num_leaves is None.
  reorder_dtype: the database copy the reorder step scores: "float32" (exact), "int8" or "bfloat16".
  """

  num_neighbors: int = 10
  num_leaves: int | None = None
  num_leaves_to_search: int | None = None
  leaves_to_search_fraction: float = 0.2
  min_points_for_tree: int = 4096
  training_sample_size: int = 100_000
  dims_per_block: int = 2
  anisotropic_quantization_threshold: float = 0.2
  reorder_k: int = 100
  reorder_dtype: str = "float32"
  training_threads: int = 0

  def resolved(self, num_points: int) -> ScannConfig:
    """The settings with automatic values filled in for a database of `num_points` rows."""
    leaves = self.num_leaves
    if leaves is None:
      leaves = 0 if num_points < self.min_points_for_tree else int(round(math.sqrt(num_points)))
    leaves = min(leaves, num_points)
    to_search = self.num_leaves_to_search
    if leaves and to_search is None:
      to_search = max(1, math.ceil(self.leaves_to_search_fraction * leaves))
    return dataclasses.replace(self, num_leaves=leaves, num_leaves_to_search=min(to_search, leaves) if leaves else 0,
                               training_sample_size=min(self.training_sample_size, num_points),
                               reorder_k=max(self.reorder_k, self.num_neighbors))


_REORDER_DTYPES = ("float32", "int8", "bfloat16")


def _scann_ops():
  from scann.scann_ops.py import scann_ops_pybind  # pylint: disable=import-outside-toplevel
  return scann_ops_pybind


class ScannIndex:
  """A built (or loaded) ScaNN searcher with its metadata. Use `build` or `load`."""

  def __init__(self, searcher: Any, *, num_points: int, dim: int, config: ScannConfig, corpus_hash: str | None,
               extra: dict[str, Any] | None = None):
    self._searcher = searcher
    self.num_points = num_points
    self.dim = dim
    self.config = config
    self.corpus_hash = corpus_hash
    self.extra = dict(extra or {})

  @classmethod
  def build(cls, embeddings: np.ndarray, config: ScannConfig | None = None, *, corpus_hash: str | None = None,
            extra: dict[str, Any] | None = None) -> ScannIndex:
    """Builds the index over `embeddings` float32 [N, D] (row i = passage i)."""
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
      raise ValueError(f"embeddings must be a non-empty [N, D] array, got shape {x.shape}")
    if not np.isfinite(x).all():
      raise ValueError("embeddings contain NaN or inf; fix the encoder output before indexing")
    cfg = (config or ScannConfig()).resolved(x.shape[0])
    if cfg.reorder_dtype not in _REORDER_DTYPES:
      raise ValueError(f"reorder_dtype must be one of {_REORDER_DTYPES}, got {cfg.reorder_dtype!r}")
    from scann.scann_ops.py.scann_builder import ReorderType  # pylint: disable=import-outside-toplevel
    builder = _scann_ops().builder(x, cfg.num_neighbors, "dot_product")
    if cfg.num_leaves:
      builder = builder.tree(num_leaves=cfg.num_leaves, num_leaves_to_search=cfg.num_leaves_to_search,
                             training_sample_size=cfg.training_sample_size)
    builder = builder.score_ah(cfg.dims_per_block,
                               anisotropic_quantization_threshold=cfg.anisotropic_quantization_threshold,
                               training_sample_size=cfg.training_sample_size)
    builder = builder.reorder(cfg.reorder_k, quantize=ReorderType[cfg.reorder_dtype.upper()])
    if cfg.training_threads:
      builder = builder.set_n_training_threads(cfg.training_threads)
    return cls(builder.build(), num_points=x.shape[0], dim=x.shape[1], config=cfg, corpus_hash=corpus_hash,
               extra=extra)

  def search(self, queries: np.ndarray, k: int | None = None, *, parallel: bool = False,
             batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Batched search: queries float32 [Q, D] -> (indices int64 [Q, k'], scores float32 [Q, k']), k' = min(k, N).

    Rows are sorted by decreasing inner product. `parallel` splits the batch into chunks of `batch_size`
    searched on ScaNN's thread pool (all cores).
    """
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if q.ndim != 2 or q.shape[1] != self.dim:
      raise ValueError(f"queries must be [Q, {self.dim}], got shape {q.shape}")
    k = min(k or self.config.num_neighbors, self.num_points)
    if q.shape[0] == 0:
      return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
    if parallel:
      idx, dist = self._searcher.search_batched_parallel(
          q, final_num_neighbors=k, pre_reorder_num_neighbors=max(self.config.reorder_k, k), batch_size=batch_size)
    else:
      idx, dist = self._searcher.search_batched(q, final_num_neighbors=k,
                                                pre_reorder_num_neighbors=max(self.config.reorder_k, k))
    return np.asarray(idx, np.int64), np.asarray(dist, np.float32)

  def search_one(self, query: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Single-query search: query float32 [D] -> (indices int64 [k'], scores float32 [k'])."""
    q = np.ascontiguousarray(query, dtype=np.float32)
    if q.shape != (self.dim,):
      raise ValueError(f"query must be [{self.dim}], got shape {q.shape}")
    k = min(k or self.config.num_neighbors, self.num_points)
    idx, dist = self._searcher.search(q, final_num_neighbors=k,
                                      pre_reorder_num_neighbors=max(self.config.reorder_k, k))
    return np.asarray(idx, np.int64), np.asarray(dist, np.float32)

  def save(self, directory: str | os.PathLike[str]) -> None:
    """Writes ScaNN's assets under `directory/scann` and the manifest `directory/agent_r1_scann.json`."""
    directory = pathlib.Path(directory)
    (directory / _ASSETS).mkdir(parents=True, exist_ok=True)
    self._searcher.serialize(str(directory / _ASSETS), relative_path=True)
    manifest = {"kind": "scann", "num_points": self.num_points, "dim": self.dim, "corpus_hash": self.corpus_hash,
                "settings": dataclasses.asdict(self.config), "extra": self.extra}
    (directory / _MANIFEST).write_text(json.dumps(manifest, indent=2))

  @staticmethod
  def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = pathlib.Path(directory) / _MANIFEST
    if not path.is_file():
      raise FileNotFoundError(f"{directory} is not a saved ScannIndex (missing {_MANIFEST})")
    return json.loads(path.read_text())

  @classmethod
  def load(cls, directory: str | os.PathLike[str], *, expected_corpus_hash: str | None = None) -> ScannIndex:
    """Loads an index written by `save`; checks the corpus hash when `expected_corpus_hash` is given."""
    manifest = cls.read_manifest(directory)
    if expected_corpus_hash is not None and manifest["corpus_hash"] != expected_corpus_hash:
      raise ValueError(f"the ScaNN index in {directory} was built on a different corpus (corpus hash differs); "
                       "rebuild it with python -m agent_r1_jax.retrieval.build_index")
    assets = pathlib.Path(directory) / _ASSETS
    searcher = _scann_ops().load_searcher(str(assets))
    return cls(searcher, num_points=manifest["num_points"], dim=manifest["dim"],
               config=ScannConfig(**manifest["settings"]), corpus_hash=manifest["corpus_hash"],
               extra=manifest.get("extra"))
