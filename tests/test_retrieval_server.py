"""The retrieval server for real (subprocess on a free loopback port) and its request limits."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from agent_r1_jax.envs import NousToolEnv
from agent_r1_jax.retrieval import BM25Index, HttpRetriever, load_corpus
from agent_r1_jax.tools import WikiSearchTool
from agent_r1_jax.tools import errors

TOPICS = ["river", "mountain", "castle", "violin", "comet", "glacier", "harbor", "desert", "orchid", "volcano"]
QUERIES = ["river castle", "violin comet harbor", "volcano glacier", "orchid desert", "nothingmatcheshere"]


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
  path = tmp_path_factory.mktemp("server") / "corpus.jsonl"
  rows = []
  for i in range(120):
    words = [TOPICS[(i * j + j) % len(TOPICS)] for j in range(1, 4 + i % 5)]
    text = f"This passage {i} is about " + " and ".join(words) + "."
    rows.append({"id": f"doc{i}", "contents": f'"Article {i} {words[0].title()}"\n{text}'})
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return path


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def _server(corpus, port, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  source = ["--corpus", str(corpus)] if corpus else []
  proc = subprocess.Popen([sys.executable, "-m", "agent_r1_jax.retrieval.server", *source, "--port", str(port),
                           "--topk", "3", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 90
    while True:
      if proc.poll() is not None:
        raise RuntimeError(f"server exited: {proc.stdout.read().decode()[-2000:]}")
      try:
        if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
          break
      except httpx.HTTPError:
        pass
      if time.monotonic() > deadline:
        raise RuntimeError("server did not become healthy in 90 s")
      time.sleep(0.2)
    yield proc
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()


def _hits(hits):
  return [[(h.passage.id, h.passage.title, h.passage.text, round(h.score, 4)) for h in row] for row in hits]


def test_server_end_to_end(corpus_path):
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  local = BM25Index(load_corpus(corpus_path))
  agent_tool = WikiSearchTool(HttpRetriever(url, timeout_s=5.0), top_k=4)
  search_r1_tool = WikiSearchTool(HttpRetriever(url + "/retrieve", timeout_s=5.0), top_k=4)
  local_tool = WikiSearchTool(local, top_k=4)
  env = NousToolEnv([agent_tool])
  call = NousToolEnv.render_call("search", {"query": "river castle"})
  with _server(corpus_path, port):
    health = httpx.get(url + "/health").json()
    assert health == {"status": "ok", "retriever": "bm25", "num_passages": 120}

    # Agent-R1 shape.
    r = httpx.post(url + "/search", json={"queries": QUERIES[:2], "top_k": 2}).json()
    assert [item["query"] for item in r["query_results"]] == QUERIES[:2]
    first = r["query_results"][0]["results"][0]
    assert set(first) == {"score", "document"} and set(first["document"]) == {"id", "contents", "title", "text"}
    assert first["document"]["contents"] == f'"{first["document"]["title"]}"\n{first["document"]["text"]}'
    # Search-R1 shape, with and without scores; top-k defaults to the server's --topk.
    r = httpx.post(url + "/retrieve", json={"queries": QUERIES[:1], "topk": 2, "return_scores": True}).json()
    assert len(r["result"]) == 1 and len(r["result"][0]) == 2 and set(r["result"][0][0]) == {"document", "score"}
    r = httpx.post(url + "/retrieve", json={"queries": QUERIES[:1]}).json()
    assert len(r["result"][0]) == 3 and "contents" in r["result"][0][0]

    # Both client protocols see exactly what the in-process index returns.
    expected = _hits(local.search(QUERIES, 4))
    assert _hits(agent_tool.retriever.search(QUERIES, 4)) == expected
    assert _hits(search_r1_tool.retriever.search(QUERIES, 4)) == expected
    calls = [{"query": q} for q in QUERIES]
    assert agent_tool.call_batch(calls) == local_tool.call_batch(calls)
    online_obs = env.step(call)
    assert online_obs[1] == [True] and "Doc 1 (Title:" in online_obs[0]

  # Server gone: an error observation, not an exception.
  result = agent_tool.call({"query": "river"})
  assert not result.success and errors.PREFIXES["unavailable"] in result.content
  obs, successes, active = env.step(call)
  assert active and successes == [False] and errors.PREFIXES["unavailable"] in obs
  assert [r.success for r in search_r1_tool.call_batch([{"query": "a"}, {"query": "b"}])] == [False, False]

  # Restarted: the same tool objects work again.
  with _server(corpus_path, port):
    assert env.step(call) == online_obs
    assert search_r1_tool.call({"query": "violin"}) == local_tool.call({"query": "violin"})


def test_request_limits(corpus_path):
  from fastapi.testclient import TestClient  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval.server import create_app  # pylint: disable=import-outside-toplevel
  index = BM25Index(load_corpus(corpus_path))
  client = TestClient(create_app(index, retriever_kind="bm25", num_passages=len(index), max_top_k=10, max_queries=4,
                                 max_query_chars=50, max_body_bytes=2000))
  assert client.post("/search", json={"queries": ["river"], "top_k": 2}).status_code == 200
  for body, status, message in [
      ({"queries": ["river"] * 5}, 422, "at most 4 queries"),
      ({"queries": ["r" * 51]}, 422, "limited to 50 characters"),
      ({"queries": ["river"], "top_k": 11}, 422, "top_k must be in [1, 10]"),
      ({"queries": ["river"], "top_k": 0}, 422, "top_k must be in [1, 10]"),
      ({"queries": "river"}, 422, "list"),
      ({"queries": ["x" * 40] * 60}, 413, "larger than 2000 bytes"),
  ]:
    for path, key in (("/search", "top_k"), ("/retrieve", "topk")):
      payload = {("queries" if k == "queries" else key): v for k, v in body.items()}
      r = client.post(path, json=payload)
      assert r.status_code == status and message in r.text, (path, payload, r.status_code, r.text)
  assert client.post("/retrieve", content=b'{"queries": ["river"]}',
                     headers={"content-type": "application/json", "content-length": "2001"}).status_code == 413


def test_memory_mapped_index_served_to_a_run_configured_for_http(corpus_path, tmp_path):
  """The path a run takes at Wikipedia scale: `build_index --kind bm25_mmap`, the server on that directory alone
  (no corpus) in two processes, and the trainer's tools built from `tool.retriever="http"`, `tool.server_url`.
  Every answer equals the in-memory index's."""
  from agent_r1_jax.retrieval import build_index  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer.config import base_config  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer.task import tool_options  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools import build_tools  # pylint: disable=import-outside-toplevel
  index_dir = tmp_path / "bm25_mmap"
  assert build_index.main(["--corpus", str(corpus_path), "--out", str(index_dir), "--kind", "bm25_mmap",
                           "--chunk_size", "16"]) == 0
  port = _free_port()
  c = base_config("grpo")
  c.tool.retriever, c.tool.server_url, c.tool.top_k = "http", f"http://127.0.0.1:{port}", 4
  env = NousToolEnv(build_tools(list(c.tool.tools), tool_options(c)))
  local_env = NousToolEnv([WikiSearchTool(BM25Index(load_corpus(corpus_path)), top_k=4)])
  calls = [NousToolEnv.render_call("search", {"query": q}) for q in QUERIES]
  with _server(None, port, "--index", str(index_dir), "--workers", "2"):
    assert httpx.get(c.tool.server_url + "/health").json() == {"status": "ok", "retriever": "bm25", "num_passages": 120}
    for call in calls:
      assert env.step(call) == local_env.step(call)
    expected = _hits(BM25Index(load_corpus(corpus_path)).search(QUERIES, 5))
    assert _hits(HttpRetriever(c.tool.server_url + "/retrieve").search(QUERIES, 5)) == expected
