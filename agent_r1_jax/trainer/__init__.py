"""The RL trainer: the run's config, the step loop, checkpoints and metrics. The jitted updates are `learner`'s,
the supervised warm-up `warmup`'s and the dry run `sizing`'s.

The names below are the trainer's public surface: what the evaluation CLI (`agent_r1_jax.evaluation`) and the
experiments (`agent_r1_jax.experiments`) use to configure a run, rebuild its policy and task, and train. The
modules under `trainer/` are otherwise internal; the episode scoring shared with training is
`agent_r1_jax.rollout.evaluation`.

Configuring a run:
  base_config(algorithm, preset)  the ConfigDict of an algorithm ("grpo", "ppo", ...) at a model preset.
  validate_config(c)              one ValueError naming the field to change (`trainer.config.validate`).
  resolve_assets(c)               fills in, in place, the model and data paths a config names, preparing the
                                  missing ones (`trainer.assets.resolve`).

Rebuilding a run's task and policy:
  Task, build_task(c)             tokenizer, tool environment, train / evaluation examples, prompt rendering.
  SYNTHETIC_SOURCE                the `data_source` of the synthetic multi-hop task.
  build_mesh(c)                   the device mesh a run shards over.
  model_config(c, vocab_size)     the actor's `Qwen2Config`.
  rollout_config(c, tokenizer)    the rollout limits training uses.
  build_sampler(c, graphdef, tokenizer, rcfg, mesh)  the sampler, with the stop sequences training uses.

Reading a run's workdir:
  read_workdir_config(workdir)    the config a run saved.
  checkpoint_steps(workdir)       the steps with a saved checkpoint.
  restore_actor(workdir, c, arch, mesh, step)  (graphdef, actor params, step) of a checkpoint.
  IncompatibleCheckpointError     raised for a checkpoint of another architecture.
  read_metrics(workdir)           the rows of a run's metrics.jsonl.

Training:
  prepare_config(c)               resolve_assets, then validate_config: what training and the dry run start from.
  train(c, workdir)               prepares the config, then trains (a `dry_run` config is refused: the CLI sizes it
                                  with `sizing.dry_run.dry_run`).
  RunResult                       what `train` returns: final step, preemption, the summary's numbers.
"""

from agent_r1_jax.trainer.actor_checkpoint import checkpoint_steps, read_workdir_config, restore_actor
from agent_r1_jax.trainer.assets import resolve as resolve_assets
from agent_r1_jax.learner.build import build_mesh, build_sampler, model_config, rollout_config
from agent_r1_jax.trainer.checkpointing import IncompatibleCheckpointError
from agent_r1_jax.trainer.config import base_config
from agent_r1_jax.trainer.config import validate as validate_config
from agent_r1_jax.trainer.loop import RunResult, prepare_config, train
from agent_r1_jax.trainer.metrics import read_metrics
from agent_r1_jax.trainer.task import SYNTHETIC_SOURCE, Task, build_task

__all__ = ["SYNTHETIC_SOURCE", "IncompatibleCheckpointError", "RunResult", "Task", "base_config", "build_mesh",
           "build_sampler", "build_task", "checkpoint_steps", "model_config", "prepare_config", "read_metrics",
           "read_workdir_config", "resolve_assets", "restore_actor", "rollout_config", "train", "validate_config"]
