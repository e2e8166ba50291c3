"""ScaNN index: recall against exact inner-product search, persistence, manifest checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent_r1_jax.retrieval.scann_index import ScannConfig, ScannIndex


def _data(n=5000, d=32, q=200, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n, d)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  return x, rng.standard_normal((q, d)).astype(np.float32)


def _recall(found, x, queries, k):
  exact = np.argsort(-(queries @ x.T), axis=1, kind="stable")[:, :k]  # brute-force reference
  return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(found, exact)]))


@pytest.mark.parametrize("config", [
    ScannConfig(num_leaves=0),                                  # AH over everything + exact reorder
    ScannConfig(num_leaves=40, num_leaves_to_search=26),        # tree + AH + reorder
], ids=["ah_reorder", "tree_ah_reorder"])
def test_recall_at_10_against_exact_search(config):
  x, queries = _data()
  index = ScannIndex.build(x, config)
  idx, scores = index.search(queries, 10)
  assert idx.shape == scores.shape == (200, 10)
  recall = _recall(idx, x, queries, 10)
  print(f"\nScaNN {config.num_leaves} leaves / {config.num_leaves_to_search} searched: recall@10 = {recall:.3f}")
  assert recall >= 0.95
  # Returned scores are the exact inner products of the returned rows (reordering is exact), sorted.
  np.testing.assert_allclose(scores, np.take_along_axis(queries @ x.T, idx, axis=1), rtol=1e-4, atol=1e-4)
  assert (np.diff(scores, axis=1) <= 1e-6).all()


def test_save_load_round_trip_and_manifest(tmp_path):
  x, queries = _data(n=3000, q=50)
  index = ScannIndex.build(x, ScannConfig(num_leaves=30, num_leaves_to_search=10, num_neighbors=7),
                           corpus_hash="abc123", extra={"encoder_kind": "bge"})
  idx, scores = index.search(queries)
  assert idx.shape == (50, 7)
  index.save(tmp_path / "idx")
  manifest = json.loads((tmp_path / "idx" / "agent_r1_scann.json").read_text())
  assert manifest["dim"] == 32 and manifest["num_points"] == 3000 and manifest["corpus_hash"] == "abc123"
  assert manifest["settings"]["num_leaves"] == 30 and manifest["settings"]["num_leaves_to_search"] == 10
  loaded = ScannIndex.load(tmp_path / "idx", expected_corpus_hash="abc123")
  idx2, scores2 = loaded.search(queries)
  np.testing.assert_array_equal(loaded.search(queries, parallel=True, batch_size=16)[0], idx)
  np.testing.assert_array_equal(idx2, idx)
  np.testing.assert_array_equal(scores2, scores)
  assert loaded.config == index.config and loaded.extra == {"encoder_kind": "bge"}
  one_idx, one_scores = loaded.search_one(queries[3])
  np.testing.assert_array_equal(one_idx, idx[3])
  np.testing.assert_allclose(one_scores, scores[3], rtol=1e-6)
  with pytest.raises(ValueError, match="different corpus"):
    ScannIndex.load(tmp_path / "idx", expected_corpus_hash="other")
  with pytest.raises(FileNotFoundError, match="not a saved ScannIndex"):
    ScannIndex.load(tmp_path)


def test_bad_inputs_raise():
  x, _ = _data(n=100, q=1)
  with pytest.raises(ValueError, match=r"\[N, D\]"):
    ScannIndex.build(x[0])
  bad = x.copy()
  bad[3, 1] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    ScannIndex.build(bad)
  index = ScannIndex.build(x)
  assert index.config.num_leaves == 0  # small databases skip the tree
  idx, _ = index.search(x[:2], 500)
  assert idx.shape == (2, 100)  # k is clipped to N
  with pytest.raises(ValueError, match=r"\[Q, 32\]"):
    index.search(np.zeros((2, 31), np.float32))
