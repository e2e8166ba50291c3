"""The evaluation as one function: build the task and policies, roll out every method, write the outputs.

`agent_r1_jax.evaluate` (the CLI) and `experiments.paper_tables` call `run`; see the CLI's docstring for what
is written where.

Multi-host: every process runs `run` (the same command on every worker); the questions are split over the
processes and their records gathered (`rollout.evaluation.evaluate_examples`), so every process holds the same
summaries and records, and process 0 alone writes the outputs and prints the report.
"""

from __future__ import annotations

import pathlib

import jax
from etils import epath

from agent_r1_jax import trainer
from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.evaluation import datasets as datasets_lib
from agent_r1_jax.evaluation import methods as methods_lib
from agent_r1_jax.evaluation import report, runner
from agent_r1_jax.evaluation.policy import read_workdir_config


def task_config(config, workdir: str | None, hf_checkpoint: str | None):
  """`config` if given, else the workdir's config.json, else the tiny preset; unlocked, ready to build."""
  if config is not None:
    c = config
  elif workdir:
    c = read_workdir_config(workdir)
  else:
    c = trainer.base_config("grpo", "tiny")
  with c.unlocked():
    c.dry_run = False
    if hf_checkpoint and not c.model.tokenizer_path and not c.model.path and c.data.source != "synthetic":
      c.model.tokenizer_path = hf_checkpoint  # the multihopqa task reads its tokenizer from the model directory
  return c


def run(*, workdir: str | None, hf_checkpoint: str | None, base_hf_checkpoint: str | None, step: int | None,
        methods: list[str], datasets: list[str], out_dir: str | None, num_examples: int, batch_size: int,
        samples_per_dataset: int, seed: int, config=None) -> dict[str, epath.Path]:
  """The CLI's work as a function (tests call it); returns the written files.

  `config` is the `--config` ConfigDict (None: the workdir's config.json, or the tiny preset). `workdir` and
  `out_dir` may be local or in a bucket (`gs://`).
  """
  if bool(workdir) == bool(hf_checkpoint):
    raise ValueError("give exactly one of --workdir (a training run) or --hf_checkpoint (a Hugging Face directory)")
  chosen = methods_lib.get_methods(methods)
  c = task_config(config, workdir, hf_checkpoint)
  trainer.resolve_assets(c)
  trainer.validate_config(c)
  names = datasets_lib.select_datasets(c, datasets)
  task = trainer.build_task(c)
  sets = datasets_lib.load_datasets(task, names)
  mesh = evaluation_mesh(c)
  base_dir = base_hf_checkpoint
  if hf_checkpoint and not base_dir and c.model.path and pathlib.Path(c.model.path) != pathlib.Path(hf_checkpoint):
    base_dir = c.model.path
  policy, base = runner.build_policies(c, task.tokenizer, mesh, workdir=workdir, hf_checkpoint=hf_checkpoint,
                                       base_hf_checkpoint=base_dir, step=step,
                                       need_base=any(m.base_model for m in chosen))
  result = runner.evaluate_methods(task, c, policy, base, [m.name for m in chosen], sets,
                                   num_examples=num_examples or None,
                                   batch_size=batch_size or c.trainer.eval_batch_size, seed=seed)
  out = workdir_lib.workdir_path(out_dir) if out_dir else (workdir_lib.workdir_path(workdir) / "eval" if workdir
                                                            else workdir_lib.workdir_path("eval"))
  settings = {"greedy": True, "num_examples": num_examples or None, "reward_style": c.algorithm.reward_style,
              "data_source": c.data.source, "max_turns": c.rollout.max_turns,
              "max_new_tokens_per_turn": c.rollout.max_new_tokens_per_turn, "top_k": c.tool.top_k}
  base_name = base.name if base is not None else None
  if jax.process_index() != 0:
    return report.output_paths(out)
  paths = report.write_outputs(out, result.summaries, result.records, policy=policy.name, base_policy=base_name,
                               settings=settings, samples_per_dataset=samples_per_dataset)
  print(report.markdown_report(result.summaries, policy=policy.name, base_policy=base_name), flush=True)
  print(f"wrote {', '.join(str(p) for p in paths.values())}", flush=True)
  return paths


def evaluation_mesh(c):
  """`c.mesh`'s mesh; with several processes, one whose batch axes reach every process's devices: a mesh of
  fixed sizes that leaves devices out (a run trained on one host, evaluated on several) gets `data = -1`."""
  mesh = trainer.build_mesh(c)
  if {d.process_index for d in mesh.devices.flat} == set(range(jax.process_count())):
    return mesh
  with c.unlocked():
    c.mesh.data = -1
  if jax.process_index() == 0:
    print(f"mesh {dict(mesh.shape)} leaves processes out; evaluating with mesh.data = -1", flush=True)
  return trainer.build_mesh(c)
