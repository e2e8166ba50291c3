"""What the paper tables show for one row: EM over seeds with its interval, per data set and per question type,
the paired difference to a reference row, and the markdown and curves that lay the rows out.

A row's evaluations are one per seed run (`SeedEval`: the run's warm-up, its per-data-set summaries and its
per-question EM). All runs of a table are evaluated on the same held-out questions (greedy, the first
`num_examples` of each data set), so the per-question EM of a row is a `[warm-ups, seeds, questions]` array, the
input of `experiments.intervals` (a baseline row has one evaluation per warm-up: `[warm-ups, 1, questions]`).

"EM avg." has one definition, the paper's Avg. (the mean over its three multi-hop sets): the unweighted mean over
the averaged sets (`over`, the config's `data.average_over`; default every evaluated set) of each set's EM, and of
that the mean over the row's seed runs. The column, each seed run's `avg_em`, the intervals (which weigh each
question 1 / (sets x its set's questions)), the paired differences and the bar chart all use it; every set keeps
its own EM column. A difference pairs the two rows on warm-up, RL seed index and question, so a row against
itself is exactly 0; each interval names its method (`intervals.table_interval`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from agent_r1_jax.data.synthetic.templates import TYPE_LABELS
from agent_r1_jax.evaluation.report import DATASET_LABELS
from agent_r1_jax.experiments import intervals

CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class SeedEval:
  """One seed run's evaluation with one method: `summaries` {data set: summary}, `scores` {(data set, example
  id): EM}, `warmup` the index of the warm-up the run started from, `seed` its RL seed index (a baseline's one
  evaluation per warm-up: 0)."""
  summaries: Mapping[str, Mapping[str, float]]
  scores: Mapping[tuple[str, str], float]
  warmup: int = 0
  seed: int = 0


def averaged_sets(evaluated: Sequence[str], over: Sequence[str] = ()) -> list[str]:
  """The sets of `evaluated` (data set names, in order) that the average covers: those `over` names, or all.

  Raises:
    ValueError: `over` names a set that is not evaluated.
  """
  if not over:
    return list(evaluated)
  missing = sorted(set(over) - set(evaluated))
  if missing:
    raise ValueError(f"data.average_over names {missing}, which the tables' evaluations do not hold "
                     f"(they hold {sorted(evaluated)}); set data.average_over to some of these, or ()")
  return [d for d in evaluated if d in over]


def run_seeds(evals: Sequence[SeedEval]) -> dict[int, list[int]]:
  """{warm-up: its runs' RL seed indices, sorted}."""
  out: dict[int, list[int]] = {}
  for e in evals:
    out.setdefault(e.warmup, []).append(e.seed)
  return {w: sorted(seeds) for w, seeds in sorted(out.items())}


def score_matrix(evals: Sequence[SeedEval], keys: Sequence[tuple[str, str]] | None = None) -> np.ndarray:
  """`[warm-ups, seeds, questions]` EM of `evals` over `keys` (default: the first evaluation's questions, sorted),
  warm-ups in index order, each warm-up's runs in RL seed order, so seed axis index i is the same RL seed in
  every warm-up and, for rows with the same seeds, in every row.

  Raises:
    ValueError: the runs were evaluated on different questions, or the warm-ups hold different RL seeds.
  """
  keys = sorted(evals[0].scores) if keys is None else keys
  sets = {d for d, _ in keys}
  for e in evals:
    if {k for k in e.scores if k[0] in sets} != set(keys):
      raise ValueError("the runs of a table were evaluated on different questions; use one --num_examples")
  seeds = run_seeds(evals)
  first = next(iter(seeds.values()))
  if any(s != first for s in seeds.values()) or len(set(first)) != len(first):
    raise ValueError(f"every warm-up needs the same RL seeds, each run once, got {seeds}")
  runs = {(e.warmup, e.seed): e for e in evals}
  return np.array([[[runs[w, s].scores[k] for k in keys] for s in seed_ids] for w, seed_ids in seeds.items()],
                  np.float64)


def average_em(evaluation: SeedEval, over: Sequence[str] = ()) -> float:
  """One seed run's "EM avg.": `sum_g em_g / G` over its G averaged data sets (`averaged_sets`), unweighted by
  their sizes (module docstring)."""
  sets = averaged_sets(list(evaluation.summaries), over)
  return sum(evaluation.summaries[d]["em"] for d in sets) / len(sets)


def row_stats(evals: Sequence[SeedEval], reference: Sequence[SeedEval] | None = None,
              over: Sequence[str] = ()) -> dict[str, Any]:
  """Means over seeds (EM per data set and per question type; the average over the averaged sets `over` of EM,
  substring accuracy, F1 and tool calls), each seed's average EM, the interval of that average the tables print,
  and its paired difference to `reference` (another row's evaluations on the same questions) where given."""
  def mean(key: str, summaries: Mapping[str, Mapping[str, float]]) -> float:
    return sum(s[key] for s in summaries.values()) / len(summaries)

  datasets = list(evals[0].summaries)
  kinds = [k for k in TYPE_LABELS if any(f"em_{k}" in s for e in evals for s in e.summaries.values())]
  sets = averaged_sets(datasets, over)
  per_seed = [average_em(e, over) for e in evals]
  keys = sorted(k for k in evals[0].scores if k[0] in sets)
  question_sets = [d for d, _ in keys]
  out: dict[str, Any] = {
      "em": {d: float(np.mean([e.summaries[d]["em"] for e in evals])) for d in datasets},
      "em_type": {k: float(np.mean([np.mean([s[f"em_{k}"] for s in e.summaries.values() if f"em_{k}" in s])
                                    for e in evals])) for k in kinds},
      "avg_em": float(np.mean(per_seed)), "per_seed_avg_em": per_seed,
      **{k: float(np.mean([mean(k, {d: e.summaries[d] for d in sets}) for e in evals]))
         for k in ("substring_acc", "f1", "tool_calls")},
  }
  x = score_matrix(evals, keys)
  out["interval"] = intervals.table_interval(x, CONFIDENCE, question_sets).as_dict()
  if reference is not None:
    ours, theirs = run_seeds(evals), run_seeds(reference)
    if ours != theirs and all(len(s) > 1 for s in [*ours.values(), *theirs.values()]):
      raise ValueError(f"a paired difference needs the same RL seeds from the same warm-ups: {ours} vs {theirs}")
    paired = intervals.paired_scores(x, score_matrix(reference, keys))
    out["paired"] = intervals.table_interval(paired, CONFIDENCE, question_sets).as_dict()
  return out


def _interval(d: Mapping[str, Any] | None, signed: bool = False) -> str:
  return "-" if d is None else intervals.format_interval(intervals.Interval(**d), signed=signed)


FOOTNOTE = (
    "EM avg.: the unweighted mean over the averaged data sets of each set's EM (the paper's Avg.), mean over the "
    "seed runs. Differences pair the two rows' runs on warm-up, RL seed and question (a row against itself is "
    "exactly 0). 95% intervals, each named in its cell: \"t, W warm-ups\": the t-interval over the W warm-up means "
    "(W - 1 degrees of freedom; the held-out questions fixed); \"bootstrap\": the nested percentile bootstrap over "
    f"warm-ups, seeds and questions, printed from {intervals.MIN_BOOTSTRAP_WARMUPS} warm-ups on (with fewer it "
    "undercovers the warm-up spread: ~64% at 2 warm-ups); \"t over S seeds, given 1 warm-up\": the t-interval over "
    "the S seed runs' means from the one warm-up: what another RL seed from this warm-up would give, not another "
    "warm-up (two warm-ups of one recipe have ended RL at 0.68 and 0.26); \"n/a\": one run bounds nothing "
    "(experiments/intervals.py).")


def markdown_table(rows: Sequence[tuple[str, Mapping[str, Any], float | None]], reference_label: str) -> str:
  """`rows` of (label, row_stats, paper's average EM) as one markdown table: EM per data set and per question
  type, "EM avg." with its 95% interval and method, the paired difference to `reference_label`'s row, the
  paper's average, substring accuracy, F1, tool calls and the number of seed runs; then `FOOTNOTE`."""
  datasets = list(rows[0][1]["em"])
  kinds = [k for k in TYPE_LABELS if any(k in r[1]["em_type"] for r in rows)]
  header = (["Method"] + [f"EM {DATASET_LABELS.get(d, d)}" for d in datasets] + [f"EM {TYPE_LABELS[k]}" for k in kinds]
            + ["EM avg. [95% CI] (method)", f"vs {reference_label} [95% CI] (method)", "paper EM avg. (Qwen2.5-3B)",
               "substring", "F1", "tool calls", "seeds"])
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for label, m, paper in rows:
    cells = ([f"{m['em'][d]:.4f}" for d in datasets] + [f"{m['em_type'][k]:.4f}" if k in m["em_type"] else "-"
                                                        for k in kinds]
             + [_interval(m["interval"]), _interval(m.get("paired"), signed=True),
                "-" if paper is None else f"{paper:.4f}", f"{m['substring_acc']:.4f}", f"{m['f1']:.4f}",
                f"{m['tool_calls']:.2f}", str(len(m["per_seed_avg_em"]))])
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n\n" + FOOTNOTE + "\n"


def plot_em_curves(path, curves: Sequence[tuple[str, bool, Sequence[Sequence[tuple[int, float]]]]],
                   warm_em: float, bars: Sequence[tuple[str, float, Mapping[str, float]]]) -> None:
  """`em_curves.png` at `path` (a local or bucket path): for each `(label, solid, per-seed [(step, EM)])` the mean
  validation EM over seeds per RL step with the min-max band of the seeds, beside the warm-up policy's EM; and
  each row's held-out "EM avg." as a bar with its 95% interval, its method in the label and no error bar where it
  is n/a (`bars`: (label, EM avg., `Interval.as_dict`))."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, (ax, bar_ax) = plt.subplots(1, 2, figsize=(15, 4.6))
  for label, solid, seeds in curves:
    steps = sorted(set.intersection(*[{step for step, _ in s} for s in seeds])) if seeds else []
    if not steps:
      continue
    by_step = np.array([[dict(s)[step] for step in steps] for s in seeds])  # [seeds, steps]
    line, = ax.plot(steps, by_step.mean(axis=0), marker=".", linestyle="-" if solid else "--",
                    label=f"{label} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
    if len(seeds) > 1:
      ax.fill_between(steps, by_step.min(axis=0), by_step.max(axis=0), color=line.get_color(), alpha=0.15)
  ax.axhline(warm_em, color="gray", linestyle=":", label="warm-up policy (held-out EM)")
  ax.set(xlabel="RL step", ylabel="validation EM (greedy)", ylim=(0.0, 1.02), xlim=(0, None),
         title="validation EM: mean over seeds, band = min-max of the seeds")
  ax.legend(fontsize=7)
  labels = [f"{b[0]} ({b[2]['method']})" for b in bars][::-1]
  values = np.array([b[1] for b in bars][::-1])
  errors = np.array([[0.0, 0.0] if b[2]["low"] is None else [b[1] - b[2]["low"], b[2]["high"] - b[1]]
                     for b in bars][::-1]).T
  bar_ax.barh(labels, values, xerr=errors, capsize=3)
  bar_ax.set(xlabel="held-out EM avg. (greedy) with its printed 95% interval (n/a: none)", xlim=(0.0, 1.0),
             title="final policies")
  fig.tight_layout()
  with path.open("wb") as f:  # a file object: matplotlib cannot name a bucket path
    fig.savefig(f, format="png", dpi=110)
  plt.close(fig)
