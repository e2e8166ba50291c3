"""Writes `agent_r1_jax_tiny.ipynb` (nbformat 4) from the cell sources below, so the notebook is reviewed as code.

    python notebooks/make_notebook.py            # rewrites notebooks/agent_r1_jax_tiny.ipynb
    python notebooks/make_notebook.py --check    # exit 1 if the committed notebook differs from this script

Cells are (kind, source) pairs; outputs are never stored, so the file only changes when a cell does.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import textwrap

NOTEBOOK_PATH = pathlib.Path(__file__).with_name("agent_r1_jax_tiny.ipynb")
WORKDIR = "runs/grpo_tiny"

CELLS: list[tuple[str, str]] = [
    ("markdown", """
# agent_r1_jax: a tool-using agent trained with RL, end to end, at toy scale

This notebook runs the whole Agent-R1 pipeline (arXiv:2511.14460) at toy scale with the `tiny` preset:

1. installs the package and builds the **synthetic multi-hop world** (a generated encyclopedia, its questions,
   a BM25 `search` tool over it and a byte-level BPE tokenizer; nothing is downloaded);
2. shows a **prompt** and an **expert trajectory**: assistant turns (actions, trained on) interleaved with
   tool results (observations, masked out of the loss by the action mask);
3. runs a **very short GRPO training**: a supervised warm-up of a small Qwen2-architecture model on the
   scripted expert, then two RL steps (multi-turn rollouts, rewards on the last action token, group-relative
   advantages, clipped policy-gradient update);
4. plots `metrics.jsonl` and prints one **sampled trajectory** with actions and observations marked.

It runs on a CPU runtime; a GPU/TPU runtime only makes it faster. The settings below only demonstrate the
pipeline: for a policy that actually searches and answers, use the preset's defaults
(no `--config.sft.stages` or `--config.trainer.total_steps` override).
"""),
    ("markdown", """
## 1. Install

**In Colab**, edit the URL to point at your copy of the repository and run the cell. **Locally**, skip it: start
Jupyter anywhere inside a checkout where `pip install -e .` has been run (the next cell finds the repository root).
"""),
    ("code", """
# Colab only: clone your copy of the repository (edit the URL) and install the package with its pinned deps.
!git clone https://github.com/YOUR_ACCOUNT/agent_r1_jax.git
%cd agent_r1_jax
!pip install -q -e .
"""),
    ("code", """
import json
import os
import pathlib
import sys

# Work from the repository root (configs/ and the CLI paths below are relative to it).
root = pathlib.Path.cwd().resolve()
while not (root / "configs" / "grpo_multihopqa.py").exists():
  if root.parent == root:
    raise RuntimeError("run this notebook inside an agent_r1_jax checkout (or run the install cell first)")
  root = root.parent
os.chdir(root)
print("repository root:", root)

import jax
print("jax", jax.__version__, "devices:", jax.devices())
"""),
    ("markdown", """
## 2. The synthetic world, a prompt and an expert trajectory

`prepare_synthetic_world` generates (or reuses from the cache) the world that the `tiny` preset trains on; the
trainer below finds the same files because it uses the same parameters.
"""),
    ("code", """
from agent_r1_jax.data import prompts
from agent_r1_jax.data.synthetic.builder import expert_trajectories, make_search_env, prepare_synthetic_world
from agent_r1_jax.data.synthetic.world import WorldConfig
from agent_r1_jax.trainer.config import base_config

config = base_config("grpo", "tiny")
files = prepare_synthetic_world(WorldConfig.create(**config.data.synthetic.to_dict()))
manifest = json.loads((files.root / "manifest.json").read_text())
print("world files:", files.root)
print("passages:", manifest["num_passages"], " questions per split:", manifest["num_questions"])
with open(files.corpus_path, encoding="utf-8") as f:
  print("one corpus row (Search-R1 format):", f.readline().strip()[:300])
"""),
    ("code", """
tokenizer = files.load_tokenizer()
env = make_search_env(files, top_k=config.tool.top_k, max_tool_response_length=config.env.max_tool_response_length)
question = files.questions("train")[0]
prompt = prompts.render_prompt(tokenizer, question["question"], env.tool_schemas)
print(prompt)
print("gold answers:", question["answers"])
print("prompt tokens:", len(prompts.encode_prompt(tokenizer, prompt)))
"""),
    ("code", """
from agent_r1_jax.data import sft
from agent_r1_jax.rewards.multihopqa import compute_score

expert = expert_trajectories(files, "train", env=env, limit=1)[0]
for text, is_action in expert.segments:
  print(f"----- {'ACTION (policy tokens, trained on)' if is_action else 'OBSERVATION (tool output, masked)'}")
  print(text)
example = sft.tokenize_trajectory(tokenizer, prompt, expert.segments)
print("-----")
print(f"response tokens: {len(example.response_ids)}, of which actions: {int(example.action_mask.sum())}")
print("reward of this trajectory:", compute_score(expert.response_text, question["answers"]))
"""),
    ("markdown", f"""
