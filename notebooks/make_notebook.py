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

# The budget "micro": the smallest run that still executes every code path of the notebook (each warm-up stage
# and its data sources, RL steps with validation, held-out evaluation before and after RL, the curves and the HF
# export). CI executes the notebook at this budget (tests/test_notebook.py).
TINY_MICRO_OVERRIDES = (
    "--config.sft.stages=copy:1:4,1:1:4,2:1:4,all:1:4",
    "--config.sft.reading_worlds=1",
    "--config.sft.reading_questions=4",
    "--config.sft.rag_questions=2",
    "--config.sft.multi_hop_worlds=1",
    "--config.sft.multi_hop_questions=4",
    "--config.trainer.total_steps=2",
    "--config.trainer.batch_size=2",
    "--config.actor.micro_batch_size_per_device=5",
    "--config.trainer.eval_every=1",
    "--config.trainer.eval_num_examples=4",
    "--config.trainer.eval_batch_size=4",
)

# The notebook is a list of sections, each a list of (kind, source) cells. SETUP_CELLS (budget, install,
# repository root) come first; every later section is self-contained from there (its own config, run folder
# under RUNS_DIR and per-budget overrides) and continues the heading numbers.
SETUP_CELLS: list[tuple[str, str]] = [
    ("markdown", """
# agent_r1_jax: a tool-using agent trained with RL, end to end, at toy scale

This notebook runs the whole Agent-R1 pipeline (arXiv:2511.14460) on the offline `tiny` default:

1. builds the **synthetic multi-hop world** (a generated encyclopedia, its questions, a BM25 `search` tool over
   it and a byte-level BPE tokenizer; nothing is downloaded);
2. shows a **prompt** and an **expert trajectory**: assistant turns (actions, trained on) interleaved with
   tool results (observations, masked out of the loss by the action mask);
3. **trains**: a supervised warm-up of a small Qwen2-architecture model from scratch, then GRPO (multi-turn
   rollouts, rewards on the last action token, group-relative advantages, clipped policy-gradient update);
4. plots the run's `metrics.jsonl` and prints one of the trained policy's **trajectories** with actions and
   observations marked.

**Budget** (the next cell; environment variable `AGENT_R1_NOTEBOOK_BUDGET`):

- `full` (default) trains the tiny default to the end: the README's main command,
  `python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py`. The policy learns to call its search tool
  (0 to 2 calls per episode) and held-out exact match (greedy, 64 test questions) rises from near 0 after warm-up
  to about 0.83: 0.02 -> 0.84 in the README's measured run, 0.06 -> 0.83 when this notebook ran it (seed 0; the
  README reports seeds 1-3 at 0.56-0.88). Measured wall time on 2-core CPUs, world generation included: 23
  minutes at a float32 matmul rate of ~70 GFLOP/s, 13 minutes at ~480 GFLOP/s (this notebook: 34 minutes at
  ~145 GFLOP/s while other jobs shared the cores). Its time on a Colab GPU or TPU runtime has not been measured.
- `micro` runs every code path of the notebook at the smallest size (one step of each warm-up stage, 2 GRPO steps
  of 2 prompts x 5 samples, 4 evaluation questions): about 2 minutes on a 2-core ~145 GFLOP/s CPU shared with
  other jobs.
  The model learns nothing at this size (reward -1, exact match 0); it checks that the notebook works, and CI
  runs it this way.
"""),
    ("code", """
# Parameters: the budget ("full" or "micro", see above) and the folder the runs are written to (relative to the
# repository root). Edit the defaults here or set the environment variables.
import os

BUDGET = os.environ.get("AGENT_R1_NOTEBOOK_BUDGET", "full")
RUNS_DIR = os.environ.get("AGENT_R1_NOTEBOOK_RUNS_DIR", "runs")
if BUDGET not in ("full", "micro"):
  raise ValueError(f"AGENT_R1_NOTEBOOK_BUDGET must be 'full' or 'micro', got {BUDGET!r}")
print(f"budget: {BUDGET}, runs under: {RUNS_DIR}")
"""),
    ("markdown", """
## 1. Install

**In Colab**, edit `REPO_URL` to point at your copy of the repository and run the cell: it clones it and
installs the package with the JAX build that uses the runtime's accelerator (`pip install -e ".[tpu]"` on a TPU
runtime, `".[cuda12]"` on an NVIDIA GPU, plain `-e .`, the CPU build, otherwise). If Colab then asks to restart
the session, do so and run the notebook again from the top (the clone is reused). **Anywhere else** the cell does
nothing: start Jupyter inside a checkout where `pip install -e .` (or one of those extras) has been run.
"""),
    ("code", """
import glob
import shutil
import subprocess
import sys

REPO_URL = "https://github.com/YOUR_ACCOUNT/agent_r1_jax.git"  # edit: your copy of the repository


def jax_extra() -> str:
  \"\"\"The pyproject.toml extra whose JAX build drives this runtime's accelerator ("": the CPU build).\"\"\"
  tpu_env = any(os.environ.get(k) for k in ("COLAB_TPU_ADDR", "TPU_NAME", "TPU_ACCELERATOR_TYPE"))
  if tpu_env or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return "tpu"
  if shutil.which("nvidia-smi"):
    return "cuda12"
  return ""


if "google.colab" not in sys.modules:
  print("not in Colab: install skipped (this kernel's environment is used as it is)")
else:
  if not os.path.exists("configs/grpo_multihopqa.py"):  # not inside the clone yet
    if not os.path.isdir("agent_r1_jax"):
      subprocess.run(["git", "clone", REPO_URL], check=True)
    os.chdir("agent_r1_jax")
  extra = jax_extra()
  target = f".[{extra}]" if extra else "."
  print(f"runtime accelerator: {extra or 'none (CPU)'}; pip install -e {target!r}")
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", target], check=True)
"""),
    ("code", """
import codecs
import json
import pathlib
import shlex

# Work from the repository root (configs/ and the CLI paths below are relative to it).
root = pathlib.Path.cwd().resolve()
while not (root / "configs" / "grpo_multihopqa.py").exists():
  if root.parent == root:
    raise RuntimeError("run this notebook inside an agent_r1_jax checkout (or run the install cell first)")
  root = root.parent
os.chdir(root)
if str(root) not in sys.path:  # a package installed by this kernel is importable only after a restart
  sys.path.insert(0, str(root))
print("repository root:", root)


def run_streamed(cmd: list[str]) -> None:
  \"\"\"Runs a command with its output (progress bars included) streamed into the notebook; raises if it fails.\"\"\"
  print("$", shlex.join(cmd), flush=True)
  decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
    while chunk := proc.stdout.read1(1 << 16):
      sys.stdout.write(decoder.decode(chunk))
      sys.stdout.flush()
  if proc.returncode:
    raise RuntimeError(f"the command failed with exit status {proc.returncode}: see its output above")


import jax

print("jax", jax.__version__, "devices:", jax.devices())
"""),
]

