"""A table's trainings and evaluations, each done once: a finished one (its `summary.json`, its `results.json`) is
reused, so an interrupted table resumes where it stopped.

Multi-host: every process calls these together. Whether a run or evaluation is finished and what an evaluation
holds are process 0's readings of the files (`evaluation.multihost.from_process_0`), so all processes take the
same branch and tabulate the same figures; the training (`trainer.train`) and the evaluation
(`evaluation.pipeline.run`) step through their collectives on every process and write on process 0.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils
from ml_collections import config_dict

from agent_r1_jax import trainer
from agent_r1_jax.evaluation import pipeline
from agent_r1_jax.evaluation.multihost import from_process_0
from agent_r1_jax.experiments import table_layout


def params_sha256(tree: Any) -> str:
  """SHA-256 of every array of `tree` (leaf order, dtype and bytes): equal hashes, equal parameters. Arrays
  sharded over several processes are gathered (a collective: every process calls it, all get the hash)."""
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    whole = isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
    array = np.asarray(multihost_utils.process_allgather(leaf, tiled=True) if whole else leaf)
    digest.update(str(array.dtype).encode() + str(array.shape).encode() + array.tobytes())
  return digest.hexdigest()


def step0_sha256(workdir: epath.Path) -> str:
  """The hash of the actor in `workdir`'s step-0 checkpoint (the policy RL started from)."""
  c = trainer.read_workdir_config(workdir)
  arch = trainer.model_config(c, vocab_size=len(trainer.build_task(c).tokenizer))
  return params_sha256(trainer.restore_actor(workdir, c, arch, trainer.build_mesh(c), step=0)[1])


def train_once(c: config_dict.ConfigDict, workdir: epath.Path) -> dict[str, Any]:
  """Trains `c` in `workdir` unless it finished there before (process 0's view); returns its wall time and whether
  it was reused."""
  if from_process_0(lambda: (workdir / "summary.json").is_file()):
    return {"reused": True}
  t0 = time.perf_counter()
  result = trainer.train(c, workdir)
  if result.preempted:
    raise SystemExit(f"{workdir} was interrupted (SIGTERM) at step {result.step}; rerun to resume")
  return {"reused": False, "train_seconds": time.perf_counter() - t0}


def evaluate_once(workdir: epath.Path, out_dir: epath.Path, methods: list[str],
                  num_examples: int) -> dict[str, Any]:
  """`workdir`'s latest policy evaluated with `methods` (`evaluation.pipeline.run`, what `agent_r1_jax.evaluate`
  runs) into `out_dir`, unless it holds that evaluation already; returns `read_evaluation(out_dir)` as process 0
  reads it."""
  if not from_process_0(lambda: (out_dir / "results.json").is_file()):
    pipeline.run(workdir=str(workdir), hf_checkpoint=None, base_hf_checkpoint=None, step=None, methods=methods,
                 datasets=[], out_dir=str(out_dir), num_examples=num_examples, batch_size=0, samples_per_dataset=3,
                 seed=0)
  return from_process_0(lambda: read_evaluation(out_dir))


def read_evaluation(out_dir: epath.Path) -> dict[str, Any]:
  """An evaluation's summaries and per-question EM: {"methods": {method: {data set: summary}} (results.json),
  "em": {method: [[data set, example id, EM], ...]} (records.jsonl)}."""
  em: dict[str, list[list[Any]]] = {}
  for line in (out_dir / "records.jsonl").read_text(encoding="utf-8").splitlines():
    record = json.loads(line)
    em.setdefault(record["method"], []).append(
        [record["data_source"], record["example_id"], float(record["scores"]["em"])])
  return {"methods": json.loads((out_dir / "results.json").read_text())["methods"], "em": em}


def seed_eval(evaluation: Mapping[str, Any], method: str, warmup: int, seed: int = 0) -> table_layout.SeedEval:
  """`method`'s summaries and per-question EM in `evaluation` (`read_evaluation`'s), of a run with RL seed index
  `seed` (or a baseline) from warm-up `warmup`."""
  scores = {(source, example_id): em for source, example_id, em in evaluation["em"].get(method, [])}
  return table_layout.SeedEval(evaluation["methods"][method], scores, warmup, seed)
