"""The paper's Tables 3 and 4 in miniature: warm-ups, then every algorithm and mask ablation trained from them,
over seeds, with intervals.

    python -m agent_r1_jax.experiments.paper_tables --workdir=DIR [--config=configs/grpo_multihopqa.py:tiny-mixed]
        [--seeds=3] [--warmup_seeds=1] [--runs=grpo,ppo] [--config.trainer.total_steps=10]
    python -m agent_r1_jax.experiments.paper_tables --workdir=DIR --retabulate

The preset of `--config` (default the tiny offline one) is warmed up `--warmup_seeds` times
(`DIR/warmup/seed<m>`, `--config.seed` + m, stopped after the step-0 checkpoint), then every run of `RUNS` trains
`--seeds` times from each warm-up's step-0 policy (`--config.init_from`; RL seed `--config.seed` + s), in
`DIR/runs/<name>/warmup<m>_seed<s>`, with its algorithm's config and the same `--config.*` overrides. Budgets are
equal in episodes: every run samples the preset's rows per step (tiny: 40, as 8 prompts x 5 samples for GRPO,
RLOO and REINFORCE++-baseline, 40 prompts x 1 for PPO and REINFORCE++) for the same number of steps. Every final
policy, and each warm-up policy three ways (in the tool loop: Base Tool Call; Naive RAG; No Retrieval), is
evaluated on the same held-out questions with `agent_r1_jax.evaluate` (greedy). Writes, in DIR:

  table3.md / table4.md   the paper's layouts: EM per data set and per question type (mean over seed runs),
                          "EM avg." (the unweighted mean over `data.average_over`'s sets, default all) with its
                          95% interval and its method, the paired difference to GRPO (Table 3) or to the
                          unablated run of the same setting (Table 4: PPO at lambda = 1 and at 0.95, GRPO) with
                          its interval, the paper's average
                          (Qwen2.5-3B-Instruct), and over the same sets substring accuracy, F1, tool calls per
                          episode; the number of seed runs; a footnote naming the interval methods
  results.json            every row's statistics (`experiments/table_layout.row_stats`) and every seed run's own
                          figures (its warm-up, RL seed and "EM avg." among them), training and evaluation
                          seconds (kept from the invocation that did the work), start-parameter hash and config
                          overrides
  em_curves.png           validation EM every 3 RL steps, mean over seeds with the seeds' min-max band, beside
                          the warm-up's held-out EM; every row's held-out EM with its interval

Intervals (`experiments/intervals.table_interval`): differences are paired on warm-up, RL seed and question (every
row trains RL seeds 0..S-1 from every warm-up, so a row against itself is exactly 0); the tables print the
t-interval over the warm-up means with 2 to `intervals.MIN_BOOTSTRAP_WARMUPS` - 1 warm-ups, the nested bootstrap
over warm-ups, seeds and questions from there on, and with one warm-up the t-interval over its seed runs, given
that warm-up (n/a with one run). `--retabulate` rewrites the tables and results.json's intervals of DIR from the
per-run "EM avg." figures its results.json holds (no run, evaluation or record is read; em_curves.png, whose
curves need the runs, is left as it is): results.json of older code regenerated with these intervals. A finished seed run (its `summary.json`) or evaluation (its `results.json`) is
reused, so an interrupted table resumes where it stopped, and raising `--seeds` trains only the new seeds. DIR may
be a Cloud Storage directory (`gs://bucket/tables`), like any run's workdir.

Multi-host: launch the same command on every worker (`AGENT_R1_DISTRIBUTED=on`, a workdir every worker reaches,
e.g. gs://, and a mesh over all of them, `--config.mesh.fsdp=-1`); every process trains and evaluates together,
takes process 0's reading of what is finished and of every evaluation's figures, and process 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

if __name__ == "__main__":  # the CLI: join a multi-host run before the imports below start a JAX backend (bm25s)
  from agent_r1_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.maybe_initialize()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np
from absl import app, flags
from etils import epath
from ml_collections import config_dict, config_flags
from tqdm import tqdm

from agent_r1_jax import paths, trainer
from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.evaluation import datasets as eval_datasets
from agent_r1_jax.evaluation.multihost import from_process_0
from agent_r1_jax.experiments import intervals, table_layout
from agent_r1_jax.experiments.seed_runs import evaluate_once, seed_eval, step0_sha256, train_once

_CONFIG = config_flags.DEFINE_config_file(
    "config", str(paths.REPO_ROOT / "configs" / "grpo_multihopqa.py"),
    "Config whose preset and `--config.*` overrides every run shares (the algorithm comes from each run).",
    lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the warm-up, the runs, their evaluations and tables.")
_RUNS = flags.DEFINE_list("runs", [], "Runs to train and tabulate (default: all of RUNS).")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 200, "Held-out examples per data set (0 = all).")
_SEEDS = flags.DEFINE_integer("seeds", 1, "RL seed runs per row and warm-up.")
_WARMUP_SEEDS = flags.DEFINE_integer("warmup_seeds", 1, "Warm-ups (each a different seed) every row starts from.")
_RETABULATE = flags.DEFINE_bool("retabulate", False, "Only rewrite DIR's tables and intervals from its results.json.")


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One row: `algorithm`'s config with `overrides`, in `table` (3 or 4) beside the paper's average EM (None: the
  paper has no such row). `group` names the unablated run a Table-4 row is compared with (itself for that run)."""
  name: str
  label: str
  algorithm: str
  table: int
  paper_em: float | None
  overrides: tuple[tuple[str, Any], ...] = ()
  group: str = ""


