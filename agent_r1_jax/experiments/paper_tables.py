"""The paper's Tables 3 and 4 in miniature: one warm-up, then every algorithm and mask ablation trained from it.

    python -m agent_r1_jax.experiments.paper_tables --workdir=DIR [--runs=grpo,ppo] [--config.trainer.total_steps=10]

The preset of `--config` (default the tiny offline one) is warmed up once (`DIR/warmup`, stopped after its
step-0 checkpoint), then every run of `RUNS` trains from that step-0 policy (`--config.init_from`), each in
`DIR/runs/<name>` with its algorithm's config and the same `--config.*` overrides. Budgets are equal in
episodes: every run samples the preset's rows per step (tiny: 40, as 8 prompts x 5 samples for GRPO, RLOO and
REINFORCE++-baseline, 40 prompts x 1 for PPO and REINFORCE++) for the same number of steps, so each learner
sees the same number of trajectories. Evaluated on the held-out sets with `agent_r1_jax.evaluate` (greedy):
every final policy, and the warm-up policy three ways: in the tool loop (Base Tool Call), Naive RAG and No
Retrieval. Writes, in DIR:

  table3.md / table4.md   the paper's layouts: EM per data set and their average beside the paper's average
                          (Qwen2.5-3B-Instruct), then substring accuracy, F1 and tool calls per episode
                          (unweighted means over the data sets)
  results.json            every run's evaluation, training and evaluation seconds (kept from the invocation that
                          did the work), start-parameter hash and config overrides; `wall_seconds` is this
                          invocation's
  em_curves.png           validation EM after every RL step of every run, beside the warm-up policy's held-out
                          EM on the same data sets, and the held-out EM of every row

A finished run (its `summary.json`) or evaluation (its `results.json`) is reused, so an interrupted table
resumes where it stopped (an unfinished run resumes from its last checkpoint). DIR may be a Cloud Storage
directory (`gs://bucket/tables`), like any run's workdir.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from absl import app, flags
from etils import epath
from ml_collections import config_dict, config_flags
from tqdm import tqdm

from agent_r1_jax import paths, trainer
from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.evaluation import pipeline
from agent_r1_jax.evaluation.report import DATASET_LABELS

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(paths.REPO_ROOT / "configs" / "grpo_multihopqa.py"),
    "Config whose preset and `--config.*` overrides every run shares (the algorithm comes from each run).",
    lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the warm-up, the runs, their evaluations and tables.")
_RUNS = flags.DEFINE_list("runs", [], "Runs to train and tabulate (default: all of RUNS).")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 200, "Held-out examples per data set (0 = all).")


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One row: `algorithm`'s config with `overrides`, in `table` (3 or 4) beside the paper's average EM."""
  name: str
  label: str
  algorithm: str
  table: int
  paper_em: float
  overrides: tuple[tuple[str, Any], ...] = ()


NO_ADVANTAGE_MASK = (("algorithm.advantage_mask", "response"),)
NO_MASKS = NO_ADVANTAGE_MASK + (("algorithm.loss_mask", "response"),)
RUNS: tuple[RunSpec, ...] = (
    RunSpec("grpo", "GRPO", "grpo", 3, 0.3877),
    RunSpec("ppo", "PPO", "ppo", 3, 0.3719),
    RunSpec("rloo", "RLOO", "rloo", 3, 0.3716),
    RunSpec("reinforce_pp_baseline", "REINFORCE++-baseline", "reinforce_pp_baseline", 3, 0.3619),
    RunSpec("reinforce_pp", "REINFORCE++", "reinforce_pp", 3, 0.3300),
    RunSpec("ppo_no_advantage_mask", "PPO w/o advantage mask", "ppo", 4, 0.3136, NO_ADVANTAGE_MASK),
    RunSpec("ppo_no_masks", "PPO w/o advantage and loss masks", "ppo", 4, 0.3022, NO_MASKS),
    RunSpec("grpo_no_loss_mask", "GRPO w/o loss mask", "grpo", 4, 0.3722, (("algorithm.loss_mask", "response"),)),
)
# Every run validates after every RL step, for the curves (evaluation draws its own key: training is unchanged).
CURVE_OVERRIDES = {"trainer.eval_every": 1}
# The warm-up policy's rows: (name, label, evaluation method, paper's average EM).
BASELINES = (("base_tool_call", "Base Tool Call", "agent", 0.0847), ("naive_rag", "Naive RAG", "naive_rag", 0.1328),
             ("no_retrieval", "No Retrieval", "no_retrieval", None))


def user_overrides(argv: Sequence[str], flag_config: config_dict.ConfigDict) -> dict[str, Any]:
  """`{dotted field: value}` of the `--config.*` flags in `argv`, typed as the parsed config holds them."""
  out = {}
  for arg in argv:
    if arg.startswith("--config."):
      dotted = arg[len("--config."):].split("=", 1)[0]
      node = flag_config
      for part in dotted.split("."):
        node = node[part]
      out[dotted] = node
  return out


