"""Corpus loading and the BM25 index: a plain-Python BM25 reference, HotpotQA recall, persistence."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from agent_r1_jax.retrieval import BM25Index, Passage, corpus_hash, load_corpus
from agent_r1_jax.retrieval.corpus import passages_from_rows

DOCS = [
    Passage("a", "Cats", "The cat sat on the mat. Cats purr."),
    Passage("b", "Dogs", "A dog barks at the mailman; dogs love walks and dog treats."),
    Passage("c", "Pets", "Cats and dogs are the most popular pets in the world."),
    Passage("d", "Mats", "A mat is a piece of fabric placed on a floor."),
    Passage("e", "Fish", "Goldfish live in bowls."),
]


def test_load_corpus_formats(tmp_path):
  flashrag = tmp_path / "c.jsonl"
  flashrag.write_text(json.dumps({"id": "7", "contents": '"Evan Morris"\nEvan Morris was a lobbyist.\nSecond line.'})
                      + "\n\n" + json.dumps({"title": "X", "text": " body "}) + "\n")
  p = load_corpus(flashrag)
  assert p == [Passage("7", "Evan Morris", "Evan Morris was a lobbyist.\nSecond line."), Passage("1", "X", "body")]
  assert p[0].contents == '"Evan Morris"\nEvan Morris was a lobbyist.\nSecond line.'
  as_list = tmp_path / "c.json"
  as_list.write_text(json.dumps([{"title": "A", "text": "a"}, {"title": "B", "text": "b"}]))
  assert [q.title for q in load_corpus(as_list)] == ["A", "B"]
  assert len(load_corpus(flashrag, limit=1)) == 1
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"id": 1, "contents": "x"}\n{oops\n')
  with pytest.raises(ValueError, match="bad.jsonl:2 is not valid JSON"):
    load_corpus(bad)
  with pytest.raises(ValueError, match="row 0 has keys"):
    passages_from_rows([{"body": "x"}])
  with pytest.raises(ValueError, match="duplicate passage id '1'"):
    passages_from_rows([{"id": 1, "title": "a", "text": "b"}, {"id": "1", "title": "c", "text": "d"}])
  with pytest.raises(FileNotFoundError):
    load_corpus(tmp_path / "missing.jsonl")


def test_shared_flashrag_sample(shared_data):
  passages = load_corpus(shared_data / "wiki_corpus" / "flashrag_wiki18_sample_1000.jsonl")
  assert len(passages) == 1000 and passages[0].title == "Evan Morris"
  assert not passages[0].title.startswith('"') and passages[0].text.startswith("Evan Morris Evan L. Morris")


def _reference_bm25(docs, query, k1, b, stop):
  """Lucene-variant BM25 written out in plain Python."""
  def toks(s):
    return [w for w in re.findall(r"(?u)\b\w\w+\b", s.lower()) if w not in stop]
  doc_toks = [toks(f"{d.title} {d.text}") for d in docs]
  n = len(docs)
  avgdl = sum(map(len, doc_toks)) / n
  scores = []
  for dt in doc_toks:
    s = 0.0
    for term in toks(query):
      df = sum(term in other for other in doc_toks)
      if df == 0:
        continue
      idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
      tf = dt.count(term)
      s += idf * tf / (tf + k1 * (1 - b + b * len(dt) / avgdl))
    scores.append(s)
  return scores


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.5, 0.75)])
def test_bm25_matches_plain_python_reference(k1, b):
  index = BM25Index(DOCS, k1=k1, b=b)
  stop = set(index._tokenizer.stopwords)  # the stop-word list itself comes from bm25s
  queries = ["cat mat", "dogs and cats", "floor fabric", "goldfish bowl", "the", "unknown words here", "dog dog"]
  got = index.score_matrix(queries)
  for qi, q in enumerate(queries):
    ref = _reference_bm25(DOCS, q, k1, b, stop)
    np.testing.assert_allclose(got[qi], ref, rtol=1e-5, atol=1e-6)
    hits = index.search([q], top_k=3)[0]
    order = sorted((i for i in range(len(DOCS)) if ref[i] > 0), key=lambda i: (-ref[i], i))[:3]
    assert [h.passage.id for h in hits] == [DOCS[i].id for i in order]
    np.testing.assert_allclose([h.score for h in hits], [ref[i] for i in order], rtol=1e-5)
  assert index.search(["the", "unknown words here", ""], top_k=3) == [[], [], []]


def test_batched_search_equals_single_queries():
  index = BM25Index(DOCS, query_chunk=2)
  queries = ["cat", "dogs walks", "pets world", "mat floor", "fish", "cats dogs pets mat"]
  assert index.search(queries, top_k=4) == [index.search([q], top_k=4)[0] for q in queries]
  with pytest.raises(ValueError, match="top_k"):
    index.search(["cat"], top_k=0)


def test_save_load_round_trip(tmp_path):
  index = BM25Index(DOCS, k1=1.2, b=0.6)
  index.save(tmp_path / "idx")
  loaded = BM25Index.load(tmp_path / "idx")
  queries = ["cat mat", "dogs", "popular pets", "bowls"]
  assert loaded.search(queries, 3) == index.search(queries, 3)
  assert loaded.settings == index.settings and loaded.passages == DOCS
  assert BM25Index.load(tmp_path / "idx", DOCS).search(queries, 3) == index.search(queries, 3)
  with pytest.raises(ValueError, match="corpus hash differs"):
    BM25Index.load(tmp_path / "idx", DOCS[:4] + [Passage("e", "Fish", "changed")])
  manifest = json.loads((tmp_path / "idx" / "agent_r1_bm25.json").read_text())
  assert manifest["corpus_hash"] == corpus_hash(DOCS) and manifest["num_passages"] == 5
  with pytest.raises(FileNotFoundError, match="not a saved BM25Index"):
    BM25Index.load(tmp_path)


def test_hotpotqa_recall_at_5(shared_data):
  rows = [json.loads(line) for line in
          (shared_data / "hotpotqa" / "rpt_hotpot_dev_distractor_300a.jsonl").read_text().splitlines()]
  unique = {}
  for row in rows:
    for title, sentences in zip(row["context"]["title"], row["context"]["sentences"]):
      unique.setdefault((title, "".join(sentences).strip()), None)
  passages = [Passage(str(i), t, x) for i, (t, x) in enumerate(unique)]
  index = BM25Index(passages)
  hits = index.search([row["question"] for row in rows], top_k=5)
  recalls, both = [], 0
  for row, row_hits in zip(rows, hits):
    gold = set(row["supporting_facts"]["title"])
    found = gold & {h.passage.title for h in row_hits}
    recalls.append(len(found) / len(gold))
    both += found == gold
  recall = sum(recalls) / len(recalls)
  print(f"\nHotpotQA dev distractor (300 q, {len(passages)} passages): BM25 recall@5 of supporting titles "
        f"= {recall:.3f}; both titles in top-5: {both / len(rows):.3f}")
  assert recall >= 0.65  # measured 0.703 (k1=0.9, b=0.4, English stop words, no stemming)