TINY_CELLS: list[tuple[str, str]] = [
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
# The prompt exactly as the trainer renders it: the tiny preset leaves out the tool-schema block and the
# instruction line (its from-scratch model learns the call format in warm-up; the real presets keep both).
prompt_tools = env.tool_schemas if config.data.tools_in_prompt else None
prompt = prompts.render_prompt(tokenizer, question["question"], prompt_tools, instruction=config.data.instruction)
print(prompt)
print("gold answers:", question["answers"])
print("prompt tokens:", len(prompts.encode_prompt(tokenizer, prompt)))
"""),
    ("code", """
import html

from IPython.display import display

from agent_r1_jax.data import sft
from agent_r1_jax.rewards.multihopqa import compute_score


class MarkedTrajectory:
  \"\"\"An episode's response as ("action" | "observation", text) segments, shown with each segment's role marked:
  coloured blocks where the front end renders HTML, `----- ACTION` / `----- OBSERVATION` headers as text.\"\"\"

  LABELS = {"action": "ACTION (policy tokens, trained on)", "observation": "OBSERVATION (tool output, masked out)"}
  COLORS = {"action": "#e3f2fd", "observation": "#f1f1f1"}

  def __init__(self, segments):
    self.segments = [(kind, text) for kind, text in segments]

  def __repr__(self):
    return "\\n".join(f"----- {self.LABELS[kind]}\\n{text}" for kind, text in self.segments)

  def _repr_html_(self):
    return "".join(f'<div style="background:{self.COLORS[kind]};color:#000;padding:4px;margin:2px 0;'
                   f'white-space:pre-wrap;font-family:monospace"><b>{self.LABELS[kind]}</b>\\n{html.escape(text)}</div>'
                   for kind, text in self.segments)


expert = expert_trajectories(files, "train", env=env, limit=1)[0]
display(MarkedTrajectory(("action" if is_action else "observation", text) for text, is_action in expert.segments))
example = sft.tokenize_trajectory(tokenizer, prompt, expert.segments)
print(f"response tokens: {len(example.response_ids)}, of which actions: {int(example.action_mask.sum())}")
print("reward of this trajectory:", compute_score(expert.response_text, question["answers"]))
"""),
    ("markdown", """
## 3. Train: supervised warm-up, then GRPO

The `full` budget runs the README's main command with the preset's defaults: warm-up (the copy drill, then
one-hop reading episodes in fresh worlds and the scripted expert's episodes in stages of growing length), a
greedy held-out evaluation on 64 test questions, 15 GRPO steps of 8 prompts x 5 samples with a validation check
every 5 steps, the held-out evaluation again, and an HF export. The `micro` budget shrinks every one of these
stages with the overrides printed below (each names a field of `agent_r1_jax/trainer/config.py`).

The run writes `metrics.jsonl`, checkpoints, `samples.jsonl` (scored held-out episodes), `summary.json`,
`curves.png` and `hf_export/` into its folder. Rerunning with the same folder resumes instead of starting over
(delete the folder to start again).
"""),
    ("code", f"""
TINY_OVERRIDES = {{
    "full": [],  # the preset's defaults
    "micro": [
{"".join(f'        "{o}",{chr(10)}' for o in TINY_MICRO_OVERRIDES)}    ],
}}
tiny_workdir = pathlib.Path(RUNS_DIR) / ("grpo_tiny" if BUDGET == "full" else f"grpo_tiny_{{BUDGET}}")
# --verbosity=-1 keeps the libraries' INFO logs (checkpoint writes) out of the output; the run's own tables print.
run_streamed([sys.executable, "-m", "agent_r1_jax.train", "--config=configs/grpo_multihopqa.py",
              f"--workdir={{tiny_workdir}}", "--verbosity=-1", *TINY_OVERRIDES[BUDGET]])
"""),
    ("markdown", """
## 4. Training curves and a trajectory of the trained policy

`curves.png` is the trainer's own figure (`trainer/reporting.py`, drawn from `metrics.jsonl` and
`summary.json`): training reward and EM per RL step, greedy validation and held-out EM, and tool calls per
episode. The second figure reads the learner's side of `metrics.jsonl`. At the `full` budget the held-out EM
rises from near 0 to about 0.83 and tool calls from 0 to 2 per episode; at `micro` the curves are two flat
points.
"""),
    ("code", """
import matplotlib.pyplot as plt
from IPython.display import Image

from agent_r1_jax.trainer.reporting import summary_table

rows = [json.loads(line) for line in (tiny_workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
print(f"{len(rows)} logged RL steps, {len(rows[0])} metrics per step")
display(Image(filename=str(tiny_workdir / "curves.png")))

panels = [("actor/pg_loss", "policy-gradient loss"), ("actor/entropy", "entropy"),
          ("actor/kl_loss", "KL to the reference"), ("actor/grad_norm", "gradient norm")]
fig, axes = plt.subplots(1, len(panels), figsize=(14, 2.8))
for ax, (key, title) in zip(axes, panels):
  points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
  if points:
    ax.plot(*zip(*points), marker="o")
  ax.set_title(title)
  ax.set_xlabel("RL step")
fig.tight_layout()
plt.show()
print(summary_table(json.loads((tiny_workdir / "summary.json").read_text())))
"""),
    ("code", """
samples = [json.loads(line) for line in (tiny_workdir / "samples.jsonl").read_text().splitlines() if line.strip()]
# One greedy held-out episode of the trained policy: preferably one that used the tool, then the best scored.
record = max(samples, key=lambda r: (r["num_tool_calls"] > 0, r["scores"]["score"]))
print("question:", record["question"])
print("gold:", record["answers"], " turns:", record["num_turns"], " tool calls:", record["num_tool_calls"])
print("scores:", {k: record["scores"][k] for k in ("score", "em", "f1", "format")})
display(MarkedTrajectory(record["segments"]))
"""),
]

SECTIONS: list[list[tuple[str, str]]] = [SETUP_CELLS, TINY_CELLS]
CELLS: list[tuple[str, str]] = [cell for section in SECTIONS for cell in section]


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
