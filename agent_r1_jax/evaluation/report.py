"""What an evaluation writes: the Table 3 markdown, the metrics JSON and the sample-trajectory HTML page.

  table.md           EM per dataset and their unweighted average, one row per method (the paper's Table 3
                     layout), then every metric per method x dataset.
  results.json       {"policy", "base_policy", "methods": {method: {dataset: summary}}, "average_em", "settings"}
  trajectories.html  sample episodes: question, gold answers, prompt, then the response cut at the rollout's
                     token-level action mask into `<div class="action">` (sampled by the policy) and
                     `<div class="observation" data-source="environment">` (tool output written by the env,
                     never trained on), and the scores.
  records.jsonl      every scored episode (prompt, response, segments, scores).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from typing import Any, Mapping, Sequence

from etils import epath

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.data.synthetic.templates import TYPE_LABELS
from agent_r1_jax.evaluation.methods import METHODS
from agent_r1_jax.rollout import EpisodeStop
from agent_r1_jax.rollout.evaluation import ACTION, OBSERVATION, EpisodeRecord

DETAIL_METRICS = ("em", "f1", "substring_acc", "format", "score", "turns", "tool_calls", "tool_error_rate",
                  "num_examples")
DATASET_LABELS = {"hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "musique": "MuSiQue",
                   "synthetic_multihop": "Synthetic", "synthetic_one_hop": "Synthetic one-hop"}

Summaries = Mapping[str, Mapping[str, Mapping[str, float]]]  # method -> dataset -> metric -> value


def average_em(per_dataset: Mapping[str, Mapping[str, float]]) -> float:
  """Unweighted mean of the datasets' EM (the paper's "Avg." column)."""
  values = [s["em"] for s in per_dataset.values()]
  return sum(values) / len(values) if values else float("nan")


def table3(summaries: Summaries) -> str:
  """Markdown: one row per method, EM per dataset and the average."""
  datasets = list(next(iter(summaries.values())).keys()) if summaries else []
  header = ["Method"] + [DATASET_LABELS.get(d, d) for d in datasets] + ["Avg."]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for method, per_dataset in summaries.items():
    label = METHODS[method].label if method in METHODS else method
    cells = [f"{per_dataset[d]['em']:.4f}" for d in datasets] + [f"{average_em(per_dataset):.4f}"]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def details_table(summaries: Summaries) -> str:
  """Markdown: every summary metric per method x dataset."""
  lines = ["| method | dataset | " + " | ".join(DETAIL_METRICS) + " |", "|" + "---|" * (len(DETAIL_METRICS) + 2)]
  for method, per_dataset in summaries.items():
    for dataset, s in per_dataset.items():
      cells = [f"{int(s[k])}" if k == "num_examples" else f"{s[k]:.4f}" for k in DETAIL_METRICS]
      lines.append(f"| {method} | {dataset} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def type_table(summaries: Summaries) -> str:
  """Markdown: EM per question type (`em_<type>` of the summaries; the mixed world's one-hop, bridge, 3-hop,
  4-hop and comparison), one row per method x dataset; "" where no summary has types."""
  kinds = [k for k in TYPE_LABELS if any(f"em_{k}" in s for per in summaries.values() for s in per.values())]
  if not kinds:
    return ""
  lines = ["| method | dataset | " + " | ".join(f"EM {TYPE_LABELS[k]}" for k in kinds) + " |",
           "|" + "---|" * (len(kinds) + 2)]
  for method, per_dataset in summaries.items():
    for dataset, s in per_dataset.items():
      cells = [f"{s[f'em_{k}']:.4f} ({int(s[f'num_{k}'])})" if f"em_{k}" in s else "-" for k in kinds]
      lines.append(f"| {method} | {dataset} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def markdown_report(summaries: Summaries, *, policy: str, base_policy: str | None) -> str:
  head = [f"## Evaluation of `{policy}` (greedy)", ""]
  if base_policy:
    head += [f"Base Tool Call uses `{base_policy}`.", ""]
  by_type = type_table(summaries)
  types = ["EM per question type (questions):", "", by_type, ""] if by_type else []
  return "\n".join(head + ["Exact match (EM):", "", table3(summaries), ""] + types
                   + ["All metrics:", "", details_table(summaries), ""])


def results_json(summaries: Summaries, *, policy: str, base_policy: str | None,
                 settings: Mapping[str, Any]) -> dict[str, Any]:
  return {"policy": policy, "base_policy": base_policy,
          "methods": {m: {d: dict(s) for d, s in per.items()} for m, per in summaries.items()},
          "average_em": {m: average_em(per) for m, per in summaries.items()}, "settings": dict(settings)}


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; }
article.episode { border: 1px solid #ccc; border-radius: 6px; padding: 0.8em; margin: 1em 0; }
div.action, div.observation { border-left: 5px solid; padding: 0.2em 0.6em; margin: 0.4em 0; }
div.action { border-color: #2b6cb0; background: #ebf4ff; }
div.observation { border-color: #b7791f; background: #fffbea; }
span.label { font-size: 0.8em; font-weight: bold; text-transform: uppercase; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0.3em 0; }
table.scores td { padding: 0 0.8em 0 0; }
"""