NO_ADVANTAGE_MASK = (("algorithm.advantage_mask", "response"),)
NO_LOSS_MASK = (("algorithm.loss_mask", "response"),)
NO_MASKS = NO_ADVANTAGE_MASK + NO_LOSS_MASK
# At gamma * lambda < 1 GAE's recursion decays across the observation tokens it would otherwise step over, so the
# advantage mask changes PPO's advantages; at gamma = lambda = 1 it provably does not (README, mask ablations).
LAMBDA_095 = (("algorithm.lam", 0.95),)
RUNS: tuple[RunSpec, ...] = (
    RunSpec("grpo", "GRPO", "grpo", 3, 0.3877, group="grpo"),
    RunSpec("ppo", "PPO", "ppo", 3, 0.3719, group="ppo"),
    RunSpec("rloo", "RLOO", "rloo", 3, 0.3716),
    RunSpec("reinforce_pp_baseline", "REINFORCE++-baseline", "reinforce_pp_baseline", 3, 0.3619),
    RunSpec("reinforce_pp", "REINFORCE++", "reinforce_pp", 3, 0.3300),
    RunSpec("ppo_no_advantage_mask", "PPO w/o advantage mask", "ppo", 4, 0.3136, NO_ADVANTAGE_MASK, "ppo"),
    RunSpec("ppo_no_masks", "PPO w/o advantage and loss masks", "ppo", 4, 0.3022, NO_MASKS, "ppo"),
    RunSpec("ppo_lambda095", "PPO, lambda = 0.95", "ppo", 4, None, LAMBDA_095, "ppo_lambda095"),
    RunSpec("ppo_no_advantage_mask_lambda095", "PPO w/o advantage mask, lambda = 0.95", "ppo", 4, None,
            NO_ADVANTAGE_MASK + LAMBDA_095, "ppo_lambda095"),
    RunSpec("ppo_no_masks_lambda095", "PPO w/o advantage and loss masks, lambda = 0.95", "ppo", 4, None,
            NO_MASKS + LAMBDA_095, "ppo_lambda095"),
    RunSpec("grpo_no_advantage_mask", "GRPO w/o advantage mask", "grpo", 4, None, NO_ADVANTAGE_MASK, "grpo"),
    RunSpec("grpo_no_loss_mask", "GRPO w/o loss mask", "grpo", 4, 0.3722, NO_LOSS_MASK, "grpo"),
)
TABLE4_GROUPS = ("ppo", "ppo_lambda095", "grpo")
# Every run validates every 3 RL steps, for the curves (evaluation draws its own key: training is unchanged).
# Validating after every step was ~40% of a tiny-mixed GRPO run (~120 of 298 s: 64 greedy five-turn episodes a
# step; docs/experiments.md), and 36 seed runs of the tables are most of their cost.
CURVE_OVERRIDES = {"trainer.eval_every": 3}
# The warm-up policy's rows: (name, label, evaluation method, paper's average EM).
BASELINES = (("base_tool_call", "Base Tool Call", "agent", 0.0847), ("naive_rag", "Naive RAG", "naive_rag", 0.1328),
             ("no_retrieval", "No Retrieval", "no_retrieval", None))
