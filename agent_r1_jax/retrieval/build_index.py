"""Builds a retrieval index for a corpus.

  # dense: embed every passage in batches (progress bar), then build and save a ScaNN index
  python -m agent_r1_jax.retrieval.build_index --corpus wiki.jsonl --out idx/ --kind dense \\
      --encoder /models/bge-base-en-v1.5 --encoder_kind bge --batch_size 128
  # dense from embeddings made by encode_shards (21M passages: see docs/retrieval_at_scale.md)
  python -m agent_r1_jax.retrieval.build_index --embeddings emb/ --out idx/dense --kind dense \
      --scann.reorder_dtype int8
  # lexical, in memory (bm25s; up to a few million passages)
  python -m agent_r1_jax.retrieval.build_index --corpus wiki.jsonl --out idx/ --kind bm25
  # lexical, streamed to memory-mapped files (any size; JSONL or DPR's psgs_w100.tsv)
  python -m agent_r1_jax.retrieval.build_index --corpus psgs_w100.tsv --out idx/bm25 --kind bm25_mmap

The dense output directory holds `embeddings.npy` (float32 [N, D], written incrementally so the corpus
never has to fit in memory twice; absent when built from `--embeddings`), ScaNN's assets and a manifest
with the corpus hash, the dimension, the ScaNN settings and the encoder used.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
from typing import Sequence

import numpy as np

from agent_r1_jax.retrieval.bm25 import BM25Index
from agent_r1_jax.retrieval.bm25_build import build_mmap_bm25
from agent_r1_jax.retrieval.corpus import Passage, corpus_hash, load_corpus
from agent_r1_jax.retrieval.encoders import HFEncoder
from agent_r1_jax.retrieval.scann_index import ScannConfig, ScannIndex


def embed_corpus(passages: Sequence[Passage], encoder, out_path: str | os.PathLike[str], *,
                 chunk: int = 4096, show_progress: bool = True) -> np.ndarray:
  """Embeds passages (their `contents`) chunk by chunk into a .npy memmap; returns it ([N, D] float32)."""
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  emb = np.lib.format.open_memmap(str(out_path), mode="w+", dtype=np.float32, shape=(len(passages), encoder.dim))
  with tqdm(total=len(passages), desc="embedding passages", unit="passage", disable=not show_progress) as bar:
    for start in range(0, len(passages), chunk):
      block = passages[start:start + chunk]
      emb[start:start + len(block)] = encoder.encode_passages([p.contents for p in block])
      bar.update(len(block))
  emb.flush()
  return emb


def build_dense(corpus_path: str, out_dir: str, encoder_path: str, encoder_kind: str = "bge", *,
                max_length: int = 256, batch_size: int = 64, device: str = "cpu", scann_config=None,
                show_progress: bool = True):
  """Embeds the corpus and writes a ScaNN index directory; returns the `ScannIndex`."""
  passages = load_corpus(corpus_path)
  encoder = HFEncoder(encoder_path, encoder_kind, max_length=max_length, batch_size=batch_size, device=device)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  emb = embed_corpus(passages, encoder, out / "embeddings.npy", show_progress=show_progress)
  extra = {"corpus_path": str(pathlib.Path(corpus_path).resolve()),
           "encoder_path": str(pathlib.Path(encoder_path).resolve()),
           "encoder_kind": encoder_kind, "max_length": max_length}
  index = ScannIndex.build(np.asarray(emb), scann_config, corpus_hash=corpus_hash(passages), extra=extra)
  index.save(out)
  return index


def build_dense_from_embeddings(embeddings_dir: str, out_dir: str, scann_config=None):
  """Builds and saves a ScaNN index over the shards of `encode_shards`; returns the `ScannIndex`."""
  from agent_r1_jax.retrieval.encode_shards import load_embeddings  # pylint: disable=import-outside-toplevel
  emb, manifest = load_embeddings(embeddings_dir)
  encoder = manifest["settings"]["encoder"]
  extra = {"encoder_path": encoder.get("path"), "encoder_kind": encoder.get("kind", "bge"),
           "max_length": encoder.get("max_length", 256), "embeddings_dir": str(pathlib.Path(embeddings_dir).resolve())}
  index = ScannIndex.build(emb, scann_config, corpus_hash=manifest["corpus_hash"], extra=extra)
  index.save(out_dir)
  return index


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--corpus", help="JSONL corpus (FlashRAG contents or title/text rows; bm25_mmap: or DPR TSV)")
  parser.add_argument("--embeddings", help="dense: a directory of encode_shards embeddings instead of --encoder")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--kind", choices=["dense", "bm25", "bm25_mmap"], default="dense")
  parser.add_argument("--chunk_size", type=int, default=200_000, help="bm25_mmap: passages tokenized at a time")
  parser.add_argument("--encoder", help="local encoder model directory (dense)")
  parser.add_argument("--encoder_kind", choices=["bge", "e5"], default="bge")
  parser.add_argument("--max_length", type=int, default=256)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--device", default="cpu")
  for field in dataclasses.fields(ScannConfig):
    parser.add_argument(f"--scann.{field.name}", dest=f"scann_{field.name}", default=None,
                        type={"float": float, "str": str}.get(str(field.type), int),
                        help=f"ScaNN {field.name} (default {field.default})")
  parser.add_argument("--k1", type=float, default=0.9, help="BM25 k1")
  parser.add_argument("--b", type=float, default=0.4, help="BM25 b")
  args = parser.parse_args(argv)
  if not args.corpus and not (args.kind == "dense" and args.embeddings):
    parser.error(f"--kind {args.kind} needs --corpus")
  if args.kind == "bm25_mmap":
    manifest = build_mmap_bm25(args.corpus, args.out, k1=args.k1, b=args.b, chunk_size=args.chunk_size)
    print(f"wrote memory-mapped BM25 index ({manifest['num_passages']} passages, {manifest['num_terms']} terms, "
          f"{manifest['num_postings']} postings) to {args.out}")
    return 0
  if args.kind == "bm25":
    BM25Index(load_corpus(args.corpus), k1=args.k1, b=args.b).save(args.out)
    print(f"wrote BM25 index to {args.out}")
    return 0
  overrides = {f.name: getattr(args, f"scann_{f.name}") for f in dataclasses.fields(ScannConfig)
               if getattr(args, f"scann_{f.name}") is not None}
  if args.embeddings:
    index = build_dense_from_embeddings(args.embeddings, args.out, ScannConfig(**overrides))
    print(f"wrote ScaNN index ({index.num_points} x {index.dim}) to {args.out}")
    return 0
  if not args.encoder:
    parser.error("--kind dense needs --encoder (a local model directory) or --embeddings")
  index = build_dense(args.corpus, args.out, args.encoder, args.encoder_kind, max_length=args.max_length,
                      batch_size=args.batch_size, device=args.device, scann_config=ScannConfig(**overrides))
  print(f"wrote ScaNN index ({index.num_points} x {index.dim}) to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