def _pre(text: str) -> str:
  return f"<pre>{html.escape(text)}</pre>"


def _episode_html(method: str, record: EpisodeRecord) -> str:
  parts = [f'<article class="episode" data-method="{html.escape(method)}" '
           f'data-dataset="{html.escape(record.data_source)}" data-example-id="{html.escape(record.example_id)}">',
           f"<h3>{html.escape(record.data_source)} · {html.escape(record.example_id)}</h3>",
           f'<p class="question"><b>Question:</b> {html.escape(record.question)}</p>',
           f'<p class="gold"><b>Gold:</b> {html.escape(" | ".join(record.answers))}</p>',
           f'<details class="prompt"><summary>prompt</summary>{_pre(record.prompt)}</details>']
  turn = 0
  for kind, text in record.segments:
    if kind == ACTION:
      turn += 1
      parts.append(f'<div class="action" data-turn="{turn}"><span class="label">policy action, turn {turn}'
                   f'</span>{_pre(text)}</div>')
    elif kind == OBSERVATION:
      parts.append(f'<div class="observation" data-source="environment" data-turn="{turn}"><span class="label">'
                   f'environment observation (tool output, not trained on)</span>{_pre(text)}</div>')
    else:
      raise ValueError(f"unknown segment kind {kind!r}")
  s = record.scores
  stop = (EpisodeStop(record.stop_reason).name.lower() if record.stop_reason in set(EpisodeStop)
          else str(record.stop_reason))
  rows = [("reward", s.get("score")), ("EM", s.get("em")), ("F1", s.get("f1")), ("format", s.get("format")),
          ("predicted answer", s.get("answer")), ("turns", record.num_turns), ("tool calls", record.num_tool_calls),
          ("tool errors", record.num_tool_errors), ("stop", stop)]
  cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows)
  parts.append(f'<table class="scores">{cells}</table></article>')
  return "\n".join(parts)


def _fmt(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:.4f}"
  return "" if v is None else str(v)


def trajectories_html(records: Mapping[str, Mapping[str, Sequence[EpisodeRecord]]], *, title: str,
                      per_dataset: int) -> str:
  """The sample page: the first `per_dataset` episodes of every method x dataset."""
  body = [f"<h1>{html.escape(title)}</h1>",
          '<p>Blue blocks are tokens the policy sampled (<code>action_mask = 1</code>); amber blocks are '
          'environment observations (tool output, <code>action_mask = 0</code>).</p>']
  for method, per in records.items():
    body.append(f'<section class="method" data-method="{html.escape(method)}"><h2>{html.escape(method)}</h2>')
    for recs in per.values():
      body.extend(_episode_html(method, r) for r in list(recs)[:per_dataset])
    body.append("</section>")
  return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + html.escape(title) + "</title><style>"
          + _CSS + "</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def output_paths(out_dir: str | os.PathLike) -> dict[str, epath.Path]:
  """Where `write_outputs` writes in `out_dir`: table.md, results.json, trajectories.html, records.jsonl."""
  out = workdir_lib.workdir_path(out_dir)
  return {"table": out / "table.md", "results": out / "results.json", "html": out / "trajectories.html",
          "records": out / "records.jsonl"}


def write_outputs(out_dir: str | os.PathLike, summaries: Summaries,
                  records: Mapping[str, Mapping[str, Sequence[EpisodeRecord]]], *, policy: str,
                  base_policy: str | None, settings: Mapping[str, Any], samples_per_dataset: int
                  ) -> dict[str, epath.Path]:
  """Writes table.md, results.json, trajectories.html and records.jsonl into `out_dir` (a local or bucket
  directory); returns their paths."""
  out = workdir_lib.workdir_path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = output_paths(out)
  paths["table"].write_text(markdown_report(summaries, policy=policy, base_policy=base_policy), encoding="utf-8")
  paths["results"].write_text(json.dumps(results_json(summaries, policy=policy, base_policy=base_policy,
                                                      settings=settings), indent=2) + "\n", encoding="utf-8")
  paths["html"].write_text(trajectories_html(records, title=f"Sample trajectories: {policy}",
                                             per_dataset=samples_per_dataset), encoding="utf-8")
  with paths["records"].open("w", encoding="utf-8") as f:
    for method, per in records.items():
      for recs in per.values():
        for r in recs:
          f.write(json.dumps({"method": method, **dataclasses.asdict(r)}, ensure_ascii=False) + "\n")
  return paths
