"""The streamed, memory-mapped BM25 index against bm25s itself and the in-memory `BM25Index`.

References: bm25s's own score matrix (every weight bit for bit), `BM25Index.search` (hits and float32
scores), a plain sort of bm25s's dense scores (ties), and a plain-Python BM25 written out here.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from agent_r1_jax.retrieval import BM25Index, Passage, corpus_hash, load_corpus
from agent_r1_jax.retrieval import bm25_scoring
from agent_r1_jax.retrieval.bm25_build import TOKEN_PATTERN, build_mmap_bm25
from agent_r1_jax.retrieval.bm25_mmap import MmapBM25Index
from agent_r1_jax.retrieval.corpus import iter_passages
from agent_r1_jax.retrieval.passage_store import PassageStore

FILES = ("indptr.npy", "indices.npy", "data.npy", "vocab.bin", "vocab_offsets.npy", "doc_lengths.npy",
         "passages.bin", "passage_offsets.npy")


def _corpus(n=400, seed=0) -> list[Passage]:
  """Zipf-distributed words, plus the cases tokenization must agree on: a passage with no term at all, one of
  stop words only, repeated and non-ASCII words, one-letter words (not tokens), and many equal passages (ties)."""
  rng = np.random.default_rng(seed)
  words = ["the", "of", "and", "a", "to"] + [f"w{i}" for i in range(300)] + ["café", "naïve", "Straße", "x", "I"]
  ranks = np.minimum(rng.zipf(1.3, size=n * 30) - 1, len(words) - 1)
  out, pos = [], 0
  for i in range(n):
    length = int(rng.integers(1, 30))
    out.append(Passage(f"p{i}", f"Title {i % 17}", " ".join(words[r] for r in ranks[pos:pos + length])))
    pos += length
  out[3] = Passage("p3", "", "")
  out[5] = Passage("p5", "The", "and of the a to")
  out[7] = Passage("p7", "Café", "café CAFÉ naïve w1 w1 w1 x I")
  for i in range(20, 40):
    out[i] = Passage(f"p{i}", "Twin", "w250 w251")
  return out


QUERIES = ["w1", "w2 w3", "w1 w1", "café", "naive naïve", "the of", "", "unknownword", "twin w250", "w250",
           "Title 3 w0", "w0 w1 w2 w3 w4 w5 w6 w7", "STRASSE straße", "x I"]


def _write_jsonl(path, passages):
  path.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n"
                          for p in passages), encoding="utf-8")
  return path


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
  return _write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", _corpus())


@pytest.fixture(scope="module")
def built(corpus_file, tmp_path_factory):
  out = tmp_path_factory.mktemp("mmap")
  build_mmap_bm25(corpus_file, out, chunk_size=64, show_progress=False)
  return out


def test_weights_equal_bm25s_bit_for_bit(corpus_file, built):
  reference = BM25Index(load_corpus(corpus_file))
  index = MmapBM25Index(built)
  terms = [index._terms[i].decode() for i in range(len(index._terms))]
  assert set(reference._vocab) - set(terms) == {""}  # bm25s's empty token stands for passages without terms
  s = reference._doc_term_t
  for i, term in enumerate(terms):
    r = reference._vocab[term]
    np.testing.assert_array_equal(index._indices[index._indptr[i]:index._indptr[i + 1]],
                                  s.indices[s.indptr[r]:s.indptr[r + 1]])
    np.testing.assert_array_equal(index._data[index._indptr[i]:index._indptr[i + 1]],
                                  s.data[s.indptr[r]:s.indptr[r + 1]])
  assert terms == sorted(terms, key=lambda t: t.encode())  # the vocabulary is searched by bisection


@pytest.mark.parametrize("top_k", [1, 3, 10, 1000])
def test_search_equals_in_memory_index(corpus_file, built, top_k):
  reference = BM25Index(load_corpus(corpus_file))
  index = MmapBM25Index(built)
  assert index.search(QUERIES, top_k) == reference.search(QUERIES, top_k)
  assert index.search([], top_k) == []


def test_ties_go_to_the_earlier_passage(corpus_file, built):
  """Twenty equal passages: the top 5 of "w250" are the first five of them, in corpus order (the k-th score is
  shared by passages beyond k, so an unstable partition would pick any of them)."""
  passages = load_corpus(corpus_file)
  reference = BM25Index(passages)
  for query in ["w250", "twin", "w1"]:
    tokens = [w for w in re.findall(TOKEN_PATTERN, query.lower()) if w in reference._vocab]
    dense = reference.retriever.get_scores(tokens)  # bm25s's own float32 scores of every passage
    order = sorted((i for i in range(len(passages)) if dense[i] > 0), key=lambda i: (-dense[i], i))[:5]
    for index in (MmapBM25Index(built), reference):
      hits = index.search([query], 5)[0]
      assert [h.passage.id for h in hits] == [passages[i].id for i in order]
      np.testing.assert_allclose([h.score for h in hits], dense[order], rtol=1e-6)
  assert [h.passage.id for h in MmapBM25Index(built).search(["w250"], 5)[0]] == ["p20", "p21", "p22", "p23", "p24"]


def test_chunk_size_does_not_change_the_index(corpus_file, built, tmp_path):
  for chunk_size in (1, 7, 10_000):
    out = tmp_path / f"c{chunk_size}"
    manifest = build_mmap_bm25(corpus_file, out, chunk_size=chunk_size, show_progress=False)
    assert manifest["chunk_size"] == chunk_size
    for name in FILES:
      assert (out / name).read_bytes() == (built / name).read_bytes(), (chunk_size, name)


@pytest.mark.parametrize("method,k1,b", [("robertson", 1.2, 0.75), ("atire", 1.5, 0.3), ("lucene", 2.0, 1.0)])
def test_other_bm25_variants_equal_bm25s(corpus_file, tmp_path, method, k1, b):
  build_mmap_bm25(corpus_file, tmp_path, k1=k1, b=b, method=method, chunk_size=50, show_progress=False)
  reference = BM25Index(load_corpus(corpus_file), k1=k1, b=b, method=method)
  assert MmapBM25Index(tmp_path).search(QUERIES, 4) == reference.search(QUERIES, 4)


def test_plain_python_bm25(tmp_path):
  """Lucene BM25 written out term by term (corpus without empty passages, where conventions could differ)."""
  docs = [Passage("a", "Cats", "The cat sat on the mat. Cats purr."),
          Passage("b", "Dogs", "A dog barks at the mailman; dogs love walks and dog treats."),
          Passage("c", "Pets", "Cats and dogs are the most popular pets in the world."),
          Passage("d", "Mats", "A mat is a piece of fabric placed on a floor.")]
  build_mmap_bm25(docs, tmp_path, show_progress=False)
  index = MmapBM25Index(tmp_path)
  stop = set(index.manifest["tokenizer"]["stopwords"])

  def toks(s):
    return [w for w in re.findall(r"(?u)\b\w\w+\b", s.lower()) if w not in stop]

  doc_toks = [toks(f"{d.title} {d.text}") for d in docs]
  avgdl = sum(map(len, doc_toks)) / len(docs)
  for query in ["cat mat", "dogs and cats", "floor fabric dog"]:
    scores = []
    for dt in doc_toks:
      s = 0.0
      for term in toks(query):
        df = sum(term in other for other in doc_toks)
        if df:
          tf = dt.count(term)
          s += math.log(1 + (len(docs) - df + 0.5) / (df + 0.5)) * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * len(dt) / avgdl))
      scores.append(s)
    hits = index.search([query], 4)[0]
    order = sorted((i for i in range(4) if scores[i] > 0), key=lambda i: (-scores[i], i))
    assert [h.passage.id for h in hits] == [docs[i].id for i in order]
    np.testing.assert_allclose([h.score for h in hits], [scores[i] for i in order], rtol=1e-5)


def test_dpr_tsv_reads_as_the_jsonl_corpus(tmp_path):
  passages = [Passage("1", "Aaron", 'Aaron ( or ; "Ahärôn") is a prophet, high priest'),
              Passage("2", "Bob \"B\" Smith", "tab-free text with 'quotes'"), Passage("3", "", "no title")]
  tsv = tmp_path / "psgs_w100.tsv"
  rows = ["id\ttext\ttitle"] + ["\t".join([p.id, '"' + p.text.replace('"', '""') + '"', p.title]) for p in passages]
  tsv.write_text("\n".join(rows) + "\n", encoding="utf-8")
  assert list(iter_passages(tsv)) == passages
  jsonl = _write_jsonl(tmp_path / "c.jsonl", passages)
  sizes = []
  assert list(iter_passages(jsonl, on_bytes=sizes.append)) == passages and sum(sizes) == jsonl.stat().st_size
  a = build_mmap_bm25(tsv, tmp_path / "a", show_progress=False)
  b = build_mmap_bm25(jsonl, tmp_path / "b", show_progress=False)
  assert a["corpus_hash"] == b["corpus_hash"] == corpus_hash(passages)
  bad = tmp_path / "bad.tsv"
  bad.write_text("id\ttext\ttitle\n1\tonly two fields\n")
  with pytest.raises(ValueError, match="bad.tsv:2 has 2 tab-separated fields"):
    list(iter_passages(bad))


def test_passage_store_round_trip(corpus_file, built):
  passages = load_corpus(corpus_file)
  store = PassageStore(built)
  assert len(store) == len(passages) and list(store) == passages
  assert store[7] == passages[7] and store.corpus_hash == corpus_hash(passages)
  with pytest.raises(IndexError):
    store[len(passages)]


def test_in_memory_loader_points_to_the_mmap_reader(built, tmp_path):
  with pytest.raises(ValueError, match="memory-mapped BM25 index"):
    BM25Index.load(built)
  with pytest.raises(FileNotFoundError, match="build_index --kind bm25_mmap"):
    MmapBM25Index(tmp_path)


def test_concurrent_searches_share_bounded_accumulators(built, corpus_file):
  """Searches from many threads at once equal sequential ones, with at most `max_concurrent_searches`
  accumulators ever created (each is zeroed again after its query)."""
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  index = MmapBM25Index(built, max_concurrent_searches=2)
  expected = BM25Index(load_corpus(corpus_file)).search(QUERIES * 5, 5)
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    got = list(pool.map(lambda q: index.search([q], 5)[0], QUERIES * 5))
  assert got == expected and index._created <= 2


def test_top_k_with_copies_matches_a_plain_sort():
  rng = np.random.default_rng(1)
  for _ in range(200):
    n_docs, copies, k = int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 8))
    score_of = rng.integers(0, 4, size=n_docs).astype(np.float32)  # few values: many ties, some zeros
    docs = np.concatenate([rng.permutation(n_docs)[:int(rng.integers(0, n_docs + 1))] for _ in range(copies)])
    got_docs, got_scores = bm25_scoring.top_k(docs, score_of[docs], k, copies=copies)
    expected = sorted({int(d) for d in docs if score_of[d] > 0}, key=lambda d: (-score_of[d], d))[:k]
    assert got_docs.tolist() == expected and got_scores.tolist() == score_of[expected].tolist()


def test_pruned_search_equals_exhaustive_and_skips_common_postings(tmp_path):
  """Question-like queries (rare, middling and common words) on 3000 Zipf passages: the pruned search returns
  exactly the exhaustive search's (and BM25Index's) hits and scores while reading a fraction of the postings."""
  rng = np.random.default_rng(3)
  ranks = np.minimum(rng.zipf(1.2, size=(3000, 60)) - 1, 20_000)
  passages = [Passage(str(i), f"T{i % 50}", " ".join(f"w{r}" for r in row)) for i, row in enumerate(ranks)]
  build_mmap_bm25(passages, tmp_path, chunk_size=700, show_progress=False)
  queries = []
  for i in range(150):
    common = [f"w{r}" for r in rng.integers(0, 6, size=int(rng.integers(1, 5)))]
    middling = [f"w{r}" for r in rng.integers(6, 300, size=int(rng.integers(0, 4)))]
    rare = [f"w{r}" for r in ranks[rng.integers(0, 3000)][rng.integers(0, 60, size=int(rng.integers(0, 3)))]]
    queries.append(" ".join(rng.permutation(common + middling + rare)))
  pruned, exhaustive = MmapBM25Index(tmp_path), MmapBM25Index(tmp_path, prune=False)
  reference = BM25Index(passages)
  for k in (1, 5, 20):
    expected = reference.search(queries, k)
    assert exhaustive.search(queries, k) == expected
    assert pruned.search(queries, k) == expected
  assert pruned.postings_scanned < 0.5 * exhaustive.postings_scanned, (pruned.postings_scanned,
                                                                       exhaustive.postings_scanned)
