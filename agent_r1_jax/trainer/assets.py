"""Local model and data a preset can build from source files on first use (nothing is downloaded).

Two optional config entries turn files on disk into what the trainer reads:

  model.gguf_path        a GGUF checkpoint. With `model.path` unset, it is converted (transformers' GGUF loader,
                         `models.convert_gguf`) into `<cache>/models/<file stem>` and `model.path` points there.
  data.prepare.*         release files (`hotpotqa_train`, `hotpotqa_dev`). With `data.prepared_dir` unset, they
                         are prepared (`data.prepare_multihopqa`) into `<cache>/datasets/<data.prepare.name>`,
                         with a BM25 corpus of every split's context paragraphs in `corpus.jsonl` beside it, and
                         `data.prepared_dir` / `tool.corpus_path` point there. A cached dataset prepared from
                         other files (`prepared_from.json` records them) is prepared again.

Both steps are idempotent (a finished conversion or dataset is reused) and run before the config is validated
and written to the run's `config.json`, so `evaluate --workdir` sees the resolved paths. `<cache>` is
`paths.cache_dir()` (`AGENT_R1_CACHE`).
"""

from __future__ import annotations

import json
import pathlib

from ml_collections import config_dict

from agent_r1_jax import paths
from agent_r1_jax.data import prepare_multihopqa, tfds_store
from agent_r1_jax.models.convert_gguf import convert_gguf

CORPUS_FILE = "corpus.jsonl"
SOURCES_FILE = "prepared_from.json"  # the release files a cached dataset was prepared from


def _source_files(spec: config_dict.ConfigDict) -> dict[str, str | None]:
  return {k: str(pathlib.Path(spec[k]).expanduser().resolve()) if spec[k] else None
          for k in ("hotpotqa_train", "hotpotqa_dev")}


def _prepared(root: pathlib.Path, spec: config_dict.ConfigDict) -> bool:
  """Whether `root` holds a dataset prepared from exactly `spec`'s files (other files: prepare again)."""
  record = root / SOURCES_FILE
  return ((root / CORPUS_FILE).is_file() and bool(tfds_store.list_splits(root, "multihopqa"))
          and record.is_file() and json.loads(record.read_text()) == _source_files(spec))


def resolve_model(c: config_dict.ConfigDict) -> None:
  """Converts `model.gguf_path` into a checkpoint directory when `model.path` is unset (see module docstring)."""
  if c.model.path or not c.model.get("gguf_path"):
    return
  gguf = pathlib.Path(c.model.gguf_path).expanduser()
  if not gguf.is_file():
    raise ValueError(f"model.gguf_path={gguf} is not a file; point --config.model.gguf_path at the GGUF "
                     f"checkpoint, or --config.model.path at a Hugging Face directory")
  out = paths.cache_dir() / "models" / gguf.stem
  convert_gguf(gguf, out)
  c.model.path = str(out)


def resolve_data(c: config_dict.ConfigDict) -> None:
  """Prepares `data.prepare`'s release files when `data.prepared_dir` is unset (see module docstring)."""
  spec = c.data.get("prepare")
  if c.data.source != "multihopqa" or c.data.prepared_dir or spec is None:
    return
  if not (spec.hotpotqa_train or spec.hotpotqa_dev):
    return
  root = paths.cache_dir() / "datasets" / spec.name
  if not _prepared(root, spec):
    missing = [f for f in (spec.hotpotqa_train, spec.hotpotqa_dev) if f and not pathlib.Path(f).is_file()]
    if missing:
      raise ValueError(f"data.prepare names file(s) that do not exist: {missing}; set --config.data.prepare."
                       f"hotpotqa_train / hotpotqa_dev, or --config.data.prepared_dir to a prepared dataset")
    report = prepare_multihopqa.prepare(hotpotqa_train=spec.hotpotqa_train, hotpotqa_dev=spec.hotpotqa_dev,
                                        output_dir=root, train_size=None, overwrite=True,
                                        corpus_output=root / CORPUS_FILE, corpus_with_train=True,
                                        drop_dev_overlap=True, seed=c.data.shuffle_seed)
    print("\n".join(report.lines()), flush=True)
    (root / SOURCES_FILE).write_text(json.dumps(_source_files(spec)) + "\n")
  c.data.prepared_dir = str(root)
  if not (c.tool.corpus_path or c.tool.index_path or c.tool.server_url):
    c.tool.corpus_path = str(root / CORPUS_FILE)


def resolve(c: config_dict.ConfigDict) -> None:
  """Both of the above, in place."""
  with c.unlocked():
    resolve_model(c)
    resolve_data(c)