INTERVALS = ("95%, named in each cell (experiments/intervals.table_interval): with W warm-ups of S seed runs, the "
             "t-interval over the S seeds given the warm-up at W = 1 (n/a with one run), the t-interval over "
             f"warm-up means (W - 1 degrees of freedom) at 2 <= W < {intervals.MIN_BOOTSTRAP_WARMUPS}, the nested "
             f"percentile bootstrap over warm-ups, seeds and questions ({intervals.RESAMPLES} resamples) from there "
             "on; differences paired on warm-up, RL seed and question")


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


def seed_dirs(warmup_seeds: int, seeds: int) -> list[tuple[int, int, str]]:
  """`(warm-up m, RL seed s, directory name)` of every seed run of a row."""
  return [(m, s, f"warmup{m}_seed{s}") for m in range(warmup_seeds) for s in range(seeds)]


def tables(results: Mapping[str, Any], specs: Sequence[RunSpec]) -> tuple[str, str]:
  """(table3.md, table4.md) from `results` ("baselines" and "runs", each holding `row_stats` as "metrics")."""
  table3 = [(label, results["baselines"][name], paper) for name, label, _, paper in BASELINES]
  table3 += [(s.label, results["runs"][s.name]["metrics"], s.paper_em) for s in specs if s.table == 3]
  table4 = []
  for group in TABLE4_GROUPS:  # each unablated run, then its ablations
    table4 += [(s.label, results["runs"][s.name]["table4"], s.paper_em) for s in specs
               if s.group == group and s.name == group]
    table4 += [(s.label, results["runs"][s.name]["table4"], s.paper_em) for s in specs
               if s.group == group and s.name != group]
  return (table_layout.markdown_table(table3, "GRPO"),
          table_layout.markdown_table(table4, "unablated") if table4 else "")