def run_config(algorithm: str, preset: str, overrides: Mapping[str, Any]) -> config_dict.ConfigDict:
  """`base_config(algorithm, preset)` with `overrides` ({dotted field: value}) applied."""
  c = trainer.base_config(algorithm, preset)
  c.update_from_flattened_dict(dict(overrides))
  return c


def params_sha256(tree: Any) -> str:
  """SHA-256 of every array of `tree` (leaf order, dtype and bytes): equal hashes, equal parameters."""
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    array = np.asarray(leaf)
    digest.update(str(array.dtype).encode() + str(array.shape).encode() + array.tobytes())
  return digest.hexdigest()


def step0_sha256(workdir: epath.Path) -> str:
  """The hash of the actor in `workdir`'s step-0 checkpoint (the policy RL started from)."""
  c = trainer.read_workdir_config(workdir)
  arch = trainer.model_config(c, vocab_size=len(trainer.build_task(c).tokenizer))
  return params_sha256(trainer.restore_actor(workdir, c, arch, trainer.build_mesh(c), step=0)[1])


def train_once(c: config_dict.ConfigDict, workdir: epath.Path) -> dict[str, Any]:
  """Trains `c` in `workdir` unless it finished there before; returns its wall time and whether it was reused."""
  if (workdir / "summary.json").is_file():
    return {"reused": True}
  t0 = time.perf_counter()
  result = trainer.train(c, workdir)
  if result.preempted:
    raise SystemExit(f"{workdir} was interrupted (SIGTERM) at step {result.step}; rerun to resume")
  return {"reused": False, "train_seconds": time.perf_counter() - t0}


def evaluate_once(workdir: epath.Path, out_dir: epath.Path, methods: list[str],
                  num_examples: int) -> dict[str, Any]:
  """`workdir`'s latest policy evaluated with `methods` (`evaluation.pipeline.run`, what `agent_r1_jax.evaluate`
  runs) into `out_dir`, unless it holds that evaluation already; returns its {method: {dataset: summary}}."""
  results = out_dir / "results.json"
  if not results.is_file():
    pipeline.run(workdir=str(workdir), hf_checkpoint=None, base_hf_checkpoint=None, step=None, methods=methods,
                 datasets=[], out_dir=str(out_dir), num_examples=num_examples, batch_size=0, samples_per_dataset=3,
                 seed=0)
  return json.loads(results.read_text())["methods"]


