"""Which evaluation sets a config can serve, and the config change that loads exactly the ones asked for.

  synthetic task   `synthetic_multihop` (alias `synthetic`): the synthetic world's held-out test split;
                   `synthetic_one_hop` (alias `one_hop`): one one-hop question per test question, about the
                   test split's held-out anchors (`data.synthetic.reading.held_out_one_hop`), where one
                   retrieval with the question finds the answer's passage.
  multihopqa task  each prepared `validation_<source>` split of `data.prepared_dir`: `hotpotqa`,
                   `2wikimultihopqa`, `musique` (whichever `prepare_multihopqa` wrote).
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping, Sequence

from ml_collections import config_dict

from agent_r1_jax.data import tfds_store
from agent_r1_jax.data.prepare_multihopqa import DATASET_NAME
from agent_r1_jax.data.synthetic.reading import DATA_SOURCE as SYNTHETIC_ONE_HOP_SOURCE
from agent_r1_jax.data.synthetic.reading import held_out_one_hop
from agent_r1_jax.data.synthetic.world import example_row
from agent_r1_jax.trainer import SYNTHETIC_SOURCE

MULTIHOPQA_SOURCES = ("hotpotqa", "2wikimultihopqa", "musique")
SYNTHETIC_SOURCES = (SYNTHETIC_SOURCE, SYNTHETIC_ONE_HOP_SOURCE)
_ALIASES = {"synthetic": SYNTHETIC_SOURCE, "one_hop": SYNTHETIC_ONE_HOP_SOURCE, "2wiki": "2wikimultihopqa"}
_PREPARE_FLAGS = {"hotpotqa": "--hotpotqa_dev", "2wikimultihopqa": "--twowiki_dev", "musique": "--musique_dev"}


def available_datasets(c: config_dict.ConfigDict) -> list[str]:
  """The evaluation sets of the config's task that exist on disk."""
  if c.data.source == "synthetic":
    return list(SYNTHETIC_SOURCES)
  if not c.data.prepared_dir:
    return []
  splits = tfds_store.list_splits(pathlib.Path(c.data.prepared_dir), DATASET_NAME)
  return [s[len("validation_"):] for s in splits if s.startswith("validation_")]


def select_datasets(c: config_dict.ConfigDict, names: Sequence[str] | None) -> list[str]:
  """Canonical names of the requested sets (default: all available); sets the config to load only them.

  Raises:
    ValueError: a name the task does not have prepared, with what to run or set instead.
  """
  available = available_datasets(c)
  if not names:
    if not available:
      raise ValueError(f"no evaluation set is prepared under data.prepared_dir={c.data.prepared_dir!r}; run "
                       f"`python -m agent_r1_jax.data.prepare_multihopqa --out_dir=DIR --hotpotqa_dev=...` first")
    names = available
  wanted = [_ALIASES.get(n, n) for n in names]
  if len(set(wanted)) != len(wanted):
    raise ValueError(f"--datasets lists a dataset twice: {list(names)}")
  for name in wanted:
    if name in available:
      continue
    if c.data.source == "synthetic":
      hint = (f"this task is the synthetic world (data.source='synthetic'), whose evaluation sets are "
              f"{list(SYNTHETIC_SOURCES)}; for real data set --config.data.source=multihopqa and "
              f"--config.data.prepared_dir")
    elif name in MULTIHOPQA_SOURCES:
      hint = (f"prepare it with `python -m agent_r1_jax.data.prepare_multihopqa --out_dir={c.data.prepared_dir} "
              f"{_PREPARE_FLAGS[name]}=FILE --overwrite ...` (keep the other files you prepared)")
    else:
      hint = f"known multi-hop QA sets: {list(MULTIHOPQA_SOURCES)}"
    raise ValueError(f"dataset {name!r} is not prepared for this task (available: {available}); {hint}")
  if c.data.source != "synthetic":
    with c.unlocked():
      c.data.val_sources = tuple(wanted)
  return wanted


def load_datasets(task: Any, names: Sequence[str]) -> dict[str, Sequence[Mapping[str, Any]]]:
  """The examples of each set `select_datasets` returned: the task's held-out splits, and the synthetic
  one-hop set built from the world (deterministic: the same world gives the same questions)."""
  out = {}
  for name in names:
    if name == SYNTHETIC_ONE_HOP_SOURCE:
      files = task.synthetic_files
      out[name] = [example_row(q) for q in held_out_one_hop(files.world(), files.questions("test"))]
    else:
      out[name] = task.test[name]
  return out