## 3. A very short GRPO run

Warm-up on 20 batches of expert trajectories, then 2 RL steps of 8 prompts x 5 samples. The run writes
`{WORKDIR}/metrics.jsonl`, checkpoints, `samples.jsonl` (scored held-out episodes), `summary.json`, `curves.png`
and an HF export. Rerunning with the same `--workdir` resumes instead of starting over (delete the folder to
start again).

Twenty warm-up steps are too few for the model to learn the answer format, so expect rewards of -1 and EM 0:
every sample of a prompt then has the same reward, GRPO's group-relative advantages are all zero and the
policy-gradient loss is 0. On 2 CPU cores shared with other jobs this cell took about 20 minutes.
"""),
    ("code", f"""
!python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py:tiny --workdir={WORKDIR} \\
    --config.sft.stages=all:20:16 --config.trainer.total_steps=2 --config.trainer.eval_num_examples=16 \\
    --config.trainer.progress_bar=False
"""),
    ("markdown", """
## 4. Training curves and a sampled trajectory
"""),
    ("code", f"""
import matplotlib.pyplot as plt

workdir = pathlib.Path("{WORKDIR}")
rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
print(f"{{len(rows)}} logged steps, {{len(rows[0])}} metrics per step")
panels = [("reward", "train reward"), ("em", "train EM"), ("rollout/tool_calls_mean", "tool calls / episode"),
          ("actor/pg_loss", "policy-gradient loss"), ("actor/entropy", "entropy"), ("actor/kl_loss", "KL to reference")]
panels = [(k, t) for k, t in panels if any(r.get(k) is not None for r in rows)]
fig, axes = plt.subplots(2, 3, figsize=(10, 5.2))
for ax in axes.flat[len(panels):]:
  ax.axis("off")
for ax, (key, title) in zip(axes.flat, panels):
  points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
  ax.plot(*zip(*points), marker="o")
  ax.set_title(title)
  ax.set_xlabel("RL step")
fig.tight_layout()
plt.show()
summary = json.loads((workdir / "summary.json").read_text())
for phase in ("before_rl", "after_rl"):
  for source, m in summary[phase].items():
    print(f"{{phase:9s}} {{source}}: " + ", ".join(f"{{k}}={{m[k]:.3f}}" for k in ("em", "f1", "format", "tool_calls")))
"""),
    ("code", f"""
import html

from IPython.display import HTML, display

samples = [json.loads(line) for line in (pathlib.Path("{WORKDIR}") / "samples.jsonl").read_text().splitlines()]
record = max(samples, key=lambda r: (r["num_tool_calls"] > 0, r["scores"]["score"]))  # prefer one that used the tool
print("question:", record["question"])
print("gold:", record["answers"], " turns:", record["num_turns"], " tool calls:", record["num_tool_calls"])
print("scores:", {{k: record["scores"][k] for k in ("score", "em", "f1", "format")}})
colors = {{"action": "#e3f2fd", "observation": "#f1f1f1"}}
parts = [f'<div style="background:{{colors[kind]}};padding:4px;margin:2px 0;white-space:pre-wrap;font-family:monospace">'
         f'<b>{{kind.upper()}}</b>\\n{{html.escape(text)}}</div>' for kind, text in record["segments"]]
display(HTML("".join(parts)))
"""),
]


def _source_lines(text: str) -> list[str]:
  """nbformat stores a cell's source as lines that keep their newline (except the last)."""
  lines = textwrap.dedent(text).strip("\n").splitlines(keepends=True)
  if lines:
    lines[-1] = lines[-1].rstrip("\n")
  return lines


def build_notebook() -> dict:
  """The notebook as nbformat 4.5 JSON (a dict)."""
  cells = []
  for i, (kind, text) in enumerate(CELLS):
    cell = {"cell_type": kind, "id": f"cell-{i:02d}", "metadata": {}, "source": _source_lines(text)}
    if kind == "code":
      cell.update(execution_count=None, outputs=[])
    cells.append(cell)
  return {
      "cells": cells,
      "metadata": {
          "accelerator": "GPU",
          "colab": {"name": NOTEBOOK_PATH.name, "provenance": []},
          "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
          "language_info": {"name": "python"},
      },
      "nbformat": 4,
      "nbformat_minor": 5,
  }


def render() -> str:
  return json.dumps(build_notebook(), indent=1, ensure_ascii=False) + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="fail if the notebook on disk is out of date")
  args = parser.parse_args()
  text = render()
  if args.check:
    if not NOTEBOOK_PATH.exists() or NOTEBOOK_PATH.read_text(encoding="utf-8") != text:
      print(f"{NOTEBOOK_PATH} is out of date: run python {pathlib.Path(__file__).name}", file=sys.stderr)
      return 1
    return 0
  NOTEBOOK_PATH.write_text(text, encoding="utf-8")
  print(f"wrote {NOTEBOOK_PATH} ({len(CELLS)} cells)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
