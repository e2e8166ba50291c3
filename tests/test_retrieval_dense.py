"""Query encoders (BGE/E5 pooling on a random tiny BERT) and the dense ScaNN retriever end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agent_r1_jax.retrieval import build_index  # noqa: E402
from agent_r1_jax.retrieval.corpus import load_corpus  # noqa: E402
from agent_r1_jax.retrieval.dense import DenseRetriever  # noqa: E402
from agent_r1_jax.retrieval.encoders import ENCODER_SPECS, HFEncoder  # noqa: E402
from agent_r1_jax.tools import WikiSearchTool  # noqa: E402

WORDS = ("the a of in is was city capital france paris germany berlin river band album first performance "
         "query passage represent this sentence for searching relevant passages : music rock pop tulsa "
         "oklahoma italy rome spain madrid").split()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
  """A randomly initialised 2-layer BERT with a WordPiece tokenizer, saved like a downloaded model."""
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
  path = tmp_path_factory.mktemp("tiny_bert")
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  vocab = {w: i for i, w in enumerate(specials + sorted(set(WORDS)) + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
                                      + list("abcdefghijklmnopqrstuvwxyz0123456789\".,;"))}
  tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                     special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                              cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
  fast.save_pretrained(str(path))
  config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=128)
  torch.manual_seed(0)
  transformers.BertModel(config).eval().save_pretrained(str(path))
  return path


def _reference(path, texts, pooling):
  """Embeddings computed directly from the PyTorch model, one text at a time (no padding involved)."""
  tok = transformers.AutoTokenizer.from_pretrained(str(path))
  model = transformers.AutoModel.from_pretrained(str(path)).eval()
  out = []
  with torch.no_grad():
    for text in texts:
      enc = tok(text, return_tensors="pt", truncation=True, max_length=64)
      h = model(**enc).last_hidden_state[0].numpy()
      e = h[0] if pooling == "cls" else h.mean(axis=0)
      out.append(e / np.linalg.norm(e))
  return np.stack(out)


TEXTS = ["paris is the capital of france", "the band", "berlin", "rock music album of the first band in tulsa oklahoma"]


@pytest.mark.parametrize("kind", ["bge", "e5"])
def test_encoder_pooling_prefixes_and_normalisation(tiny_bert, kind):
  spec = ENCODER_SPECS[kind]
  encoder = HFEncoder(tiny_bert, kind, max_length=64, batch_size=3)  # batches of 3 -> padding exercised
  assert encoder.dim == 32
  queries = encoder.encode_queries(TEXTS)
  passages = encoder.encode_passages(TEXTS)
  np.testing.assert_allclose(queries, _reference(tiny_bert, [spec.query_prefix + t for t in TEXTS], spec.pooling),
                             atol=2e-5)
  np.testing.assert_allclose(passages, _reference(tiny_bert, [spec.passage_prefix + t for t in TEXTS], spec.pooling),
                             atol=2e-5)
  np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
  assert not np.allclose(queries, passages)  # the query side is prefixed differently in both families


def test_encoder_rejects_bad_setup(tiny_bert, tmp_path):
  with pytest.raises(ValueError, match="encoder kind"):
    HFEncoder(tiny_bert, "colbert")
  with pytest.raises(FileNotFoundError, match="encoder directory not found"):
    HFEncoder(tmp_path / "nope")


def test_build_index_command_and_dense_search(tiny_bert, tmp_path):
  corpus = tmp_path / "corpus.jsonl"
  rows = [{"id": f"p{i}", "contents": f'"{w.title()}"\n{w} {WORDS[(i * 7) % len(WORDS)]} {WORDS[(i * 3) % len(WORDS)]}'}
          for i, w in enumerate(WORDS)]
  corpus.write_text("\n".join(json.dumps(r) for r in rows))
  out = tmp_path / "dense"
  assert build_index.main(["--corpus", str(corpus), "--out", str(out), "--kind", "dense", "--encoder", str(tiny_bert),
                           "--encoder_kind", "e5", "--max_length", "64", "--batch_size", "8",
                           "--scann.reorder_k", "100"]) == 0
  embeddings = np.load(out / "embeddings.npy")
  passages = load_corpus(corpus)
  # The stored embeddings are exactly the E5 passage embeddings of each passage's FlashRAG contents.
  np.testing.assert_allclose(embeddings, _reference(tiny_bert, ["passage: " + p.contents for p in passages], "mean"),
                             atol=2e-5)
  retriever = DenseRetriever.load(out)  # corpus, encoder and its kind come from the manifest
  queries = ["capital of france", "rock band", "river in spain"]
  q_emb = _reference(tiny_bert, ["query: " + q for q in queries], "mean")
  exact = np.argsort(-(q_emb @ embeddings.T), axis=1, kind="stable")[:, :4]
  hits = retriever.search(queries, top_k=4)
  # N < reorder_k, so the reorder step scores every passage exactly: results equal brute force.
  assert [[h.passage.id for h in row] for row in hits] == [[passages[i].id for i in row] for row in exact]
  tool = WikiSearchTool.from_config(backend="dense", index_dir=str(out), corpus_path=str(corpus),
                                    encoder_path=str(tiny_bert), encoder_kind="e5", encoder_max_length=64, top_k=2)
  result = tool.call({"query": "capital of france"})
  assert result.success and result.content.startswith(f'Doc 1 (Title: "{hits[0][0].passage.title}")')
  assert result.content.count("\nDoc ") == 1
  (tmp_path / "other.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:-1]))
  with pytest.raises(ValueError, match="different corpus"):
    DenseRetriever.load(out, corpus_path=tmp_path / "other.jsonl")


def test_server_loads_dense_and_bm25_index_dirs(tiny_bert, tmp_path):
  from agent_r1_jax.retrieval.bm25 import BM25Index  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval.server import load_retriever  # pylint: disable=import-outside-toplevel
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text("\n".join(json.dumps({"title": w.title(), "text": f"{w} {WORDS[(i + 5) % len(WORDS)]}"})
                              for i, w in enumerate(WORDS)))
  dense_dir, bm25_dir = tmp_path / "dense", tmp_path / "bm25"
  assert build_index.main(["--corpus", str(corpus), "--out", str(dense_dir), "--encoder", str(tiny_bert),
                           "--max_length", "32"]) == 0
  assert build_index.main(["--corpus", str(corpus), "--out", str(bm25_dir), "--kind", "bm25", "--k1", "1.2"]) == 0
  queries = ["capital city", "rock music"]
  dense, kind, n = load_retriever(str(corpus), str(dense_dir))
  assert kind == "dense" and n == len(WORDS) and isinstance(dense, DenseRetriever)
  assert dense.encoder.kind == "bge" and dense.encoder.max_length == 32  # recorded in the manifest
  assert dense.search(queries, 3) == DenseRetriever.load(dense_dir).search(queries, 3)
  bm25, kind, n = load_retriever(str(corpus), str(bm25_dir))
  assert kind == "bm25" and n == len(WORDS) and bm25.settings["k1"] == 1.2
  assert bm25.search(queries, 3) == BM25Index(load_corpus(corpus), k1=1.2).search(queries, 3)


_DYING_ENCODE = """
import os, sys
from agent_r1_jax.retrieval.encode_shards import encode_corpus
from agent_r1_jax.retrieval.encoders import HFEncoder
encoder = HFEncoder(sys.argv[1], "e5", max_length=32, batch_size=4)
calls, encode = [0], encoder.encode_passages
def dying(texts):
  calls[0] += 1
  if calls[0] == int(sys.argv[4]):
    os._exit(9)  # no clean-up, as a preempted host
  return encode(texts)
