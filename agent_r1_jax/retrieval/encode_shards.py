"""Embeds a corpus into shards that survive a kill: rerun the same command and it goes on where it stopped.

  python -m agent_r1_jax.retrieval.encode_shards --corpus psgs_w100.tsv --out emb/ \\
      --encoder /models/e5-base-v2 --encoder_kind e5 --backend jax --compute_dtype bfloat16 --batch_size 512
  # torch instead (a GPU host): --backend torch --device cuda; hosts split by hand: --num_hosts 4 --host_index 0

With `--backend jax` (`jax_encoder.JaxBertEncoder`) each host encodes on its local accelerators; on a slice
every host runs the same command and, when the launcher's environment asks for it (AGENT_R1_DISTRIBUTED=on,
as launch/tpu_pod.sh sets), the host count and index come from `jax.distributed`.

Shard s holds the embeddings of passages [s * shard_size, (s + 1) * shard_size) as `emb-SSSSS.npy` (float32
[n, D]) with `emb-SSSSS.json` ({"num_passages", "corpus_hash"} of exactly those passages). A shard is
written into `emb-SSSSS.npy.partial` and renamed when whole, then its JSON is written; a shard counts as
done only when both exist and the JSON matches the passages the corpus now has there, so a killed run
redoes at most the shard it was in. Host h of H encodes the shards with s mod H = h; every host reads the
whole corpus (to find its shards and hash it) and records the corpus's size and hash in the manifest
`agent_r1_embeddings.json`, with the settings a rerun must repeat (shard size, dimension, encoder).
`load_embeddings` joins the shards once all are done; `build_index --kind dense --embeddings DIR` indexes them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from agent_r1_jax.retrieval.corpus import CorpusHasher, corpus_hash, iter_passages

MANIFEST = "agent_r1_embeddings.json"


def _shard(directory: pathlib.Path, s: int, suffix: str) -> pathlib.Path:
  return directory / f"emb-{s:05d}{suffix}"


def _write_json(path: pathlib.Path, value: dict) -> None:
  tmp = path.with_name(path.name + ".partial")
  tmp.write_text(json.dumps(value, indent=2))
  os.replace(tmp, path)


def _shard_done(directory: pathlib.Path, s: int, expected: dict) -> bool:
  meta = _shard(directory, s, ".json")
  return (_shard(directory, s, ".npy").is_file() and meta.is_file() and json.loads(meta.read_text()) == expected)


def count_lines(path: str | os.PathLike[str]) -> int:
  """Newlines in a file (the passages of a JSONL corpus; a TSV's plus its header): the progress bar's total."""
  with open(path, "rb") as f:
    return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))


def encode_corpus(corpus: str | os.PathLike[str], out_dir: str | os.PathLike[str], encoder, *,
                  shard_size: int = 100_000, num_hosts: int = 1, host_index: int = 0, encode_batch: int = 1024,
                  encoder_info: dict[str, Any] | None = None, show_progress: bool = True) -> dict:
  """Encodes this host's missing shards of `corpus` with `encoder.encode_passages`; returns the manifest.

  `encoder_info` (e.g. the encoder's path, kind and max length) is recorded and must be the same on a
  rerun, as must `shard_size` and the dimension: shards made with other settings are never mixed.
  """
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  if not 0 <= host_index < num_hosts:
    raise ValueError(f"host_index must be in [0, {num_hosts}), got {host_index}")
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  settings = {"shard_size": int(shard_size), "dim": int(encoder.dim), "encoder": encoder_info or {}}
  manifest_path = out / MANIFEST
  if manifest_path.is_file():
    previous = json.loads(manifest_path.read_text())
    if previous["settings"] != settings:
      raise ValueError(f"{out} holds embeddings made with {previous['settings']}, not {settings}; "
                       "rerun with those settings or use another directory")
  else:
    _write_json(manifest_path, {"settings": settings})
  lines = count_lines(corpus)
  mine = sum(min(shard_size, lines - s * shard_size) for s in range(host_index, -(-lines // shard_size), num_hosts))
  hasher = CorpusHasher()
  num_passages = 0
  passages = iter(iter_passages(corpus))
  with tqdm(total=mine, unit="passage", desc=f"embedding (host {host_index} of {num_hosts})",
            disable=not show_progress) as bar:
    for s in itertools.count():
      chunk = list(itertools.islice(passages, shard_size))
      if not chunk:
        break
      for p in chunk:
        hasher.update(p)
      num_passages += len(chunk)
      if s % num_hosts != host_index:
        continue
      expected = {"num_passages": len(chunk), "corpus_hash": corpus_hash(chunk)}
      if _shard_done(out, s, expected):
        bar.update(len(chunk))
        continue
      partial = _shard(out, s, ".npy.partial")
      emb = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float32, shape=(len(chunk), encoder.dim))
      for start in range(0, len(chunk), encode_batch):
        block = chunk[start:start + encode_batch]
        emb[start:start + len(block)] = encoder.encode_passages([p.contents for p in block])
        bar.update(len(block))
      emb.flush()
      del emb
      os.replace(partial, _shard(out, s, ".npy"))
      _write_json(_shard(out, s, ".json"), expected)
  manifest = {"settings": settings, "num_passages": num_passages, "num_shards": -(-num_passages // shard_size),
              "corpus_hash": hasher.hexdigest()}
  _write_json(manifest_path, manifest)
  return manifest


def load_embeddings(directory: str | os.PathLike[str]) -> tuple[np.ndarray, dict]:
  """(float32 [N, D] of every shard in order, the manifest); raises naming the shards still missing."""
  directory = pathlib.Path(directory)
  if not (directory / MANIFEST).is_file():
    raise FileNotFoundError(f"{directory} holds no embeddings (missing {MANIFEST})")
  manifest = json.loads((directory / MANIFEST).read_text())
  if "num_passages" not in manifest:
    raise ValueError(f"the encoding of {directory} has not read its corpus to the end yet; rerun encode_shards")
  missing = [s for s in range(manifest["num_shards"])
             if not (_shard(directory, s, ".npy").is_file() and _shard(directory, s, ".json").is_file())]
  if missing:
    raise ValueError(f"{len(missing)} of {manifest['num_shards']} shards are missing in {directory} (first: "
                     f"{missing[:5]}); rerun encode_shards on the hosts that own them")
  out = np.empty((manifest["num_passages"], manifest["settings"]["dim"]), np.float32)
  start = 0
  for s in range(manifest["num_shards"]):
    shard = np.load(_shard(directory, s, ".npy"), mmap_mode="r")
    out[start:start + len(shard)] = shard
    start += len(shard)
  if start != len(out):
    raise ValueError(f"the shards of {directory} hold {start} rows, the manifest says {len(out)}")
  return out, manifest


def _encoder(args):
  if args.backend == "jax":
    from agent_r1_jax.retrieval.jax_encoder import JaxBertEncoder  # pylint: disable=import-outside-toplevel
    return JaxBertEncoder(args.encoder, args.encoder_kind, max_length=args.max_length, batch_size=args.batch_size,
                          compute_dtype=args.compute_dtype)
  from agent_r1_jax.retrieval.encoders import HFEncoder  # pylint: disable=import-outside-toplevel
  return HFEncoder(args.encoder, args.encoder_kind, max_length=args.max_length, batch_size=args.batch_size,
                   device=args.device)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--corpus", required=True, help="JSONL or DPR TSV corpus")
  parser.add_argument("--out", required=True, help="shard directory (shared by the hosts, or gathered after)")
  parser.add_argument("--encoder", required=True, help="local encoder model directory")
  parser.add_argument("--encoder_kind", choices=["bge", "e5"], default="e5")
  parser.add_argument("--max_length", type=int, default=256)
  parser.add_argument("--batch_size", type=int, default=64, help="passages per forward pass")
  parser.add_argument("--backend", choices=["torch", "jax"], default="torch")
  parser.add_argument("--device", default="cpu", help="torch device (cuda for a GPU)")
  parser.add_argument("--compute_dtype", choices=["float32", "bfloat16"], default="float32", help="jax matmuls")
  parser.add_argument("--shard_size", type=int, default=100_000)
  parser.add_argument("--num_hosts", type=int, default=None, help="default: jax's process count (jax), else 1")
  parser.add_argument("--host_index", type=int, default=None, help="default: jax's process index (jax), else 0")
  args = parser.parse_args(argv)
  if args.backend == "jax" and args.num_hosts is None:
    import jax  # pylint: disable=import-outside-toplevel
    from agent_r1_jax import distributed  # pylint: disable=import-outside-toplevel
    distributed.maybe_initialize()
    args.num_hosts, args.host_index = jax.process_count(), jax.process_index()
  args.num_hosts = args.num_hosts or 1
  args.host_index = args.host_index or 0
  encoder = _encoder(args)
  # The backend is not recorded (torch and JAX agree in float32, so hosts may differ); the matmul dtype is.
  info = {"path": str(pathlib.Path(args.encoder).resolve()), "kind": args.encoder_kind, "max_length": args.max_length,
          "dtype": args.compute_dtype if args.backend == "jax" else "float32"}
  manifest = encode_corpus(args.corpus, args.out, encoder, shard_size=args.shard_size, num_hosts=args.num_hosts,
                           host_index=args.host_index, encoder_info=info)
  print(f"embedded {manifest['num_passages']} passages into {manifest['num_shards']} shards in {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
