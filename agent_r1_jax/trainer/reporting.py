"""What a run shows a person: progress bars, evaluation tables, the summary, sample trajectories, curves."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from etils import epath

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.trainer.metrics import read_metrics
from agent_r1_jax.warmup.sft import COPY_DRILL

_TABLE_METRICS = ("em", "f1", "format", "score", "turns", "tool_calls")


def progress_bar(total: int, initial: int, enabled: bool):
  """A tqdm bar over RL steps (a no-op object when disabled)."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  return tqdm(total=total, initial=initial, desc="rl", disable=not enabled, dynamic_ncols=True)


def update_progress(bar, row: Mapping[str, Any]) -> None:
  shown = {k: row[k] for k in ("reward", "em", "rollout/turns_mean") if isinstance(row.get(k), (int, float))}
  bar.set_postfix({k.split("/")[-1]: f"{v:.3f}" for k, v in shown.items()}, refresh=False)
  bar.update(1)


class _SftLogger:
  """Progress of the supervised warm-up (tqdm bar showing the loss)."""

  def __init__(self, total: int, enabled: bool, initial: int = 0):
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    self._bar = tqdm(total=total, initial=initial, desc="sft", disable=not enabled, dynamic_ncols=True)
    self.last_loss = float("nan")

  def __call__(self, step: int, metrics: Mapping[str, Any]) -> None:
    if step % 10 == 0:
      self.last_loss = float(metrics["sft/loss"])
      turns = int(metrics.get("sft/turns", 0))
      shown = {COPY_DRILL: "copy", 0: "all"}.get(turns, turns)
      self._bar.set_postfix(turns=shown, loss=f"{self.last_loss:.4f}", refresh=False)
    self._bar.update(1)

  def close(self) -> None:
    self._bar.close()


def sft_logger(total: int, enabled: bool, initial: int = 0) -> _SftLogger:
  """A tqdm bar over the warm-up's `total` planned steps, from `initial` (a resumed warm-up's)."""
  return _SftLogger(total, enabled, initial)


def eval_table(title: str, summaries: Mapping[str, Mapping[str, float]]) -> str:
  """A markdown table: one row per data source, the average row last."""
  header = "| source | " + " | ".join(_TABLE_METRICS) + " |"
  lines = [f"### {title}", "", header, "|" + "---|" * (len(_TABLE_METRICS) + 1)]
  for source, s in summaries.items():
    lines.append(f"| {source} | " + " | ".join(f"{s.get(k, float('nan')):.4f}" for k in _TABLE_METRICS) + " |")
  if len(summaries) > 1:
    avg = {k: sum(s.get(k, 0.0) for s in summaries.values()) / len(summaries) for k in _TABLE_METRICS}
    lines.append("| average | " + " | ".join(f"{avg[k]:.4f}" for k in _TABLE_METRICS) + " |")
  return "\n".join(lines)


def print_eval(title: str, summaries: Mapping[str, Mapping[str, float]]) -> None:
  print(eval_table(title, summaries), flush=True)


def summary_table(summary: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
  """Held-out metrics before RL (after warm-up) and after RL, with the change, per data source."""
  before, after = summary.get("before_rl", {}), summary.get("after_rl", {})
  lines = ["### Held-out evaluation (greedy)", "",
           "| source | metric | before RL | after RL | change |", "|---|---|---|---|---|"]
  for source, s in after.items():
    b = before.get(source, {})
    for k in ("em", "f1", "format", "score", "tool_calls"):
      if k in s:
        old = b.get(k, float("nan"))
        lines.append(f"| {source} | {k} | {old:.4f} | {s[k]:.4f} | {s[k] - old:+.4f} |")
  return "\n".join(lines)


def write_samples(path: str | os.PathLike, records: Sequence[Any]) -> None:
  """One JSON object per scored trajectory (prompt, response, scores), for inspection (a local or bucket path)."""
  with workdir_lib.workdir_path(path).open("w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(dataclasses.asdict(r), ensure_ascii=False) + "\n")


def plot_curves(workdir: str | os.PathLike) -> epath.Path | None:
  """`curves.png`: training reward, EM and format score per step, each evaluation source's EM, and tool calls per
  episode."""
  rows = read_metrics(workdir)
  if not rows:
    return None
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
  steps = [r["step"] for r in rows]
  for key, label in (("reward", "train reward"), ("em", "train EM"), ("format", "train format score")):
    axes[0].plot(steps, [r.get(key) for r in rows], label=label)
  axes[0].set_xlabel("RL step")
  axes[0].legend()
  axes[0].set_title("training rollouts")

  def plot_eval(ax, metric: str) -> list[str]:
    keys = sorted({k for r in rows for k in r if k.startswith("eval/") and k.endswith(f"/{metric}")})
    for key in keys:
      points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
      source = key[len("eval/"):-len(metric) - 1]
      ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{source} validation (greedy)")
    return keys

  plotted = plot_eval(axes[1], "em")
  summary_path = workdir_lib.workdir_path(workdir) / "summary.json"
  if summary_path.exists():  # the held-out evaluations before RL (step 0) and after the last step
    summary = json.loads(summary_path.read_text())
    for source in sorted(summary.get("after_rl", {})):
      before, after = summary.get("before_rl", {}).get(source, {}), summary["after_rl"][source]
      if "em" in before and "em" in after:
        axes[1].plot([0, steps[-1]], [before["em"], after["em"]], marker="s", linestyle="--",
                     label=f"{source} held-out test (greedy)")
        plotted.append(source)
  if plotted:
    axes[1].legend()
  axes[1].set_ylim(0.0, 1.02)
  axes[1].set_xlabel("RL step")
  axes[1].set_ylabel("greedy EM")
  axes[1].set_title("evaluation")
  axes[2].plot(steps, [r.get("rollout/tool_calls_mean") for r in rows], label="training rollouts")
  plot_eval(axes[2], "tool_calls")
  axes[2].set_xlabel("RL step")
  axes[2].set_ylabel("tool calls / episode")
  axes[2].set_title("tool use")
  axes[2].legend()
  fig.tight_layout()
  out = workdir_lib.workdir_path(workdir) / "curves.png"
  with out.open("wb") as f:  # a file object: matplotlib cannot name a bucket path
    fig.savefig(f, format="png", dpi=110)
  plt.close(fig)
  return out