def row_metrics(per_dataset: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
  """EM per data set, and EM / substring accuracy / F1 / tool calls averaged (unweighted) over the data sets."""
  mean = lambda k: sum(s[k] for s in per_dataset.values()) / len(per_dataset)  # noqa: E731
  return {"em": {d: s["em"] for d, s in per_dataset.items()}, "avg_em": mean("em"),
          "substring_acc": mean("substring_acc"), "f1": mean("f1"), "tool_calls": mean("tool_calls")}


def markdown_table(rows: Sequence[tuple[str, dict[str, Any], float | None]]) -> str:
  """`rows` of (label, row_metrics, paper's average EM) as one markdown table."""
  datasets = list(rows[0][1]["em"])
  header = (["Method"] + [f"EM {DATASET_LABELS.get(d, d)}" for d in datasets]
            + ["EM avg.", "paper EM avg. (Qwen2.5-3B)", "substring", "F1", "tool calls"])
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for label, m, paper in rows:
    cells = ([f"{m['em'][d]:.4f}" for d in datasets]
             + [f"{m['avg_em']:.4f}", "-" if paper is None else f"{paper:.4f}", f"{m['substring_acc']:.4f}",
                f"{m['f1']:.4f}", f"{m['tool_calls']:.2f}"])
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def tables(results: Mapping[str, Any], specs: Sequence[RunSpec]) -> tuple[str, str]:
  """(table3.md, table4.md) from `results` ("baselines" and "runs", each {name: row_metrics})."""
  table3 = [(label, results["baselines"][name], paper) for name, label, _, paper in BASELINES]
  table3 += [(s.label, results["runs"][s.name]["metrics"], s.paper_em) for s in specs if s.table == 3]
  table4 = []
  for base in ("ppo", "grpo"):  # each unablated run, then its ablations
    table4 += [(s.label, results["runs"][s.name]["metrics"], s.paper_em) for s in specs
               if s.name == base or (s.table == 4 and s.algorithm == base)]
  return markdown_table(table3), (markdown_table(table4) if table4 else "")


def plot_em_curves(results: Mapping[str, Any], workdir: epath.Path, specs: Sequence[RunSpec]) -> epath.Path:
  """`em_curves.png`: each run's validation EM per RL step beside the shared warm-up policy's held-out EM, and
  every row's held-out EM (mean over the data sets)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, (curves, bars) = plt.subplots(1, 2, figsize=(14, 4.2))
  validated = set()  # the data sets the runs validate on
  for s in specs:
    points = [(r["step"], _validation_em(r)) for r in trainer.read_metrics(workdir / "runs" / s.name)]
    points = [(step, em) for step, em in points if em]
    validated.update(source for _, em in points for source in em)
    curves.plot([step for step, _ in points], [sum(em.values()) / len(em) for _, em in points], marker=".",
                label=s.label, linestyle="-" if s.table == 3 else "--")
  warm_em = results["baselines"]["base_tool_call"]["em"]
  on_validated = [warm_em[d] for d in sorted(validated) if d in warm_em] or list(warm_em.values())
  curves.axhline(sum(on_validated) / len(on_validated), color="gray", linestyle=":",
                 label="warm-up policy (its held-out EM on these data sets)")
  curves.set(xlabel="RL step", ylabel="validation EM (greedy)", ylim=(0.0, 1.02), xlim=(0, None),
             title="validation EM of each run from the shared warm-up")
  curves.legend(fontsize=8)
  labels = [label for _, label, _, _ in BASELINES] + [s.label for s in specs]
  values = [results["baselines"][name]["avg_em"] for name, *_ in BASELINES]
  values += [results["runs"][s.name]["metrics"]["avg_em"] for s in specs]
  bars.barh(labels[::-1], values[::-1])
  bars.set(xlabel="held-out EM (greedy, mean over data sets)", xlim=(0.0, 1.0), title="final policies")
  fig.tight_layout()
  out = workdir / "em_curves.png"
  with out.open("wb") as f:  # a file object: matplotlib cannot name a bucket path
    fig.savefig(f, format="png", dpi=110)
  plt.close(fig)
  return out


def _validation_em(row: Mapping[str, Any]) -> dict[str, float]:
  """`{data set: EM}` of a metrics row's validation (`eval/<data set>/em`); empty where the step did not validate."""
  return {k.split("/")[1]: v for k, v in row.items() if k.startswith("eval/") and k.endswith("/em")}


def run_tables(workdir: str | os.PathLike, *, preset: str, overrides: Mapping[str, Any],
               run_names: Sequence[str] = (), num_examples: int = 200, progress: bool = True) -> dict[str, Any]:
  """Warm-up, runs, evaluations and tables (see the module docstring); returns what results.json holds."""
  unknown = sorted(set(run_names) - {s.name for s in RUNS})
  if unknown:
    raise ValueError(f"unknown run(s) {unknown} in --runs; choose from {[s.name for s in RUNS]}")
  specs = [s for s in RUNS if not run_names or s.name in run_names]
  root = workdir_lib.workdir_path(workdir)
  previous = json.loads((root / "results.json").read_text()) if (root / "results.json").is_file() else {}
  t0 = time.perf_counter()
  warm_dir = root / "warmup"
  warm_cfg = run_config("grpo", preset, {**overrides, "trainer.total_steps": 0})
  warm = train_once(warm_cfg, warm_dir)
  if warm["reused"]:
    warm.update({k: v for k, v in previous.get("warmup", {}).items() if k.endswith("_seconds")})
  baseline_eval = evaluate_once(warm_dir, root / "eval" / "warmup", [m for _, _, m, _ in BASELINES], num_examples)
  results: dict[str, Any] = {
      "preset": preset, "overrides": {k: repr(v) for k, v in overrides.items()}, "num_examples": num_examples,
      "warmup": {**warm, "sha256": step0_sha256(warm_dir)},
      "baselines": {name: row_metrics(baseline_eval[method]) for name, _, method, _ in BASELINES}, "runs": {}}
  for s in tqdm(specs, desc="runs", disable=not progress):
    run_dir = root / "runs" / s.name
    c = run_config(s.algorithm, preset, {**CURVE_OVERRIDES, **overrides, **dict(s.overrides),
                                         "init_from": str(warm_dir)})
    trained = train_once(c, run_dir)
    t_eval = time.perf_counter()
    evaluated = evaluate_once(run_dir, root / "eval" / s.name, ["agent"], num_examples)
    timing = {"eval_seconds": time.perf_counter() - t_eval, **trained}
    if trained["reused"]:  # the times of the invocation that did the work
      timing.update({k: v for k, v in previous.get("runs", {}).get(s.name, {}).items() if k.endswith("_seconds")})
    results["runs"][s.name] = {**timing, "algorithm": s.algorithm,
                               "overrides": dict(s.overrides), "start_sha256": step0_sha256(run_dir),
                               "metrics": row_metrics(evaluated["agent"])}
  results["wall_seconds"] = time.perf_counter() - t0
  table3, table4 = tables(results, specs)
  (root / "table3.md").write_text(table3)
  if table4:
    (root / "table4.md").write_text(table4)
  (root / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
  plot_em_curves(results, root, specs)
  return results


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  flag_config = _CONFIG.value
  try:
    run_tables(_WORKDIR.value, preset=flag_config.preset, overrides=user_overrides(sys.argv[1:], flag_config),
               run_names=_RUNS.value, num_examples=_NUM_EXAMPLES.value)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print((workdir_lib.workdir_path(_WORKDIR.value) / "table3.md").read_text())


if __name__ == "__main__":
  app.run(main)