encoder.encode_passages = dying
encode_corpus(sys.argv[2], sys.argv[3], encoder, shard_size=5, encode_batch=2, encoder_info={"kind": "e5"},
              show_progress=False)
"""


def _wiki_corpus(path, n=23):
  path.write_text("".join(json.dumps({"id": f"p{i}", "title": WORDS[i % len(WORDS)].title(),
                                      "text": " ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 9))}) + "\n"
                          for i in range(n)))
  return path


def test_sharded_encoding_resumes_after_a_kill(tiny_bert, tmp_path):
  """Killed in its third shard, the encode leaves two shards and a partial one; the rerun encodes only the
  passages not yet stored and ends with the embeddings of an uninterrupted run. Two hosts splitting the shards
  give them too."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval.encode_shards import (  # pylint: disable=import-outside-toplevel
      encode_corpus, load_embeddings)
  corpus = _wiki_corpus(tmp_path / "corpus.jsonl")
  encoder = HFEncoder(tiny_bert, "e5", max_length=32, batch_size=4)
  options = dict(shard_size=5, encode_batch=2, encoder_info={"kind": "e5"}, show_progress=False)
  whole = encode_corpus(corpus, tmp_path / "whole", encoder, **options)
  reference, _ = load_embeddings(tmp_path / "whole")
  np.testing.assert_allclose(reference, encoder.encode_passages([p.contents for p in load_corpus(corpus)]), atol=1e-6)

  resumed = tmp_path / "resumed"
  proc = subprocess.run([sys.executable, "-c", _DYING_ENCODE, str(tiny_bert), str(corpus), str(resumed), "8"],
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 9, proc.stderr[-2000:]
  assert sorted(p.name for p in resumed.glob("emb-*")) == ["emb-00000.json", "emb-00000.npy", "emb-00001.json",
                                                           "emb-00001.npy", "emb-00002.npy.partial"]
  with pytest.raises(ValueError, match="has not read its corpus to the end"):
    load_embeddings(resumed)
  kept = {p.name: p.stat().st_mtime_ns for p in resumed.glob("emb-0000[01].*")}
  encoded = []

  class Counting:
    dim = encoder.dim

    def encode_passages(self, texts):
      encoded.extend(texts)
      return encoder.encode_passages(texts)

  assert encode_corpus(corpus, resumed, Counting(), **options) == whole
  assert len(encoded) == 23 - 10 and {p.name: p.stat().st_mtime_ns for p in resumed.glob("emb-0000[01].*")} == kept
  np.testing.assert_allclose(load_embeddings(resumed)[0], reference, atol=1e-6)

  hosts = tmp_path / "hosts"
  encode_corpus(corpus, hosts, encoder, num_hosts=2, host_index=1, **options)
  with pytest.raises(ValueError, match=r"3 of 5 shards are missing .*\[0, 2, 4\]"):
    load_embeddings(hosts)
  encode_corpus(corpus, hosts, encoder, num_hosts=2, host_index=0, **options)
  np.testing.assert_allclose(load_embeddings(hosts)[0], reference, atol=1e-6)
  with pytest.raises(ValueError, match="holds embeddings made with"):
    encode_corpus(corpus, hosts, encoder, **dict(options, shard_size=6))


def test_dense_index_from_shards_served_with_mmapped_passages(tiny_bert, tmp_path):
  """21M-passage serving without the corpus in memory: ScaNN (int8 reorder) built from the shards, passages read
  from a bm25_mmap directory's store; the same hits as the dense index loaded with the corpus file."""
  from agent_r1_jax.retrieval.encode_shards import encode_corpus  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval.passage_store import PassageStore  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval.server import load_retriever  # pylint: disable=import-outside-toplevel
  corpus = _wiki_corpus(tmp_path / "corpus.jsonl", n=60)
  encoder = HFEncoder(tiny_bert, "e5", max_length=32, batch_size=8)
  info = {"path": str(tiny_bert), "kind": "e5", "max_length": 32}
  encode_corpus(corpus, tmp_path / "emb", encoder, shard_size=16, encoder_info=info, show_progress=False)
  assert build_index.main(["--embeddings", str(tmp_path / "emb"), "--out", str(tmp_path / "dense"),
                           "--scann.reorder_dtype", "int8"]) == 0
  assert build_index.main(["--corpus", str(corpus), "--out", str(tmp_path / "bm25"), "--kind", "bm25_mmap"]) == 0
  retriever, kind, n = load_retriever(None, str(tmp_path / "dense"), passages=str(tmp_path / "bm25"))
  assert kind == "dense" and n == 60 and isinstance(retriever.passages, PassageStore)
  assert retriever.index.config.reorder_dtype == "int8" and retriever.encoder.kind == "e5"
  queries = ["capital city", "rock music album", "river band"]
  with_corpus = DenseRetriever.load(tmp_path / "dense", corpus_path=corpus)
  assert retriever.search(queries, 5) == with_corpus.search(queries, 5)
  top = retriever.search(queries, 1)
  exact = np.argmax(encoder.encode_queries(queries) @ encoder.encode_passages(
      [p.contents for p in load_corpus(corpus)]).T, axis=1)
  assert [row[0].passage.id for row in top] == [f"p{i}" for i in exact]
  (tmp_path / "other.jsonl").write_text((tmp_path / "corpus.jsonl").read_text().replace("p0", "q0", 1))
  assert build_index.main(["--corpus", str(tmp_path / "other.jsonl"), "--out", str(tmp_path / "other"),
                           "--kind", "bm25_mmap"]) == 0
  with pytest.raises(ValueError, match="different corpus"):
    load_retriever(None, str(tmp_path / "dense"), passages=str(tmp_path / "other"))


@pytest.mark.parametrize("kind", ["bge", "e5"])
def test_jax_encoder_equals_the_torch_encoder(tiny_bert, kind):
  """The JAX BERT (what a TPU slice encodes with) against transformers' PyTorch BertModel through HFEncoder: batches
  padded in rows and to a length bucket change nothing. The bfloat16 path runs and stays close (XLA:CPU may keep
  excess precision, so this checks the path, not the size of bfloat16 rounding on a TPU)."""
  from agent_r1_jax.retrieval.jax_encoder import JaxBertEncoder  # pylint: disable=import-outside-toplevel
  texts = TEXTS + [" ".join(WORDS)]
  torch_encoder = HFEncoder(tiny_bert, kind, max_length=64, batch_size=8)
  encoder = JaxBertEncoder(tiny_bert, kind, max_length=64, batch_size=3)
  assert encoder.dim == 32
  np.testing.assert_allclose(encoder.encode_passages(texts), torch_encoder.encode_passages(texts), atol=2e-5)
  np.testing.assert_allclose(encoder.encode_queries(texts), torch_encoder.encode_queries(texts), atol=2e-5)
  low = JaxBertEncoder(tiny_bert, kind, max_length=64, compute_dtype="bfloat16").encode_passages(texts)
  np.testing.assert_allclose(low, torch_encoder.encode_passages(texts), atol=1e-2)


def test_encode_shards_command_with_the_jax_backend(tiny_bert, tmp_path):
  from agent_r1_jax.retrieval import encode_shards  # pylint: disable=import-outside-toplevel
  corpus = _wiki_corpus(tmp_path / "corpus.jsonl", n=12)
  assert encode_shards.main(["--corpus", str(corpus), "--out", str(tmp_path / "emb"), "--encoder", str(tiny_bert),
                             "--backend", "jax", "--max_length", "32", "--shard_size", "5", "--batch_size", "4"]) == 0
  embeddings, manifest = encode_shards.load_embeddings(tmp_path / "emb")
  assert manifest["num_shards"] == 3 and manifest["settings"]["encoder"]["dtype"] == "float32"
  expected = HFEncoder(tiny_bert, "e5", max_length=32).encode_passages([p.contents for p in load_corpus(corpus)])
  np.testing.assert_allclose(embeddings, expected, atol=2e-5)
