"""Question datasets stored as TFDS datasets in ArrayRecord files, written and read without TensorFlow.

Every prepared split (HotpotQA, 2WikiMultihopQA, MuSiQue, the synthetic world) shares one feature spec:

  id: str, data_source: str, question: str, answers: [str] (gold answer first, then aliases),
  supporting_titles: [str], contexts: [{title: str, text: str}], type: str (question type, "" if unknown)

Writing goes through a `tfds.core.GeneratorBasedBuilder` with `file_format="array_record"` (TFDS encodes
features with numpy and protobuf only; it needs the `importlib_resources` package but not TensorFlow), so the
result is a standard TFDS directory `<data_dir>/<name>/<version>/` with `dataset_info.json`, `features.json` and
`<name>-<split>.array_record-*` shards. Reading uses `tfds.data_source`, a random-access source that grain
iterates (see `loader.py`). Rows are decoded back to plain Python (str, list[str], list[dict]).
"""

from __future__ import annotations

import pathlib
import re
import shutil
from typing import Any, Mapping, Sequence

VERSION = "1.0.0"
_SPLIT_NAME = re.compile(r"^\w+$")
_EXAMPLE_KEYS = ("id", "data_source", "question", "answers", "supporting_titles", "contexts", "type")


def _features():
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  text = tfds.features.Text()
  return tfds.features.FeaturesDict({
      "id": text,
      "data_source": text,
      "question": text,
      "answers": tfds.features.Sequence(text),
      "supporting_titles": tfds.features.Sequence(text),
      "contexts": tfds.features.Sequence({"title": text, "text": text}),
      "type": text,
  })


def to_feature_row(example: Mapping[str, Any]) -> dict[str, Any]:
  """An example dict restricted to the stored columns (missing optional columns become empty)."""
  return {
      "id": str(example["id"]),
      "data_source": str(example["data_source"]),
      "question": str(example["question"]),
      "answers": [str(a) for a in example["answers"]],
      "supporting_titles": [str(t) for t in example.get("supporting_titles", [])],
      "contexts": {"title": [str(c["title"]) for c in example.get("contexts", [])],
                   "text": [str(c["text"]) for c in example.get("contexts", [])]},
      "type": str(example.get("type", "") or ""),
  }


def write_dataset(name: str, splits: Mapping[str, Sequence[Mapping[str, Any]]], data_dir: str | pathlib.Path, *,
                  description: str = "", overwrite: bool = False) -> pathlib.Path:
  """Writes `splits` (split name -> example dicts) as TFDS dataset `name` under `data_dir`; keeps row order.

  Returns:
    The dataset version directory.

  Raises:
    ValueError: for an invalid dataset/split name, an empty split, duplicate ids in a split, or an existing
      dataset when `overwrite` is False.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
    raise ValueError(f"dataset name {name!r} must be lower-case snake_case (TFDS naming)")
  for split, rows in splits.items():
    if not _SPLIT_NAME.match(split):
      raise ValueError(f"split name {split!r} must be letters, digits and underscores")
    if not rows:
      raise ValueError(f"split {split!r} of dataset {name!r} has no examples")
    ids = [str(r["id"]) for r in rows]
    if len(set(ids)) != len(ids):
      raise ValueError(f"split {split!r} of dataset {name!r} has duplicate ids")
  data_dir = pathlib.Path(data_dir)
  target = data_dir / name / VERSION
  if target.exists():
    if not overwrite:
      raise ValueError(f"dataset {name!r} already exists at {target}; pass overwrite=True (--overwrite) to "
                       f"replace it")
    shutil.rmtree(target)

  frozen = {split: [to_feature_row(r) for r in rows] for split, rows in splits.items()}

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, description=description, features=_features(),
                                 disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(rows) for split, rows in frozen.items()}

  def _generate_examples(self, rows):
    for row in rows:
      yield row["id"], row

  # A builder class per call; `skip_registration` keeps TFDS' global registry free of these ad-hoc names.
  builder_cls = type(_class_name(name), (tfds.core.GeneratorBasedBuilder,),
                     {"VERSION": tfds.core.Version(VERSION), "name": name, "_info": _info,
                      "_split_generators": _split_generators, "_generate_examples": _generate_examples,
                      "__module__": __name__}, skip_registration=True)
  builder = builder_cls(data_dir=str(data_dir), file_format="array_record")
  tfds.disable_progress_bar()
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(verify_ssl=False))
  shutil.rmtree(data_dir / "downloads", ignore_errors=True)
  return target


def _class_name(name: str) -> str:
  return "".join(part.capitalize() for part in name.split("_")) or "Dataset"


def _decode_text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def decode_example(raw: Mapping[str, Any]) -> dict[str, Any]:
  """A TFDS-decoded row (bytes, numpy arrays) as plain Python values."""
  contexts = raw.get("contexts", {"title": [], "text": []})
  return {
      "id": _decode_text(raw["id"]),
      "data_source": _decode_text(raw["data_source"]),
      "question": _decode_text(raw["question"]),
      "answers": [_decode_text(a) for a in raw["answers"]],
      "supporting_titles": [_decode_text(t) for t in raw["supporting_titles"]],
      "contexts": [{"title": _decode_text(t), "text": _decode_text(x)}
                   for t, x in zip(contexts["title"], contexts["text"])],
      "type": _decode_text(raw.get("type", b"")),
  }


class ExampleSource:
  """Random access to the decoded examples of one stored split (`len`, `[i]`, iteration); grain-compatible."""

  def __init__(self, data_dir: str | pathlib.Path, name: str, split: str):
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    path = pathlib.Path(data_dir) / name / VERSION
    if not (path / "dataset_info.json").exists():
      raise ValueError(f"no prepared dataset {name!r} under {data_dir}; run `python -m "
                       f"agent_r1_jax.data.prepare_multihopqa` (real data) or prepare the synthetic world first")
    available = list_splits(data_dir, name)
    if split not in available:
      raise ValueError(f"dataset {name!r} has no split {split!r}; available: {available}")
    self.name, self.split = name, split
    self._source = tfds.data_source(name, split=split, data_dir=str(data_dir), download=False)

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict[str, Any]:
    return decode_example(self._source[int(index)])

  def __iter__(self):
    for i in range(len(self)):
      yield self[i]

  def __repr__(self) -> str:
    return f"ExampleSource({self.name!r}, split={self.split!r}, num_examples={len(self)})"


def list_splits(data_dir: str | pathlib.Path, name: str) -> list[str]:
  """Split names of a stored dataset, from its `dataset_info.json`."""
  import json  # pylint: disable=import-outside-toplevel

  info_path = pathlib.Path(data_dir) / name / VERSION / "dataset_info.json"
  if not info_path.exists():
    return []
  info = json.loads(info_path.read_text())
  return sorted(s["name"] for s in info.get("splits", []))


def load_split(data_dir: str | pathlib.Path, name: str, split: str) -> ExampleSource:
  """The decoded examples of `name/split` stored under `data_dir`."""
  return ExampleSource(data_dir, name, split)
