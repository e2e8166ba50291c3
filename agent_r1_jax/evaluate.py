"""Evaluate a policy the way the paper's Table 3 does: agent vs Base Tool Call, Naive RAG and No Retrieval.

    python -m agent_r1_jax.evaluate --workdir=RUN_DIR [--step=N] \\
        [--methods=agent,base_tool_call,naive_rag,no_retrieval] [--datasets=synthetic,one_hop] [--num_examples=200]
    python -m agent_r1_jax.evaluate --hf_checkpoint=DIR --config=configs/grpo_multihopqa.py:qwen2.5-3b \\
        --config.model.path=BASE_DIR --config.data.prepared_dir=DATA --config.tool.corpus_path=corpus.jsonl \\
        --datasets=hotpotqa,2wikimultihopqa,musique

The task (tokenizer, tools, data, rollout limits, reward style) comes from `--config` when given, else from the
workdir's `config.json`, else the tiny preset (synthetic world). Episodes are greedy and run through the
training rollout engine (`rollout.engine`: the slot engine, or `--config.rollout.engine=lockstep`) and scorer.
Writes `table.md` (EM per dataset + average, one row per method; also printed), `results.json` (EM / F1 /
substring accuracy / format / turns / tool-call and tool-error rates per method x dataset), `trajectories.html`
(sample episodes with actions and environment observations marked) and `records.jsonl` to `--out_dir` (default
`RUN_DIR/eval`, or `./eval` for an HF directory).

Single-turn methods score 0 on the paper reward's tool-format term by construction: compare methods by EM.

Multi-host: launch the same command on every worker with `AGENT_R1_DISTRIBUTED=on` (or the JAX_* variables of
`agent_r1_jax.distributed`); the questions are split over the processes, which step through the sampler's
programs together, the records are gathered in question order (greedy: the one-process figures exactly), and
process 0 writes the outputs.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Task/model config file (e.g. configs/grpo_multihopqa.py:tiny); default: the workdir's "
    "config.json, or the tiny preset for --hf_checkpoint.", lock_config=False)
_WORKDIR = flags.DEFINE_string("workdir", None, "Training run directory (config.json + checkpoints/), local or "
                                "gs://bucket/dir.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of --workdir to evaluate (default: the latest).")
_HF = flags.DEFINE_string("hf_checkpoint", None, "Hugging Face checkpoint directory to evaluate instead.")
_BASE_HF = flags.DEFINE_string(
    "base_hf_checkpoint", None, "Base (untrained instruct) model of base_tool_call. Default: the run's model.path, "
    "else its step-0 checkpoint; for --hf_checkpoint, the config's model.path, else that same directory.")
_METHODS = flags.DEFINE_list("methods", ["agent", "base_tool_call", "naive_rag", "no_retrieval"],
                             "Methods to run (agent, base_tool_call, naive_rag, no_retrieval).")
_DATASETS = flags.DEFINE_list("datasets", [], "Evaluation sets (hotpotqa, 2wikimultihopqa, musique; synthetic and "
                              "one_hop for the synthetic world); default: every set the task has.")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Where the outputs go (a local or gs:// directory).")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 0, "Examples per dataset (0 = all).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Prompts per rollout (0 = config trainer.eval_batch_size): the "
                                   "slot engine's episodes in flight over all devices, or the lockstep driver's batch.")
_SAMPLES = flags.DEFINE_integer("samples_per_dataset", 5, "Episodes per method x dataset on the HTML page.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed (greedy decoding does not use it).")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from agent_r1_jax.distributed import maybe_initialize  # pylint: disable=import-outside-toplevel  (after flags)
  maybe_initialize()  # multi-host: before anything touches a JAX backend; a no-op for one process
  from agent_r1_jax.evaluation.pipeline import run  # pylint: disable=import-outside-toplevel
  try:
    run(workdir=_WORKDIR.value, hf_checkpoint=_HF.value, base_hf_checkpoint=_BASE_HF.value, step=_STEP.value,
        methods=_METHODS.value, datasets=_DATASETS.value, out_dir=_OUT_DIR.value, num_examples=_NUM_EXAMPLES.value,
        batch_size=_BATCH_SIZE.value, samples_per_dataset=_SAMPLES.value, seed=_SEED.value, config=_CONFIG.value)
  except ValueError as e:  # a user-fixable problem: one message, no traceback
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main)