def write_tables(root: epath.Path, results: Mapping[str, Any], specs: Sequence[RunSpec]) -> None:
  """table3.md, table4.md (where a Table-4 row runs) and results.json in `root`."""
  table3, table4 = tables(results, specs)
  (root / "table3.md").write_text(table3)
  if table4:
    (root / "table4.md").write_text(table4)
  (root / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def _run_averages(records: Sequence[Mapping[str, Any]]) -> np.ndarray:
  """`[W, S, 1]` "EM avg." of a row's seed runs (results.json's {"warmup", "seed", "avg_em"} records), by warm-up
  and RL seed index."""
  by_warmup: dict[int, list[tuple[int, float]]] = {}
  for r in records:
    by_warmup.setdefault(r["warmup"], []).append((r["seed"], r["avg_em"]))
  return np.array([[em for _, em in sorted(by_warmup[w])] for w in sorted(by_warmup)], np.float64)[:, :, None]


def retabulate(workdir: str | os.PathLike) -> dict[str, Any]:
  """Rewrites the intervals of DIR's results.json and its tables from the per-run "EM avg." figures it holds
  (module docstring); returns the new results.

  Below `MIN_BOOTSTRAP_WARMUPS` warm-ups the printed interval of a row or a difference is a function of its runs'
  "EM avg." by warm-up and seed (t over warm-up means, or over one warm-up's seeds), so those figures suffice.

  Raises:
    ValueError: the tables hold `MIN_BOOTSTRAP_WARMUPS` warm-ups or more (the bootstrap needs per-question records:
      rerun the recorded command in its workdir, every run reused).
  """
  root = workdir_lib.workdir_path(workdir)
  results = json.loads((root / "results.json").read_text())
  if results.get("warmup_seeds", 1) >= intervals.MIN_BOOTSTRAP_WARMUPS:
    raise ValueError(f"{results['warmup_seeds']} warm-ups: their bootstrap needs the per-question records; rerun "
                     "the tables in their workdir instead")
  runs = {name: _run_averages(run["seeds"]) for name, run in results["runs"].items()}

  def restate(row: dict[str, Any], x: np.ndarray, reference: np.ndarray | None) -> None:
    row.pop("t_interval", None)
    row["interval"] = intervals.table_interval(x, table_layout.CONFIDENCE).as_dict()
    row.pop("paired", None)
    if reference is not None:
      row["paired"] = intervals.table_interval(intervals.paired_scores(x, reference),
                                               table_layout.CONFIDENCE).as_dict()

  for row in results["baselines"].values():  # one evaluation per warm-up, in warm-up order
    restate(row, np.array(row["per_seed_avg_em"], np.float64)[:, None, None], runs.get("grpo"))
  for name, run in results["runs"].items():
    restate(run["metrics"], runs[name], runs.get("grpo"))
    if run["table4"] is not None:
      restate(run["table4"], runs[name], runs.get(run["group"]))
  results["intervals"] = INTERVALS
  results["retabulated"] = "intervals and tables rewritten from this file's per-run EM avg. (--retabulate)"
  write_tables(root, results, [s for s in RUNS if s.name in results["runs"]])
  return results


def _curve(run_dir: epath.Path, over: Sequence[str] = ()) -> list[tuple[int, float]]:
  """`(RL step, validation EM averaged over the validated sets, those of `over` where given)` of a run, at the
  steps it validated."""
  out = []
  for row in trainer.read_metrics(run_dir):
    em = [v for k, v in row.items() if k.startswith("eval/") and k.endswith("/em")
          and (not over or k.split("/")[1] in over)]
    if em:
      out.append((row["step"], sum(em) / len(em)))
  return out


def run_tables(workdir: str | os.PathLike, *, preset: str, overrides: Mapping[str, Any],
               run_names: Sequence[str] = (), num_examples: int = 200, seeds: int = 1, warmup_seeds: int = 1,
               progress: bool = True) -> dict[str, Any]:
  """Warm-ups, seed runs, evaluations and tables (see the module docstring); returns what results.json holds."""
  unknown = sorted(set(run_names) - {s.name for s in RUNS})
  if unknown:
    raise ValueError(f"unknown run(s) {unknown} in --runs; choose from {[s.name for s in RUNS]}")
  if seeds < 1 or warmup_seeds < 1:
    raise ValueError(f"--seeds and --warmup_seeds must be >= 1, got {seeds} and {warmup_seeds}")
  specs = [s for s in RUNS if not run_names or s.name in run_names]
  root = workdir_lib.workdir_path(workdir)
  previous = from_process_0(
      lambda: json.loads((root / "results.json").read_text()) if (root / "results.json").is_file() else {})
  shared = run_config("grpo", preset, overrides)
  base_seed, over = int(shared.seed), tuple(shared.data.average_over)
  evaluated = eval_datasets.available_datasets(shared)  # [] where the release files are prepared on first use
  if evaluated:
    table_layout.averaged_sets(evaluated, over)  # refuses a set no evaluation will hold, before any training
  t0 = time.perf_counter()
  warmups, baseline_evals = [], {name: [] for name, *_ in BASELINES}
  for m in range(warmup_seeds):
    warm_dir = root / "warmup" / f"seed{m}"
    warm = train_once(run_config("grpo", preset, {**overrides, "seed": base_seed + m, "trainer.total_steps": 0}),
                      warm_dir)
    if warm["reused"]:
      old = [w for w in previous.get("warmups", []) if w.get("warmup") == m]
      warm.update({k: v for k, v in (old[0] if old else {}).items() if k.endswith("_seconds")})
    evaluation = evaluate_once(warm_dir, root / "eval" / "warmup" / f"seed{m}",
                               [method for _, _, method, _ in BASELINES], num_examples)
    for name, _, method, _ in BASELINES:
      baseline_evals[name].append(seed_eval(evaluation, method, m))
    warmups.append({"warmup": m, **warm, "sha256": step0_sha256(warm_dir)})

  run_evals: dict[str, list[table_layout.SeedEval]] = {}
  seed_records: dict[str, list[dict[str, Any]]] = {}
  todo = [(s, m, k, name) for s in specs for m, k, name in seed_dirs(warmup_seeds, seeds)]
  for spec, m, k, name in tqdm(todo, desc="seed runs", disable=not progress or jax.process_index() != 0):
    run_dir = root / "runs" / spec.name / name
    c = run_config(spec.algorithm, preset, {**CURVE_OVERRIDES, **overrides, **dict(spec.overrides),
                                            "seed": base_seed + k, "init_from": str(root / "warmup" / f"seed{m}")})
    trained = train_once(c, run_dir)
    t_eval = time.perf_counter()
    evaluation = seed_eval(evaluate_once(run_dir, root / "eval" / spec.name / name, ["agent"], num_examples),
                           "agent", m, k)
    timing = {"eval_seconds": time.perf_counter() - t_eval, **trained}
    if trained["reused"]:  # the times of the invocation that did the work
      old = [r for r in previous.get("runs", {}).get(spec.name, {}).get("seeds", []) if r.get("dir") == name]
      timing.update({key: v for key, v in (old[0] if old else {}).items() if key.endswith("_seconds")})
    run_evals.setdefault(spec.name, []).append(evaluation)
    start = step0_sha256(run_dir)
    seed_records.setdefault(spec.name, []).append({
        "dir": name, "warmup": m, "seed": k, **timing, "start_sha256": start,
        "starts_from_its_warmup": start == warmups[m]["sha256"],
        "avg_em": table_layout.average_em(evaluation, over), "summaries": evaluation.summaries})

  reference = run_evals.get("grpo")
  results: dict[str, Any] = {
      "preset": preset, "overrides": {k: repr(v) for k, v in overrides.items()}, "num_examples": num_examples,
      "seeds": seeds, "warmup_seeds": warmup_seeds,
      "average_over": table_layout.averaged_sets(list(baseline_evals["base_tool_call"][0].summaries), over),
      "intervals": INTERVALS,
      "warmups": warmups,
      "baselines": {name: table_layout.row_stats(evals, reference, over)
                    for name, evals in baseline_evals.items()},
      "runs": {}}
  for spec in specs:
    head = run_evals.get(spec.group) if spec.group else None
    results["runs"][spec.name] = {
        "label": spec.label, "algorithm": spec.algorithm, "overrides": dict(spec.overrides), "group": spec.group,
        "metrics": table_layout.row_stats(run_evals[spec.name], reference, over),
        "table4": table_layout.row_stats(run_evals[spec.name], head, over) if spec.group else None,
        "seeds": seed_records[spec.name]}
  results["wall_seconds"] = time.perf_counter() - t0
  if jax.process_index() != 0:
    return results
  write_tables(root, results, specs)
  curves = [(s.label, s.table == 3, [_curve(root / "runs" / s.name / name, over) for _, _, name in
                                     seed_dirs(warmup_seeds, seeds)]) for s in specs]
  bars = [(label, results["baselines"][name]["avg_em"], results["baselines"][name]["interval"])
          for name, label, _, _ in BASELINES]
  bars += [(s.label, results["runs"][s.name]["metrics"]["avg_em"], results["runs"][s.name]["metrics"]["interval"])
           for s in specs]
  table_layout.plot_em_curves(root / "em_curves.png", curves, results["baselines"]["base_tool_call"]["avg_em"], bars)
  return results


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  flag_config = _CONFIG.value
  try:
    if _RETABULATE.value:
      if jax.process_index() == 0:  # file work alone: one writer
        retabulate(_WORKDIR.value)
    else:
      run_tables(_WORKDIR.value, preset=flag_config.preset, overrides=user_overrides(sys.argv[1:], flag_config),
                 run_names=_RUNS.value, num_examples=_NUM_EXAMPLES.value, seeds=_SEEDS.value,
                 warmup_seeds=_WARMUP_SEEDS.value)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if jax.process_index() == 0:
    print((workdir_lib.workdir_path(_WORKDIR.value) / "table3.md").read_text())


if __name__ == "__main__":
  app.run(main)
