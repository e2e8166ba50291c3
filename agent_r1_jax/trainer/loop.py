"""The RL training loop: one step in the paper's order, checkpoints, evaluation, export.

One step:
  prompts (n samples each, shared group ids) -> multi-turn rollout with the CURRENT actor parameters
  -> scores on each row's last action token -> old log-probs recomputed by the learner (max drift against the
  sampler's log-probs is logged) -> reference log-probs (frozen initial policy) -> values (critic)
  -> optional KL-in-reward -> advantages (registry) -> critic update -> actor update (after critic_warmup)
  -> metrics -> periodic evaluation and checkpoint.

An on-policy step (`onpolicy_shortcut`) skips the old-log-prob pass: its one actor update holds its own
forward's log-probs fixed as the old ones and reports the drift and entropy from that forward.

The rollout and the learner batch built from it (up to the advantages) are trainer/rollout_step.py's; this
module runs the updates, the loop, checkpoints, evaluation and export.

State that a checkpoint holds: actor params + AdamW state, critic params + state (PPO), the frozen reference
(when a KL term is on: after a supervised warm-up it exists nowhere else), the PRNG key, the data iterator
position, the KL controller's coefficient and the held-out evaluation before RL. Step `s`'s randomness is `fold_in(key, s)`, so a
resumed run replays exactly what an uninterrupted one does (tested).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from ml_collections import config_dict

from agent_r1_jax import rl
from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.data.loader import example_iterator
from agent_r1_jax.models import save_hf_checkpoint
from agent_r1_jax.models.sharding import place as place_on_mesh
from agent_r1_jax.rollout import evaluation
from agent_r1_jax.sampling import SamplingParams
from agent_r1_jax.learner import batch_split, build
from agent_r1_jax.trainer import actor_checkpoint, assets, backend
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.trainer import reporting, task as task_lib
from agent_r1_jax.trainer import wandb_logging, warmup_checkpoints
from agent_r1_jax.warmup import run as warmup_run
from agent_r1_jax.warmup import sft as sft_lib
from agent_r1_jax.trainer.checkpointing import Checkpointer, Preemption
from agent_r1_jax.trainer.metrics import MetricsWriter
from agent_r1_jax.trainer.rollout_step import RolloutStepMixin
from agent_r1_jax.trainer.warmup_checkpoints import WarmupCheckpoints, WarmupInterrupted


@dataclasses.dataclass
class RunResult:
  """What `train` returns: the final step, whether it was preempted, and the summary table's numbers."""
  step: int
  preempted: bool
  summary: dict[str, Any]


class RLTrainer(RolloutStepMixin):
  """Builds every component from a config and runs the loop in `run()`. A step's rollout and learner batch
  (`rollout`, `onpolicy_shortcut`, `prepare_batch`) come from `RolloutStepMixin` (trainer/rollout_step.py)."""

  def __init__(self, c: config_dict.ConfigDict, workdir: str | pathlib.Path):
    wandb_logging.check_installed(c)  # W&B on without its package: one error before anything is prepared or built
    prepare_config(c)
    self.c = c
    self.workdir = workdir_lib.workdir_path(workdir)  # a local directory or gs://bucket/dir
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.is_chief = jax.process_index() == 0  # the one process that writes files (multi-host)
    if self.is_chief:
      # The run's full config, so `agent_r1_jax.evaluate --workdir` can rebuild the same task and model.
      (self.workdir / "config.json").write_text(c.to_json_best_effort(indent=2, sort_keys=True) + "\n")
      # What differs from the preset (overrides and resolved paths), printed and kept beside the full config.
      differences = {k: {"preset": old, "run": new} for k, (old, new) in config_lib.differences(c).items()}
      (self.workdir / "config_differences.json").write_text(
          json.dumps(differences, indent=2, sort_keys=True, default=repr) + "\n")
      print(config_lib.describe_differences(c), flush=True)
    self.task = task_lib.build_task(c)
    tok = self.task.tokenizer
    self.mesh = build.build_mesh(c)
    self.arch = build.model_config(c, vocab_size=len(tok))
    actor = build.build_model(c, self.arch, self.mesh, head="lm")
    self.actor_graphdef, actor_params = nnx.split(actor)
    self.rollout_cfg = build.rollout_config(c, tok)
    self.sampler = build.build_sampler(c, self.actor_graphdef, tok, self.rollout_cfg, self.mesh)
    self.sampling = SamplingParams(temperature=c.rollout.temperature, top_k=c.rollout.top_k, top_p=c.rollout.top_p)
    self.greedy = SamplingParams(greedy=True)
    state: dict[str, Any] = {"actor": actor_params, "rng": jax.random.key_data(jax.random.key(c.seed))}
    critic_graphdef = None
    if c.algorithm.use_critic:
      critic_graphdef, critic_params = nnx.split(build.build_model(c, self.arch, self.mesh, head="value"))
      if not c.model.path:  # a loaded critic already has the checkpoint's backbone
        critic_params = build.critic_from_actor(critic_params, actor_params)
      state["critic"] = critic_params
    if build.needs_reference(c):
      state["ref"] = build.copy_tree(actor_params)
    self.learner = build.build_learner(c, self.actor_graphdef, critic_graphdef,
                                       logprob_temperature=self.sampling.logprob_temperature)
    state["actor_opt"] = self.learner.actor_tx.init(actor_params)
    if c.algorithm.use_critic:
      state["critic_opt"] = self.learner.critic_tx.init(state["critic"])
    self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    self.state = self._on_mesh(state)
    self.kl_ctrl = rl.make_kl_controller(c.algorithm.kl_ctrl, c.algorithm.kl_coef, c.algorithm.target_kl,
                                         c.algorithm.kl_horizon)
    self.adv_params = rl.AdvantageParams(gamma=c.algorithm.gamma, lam=c.algorithm.lam,
                                         norm_by_std=c.algorithm.norm_by_std, whiten=c.algorithm.whiten)
    self._advantages = jax.jit(rl.compute_advantages, static_argnames=("name", "params"))
    self._kl_penalty = jax.jit(rl.apply_kl_penalty, static_argnames=("kind",))
    self.prompts_per_process = c.trainer.batch_size // jax.process_count()
    self.data_iter = example_iterator(self.task.train, batch_size=self.prompts_per_process, seed=c.data.shuffle_seed,
                                      shard_index=jax.process_index(), shard_count=jax.process_count())
    self.batch_sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
    self._take_rows = jax.jit(lambda batch, idx: jax.tree.map(lambda v: v[idx], batch),
                              out_shardings=self.batch_sharding)
    self.checkpointer = Checkpointer(self.workdir / "checkpoints", max_to_keep=c.trainer.max_to_keep)
    self.fingerprint = build.fingerprint(c, self.arch)
    self.meta: dict[str, Any] = {}
    self.wandb: wandb_logging.WandbSink | None = None  # the W&B run while `run()` runs (chief, W&B on)

  def _on_mesh(self, tree):
    """Every leaf as a global array on the mesh: leaves without a mesh sharding (optimizer step counts, the
    PRNG key) are replicated, which multi-host checkpointing needs (orbax refuses host-local arrays)."""
    def place(x):
      if isinstance(x, jax.Array) and isinstance(x.sharding, jax.sharding.NamedSharding):
        return x
      return place_on_mesh(x, self.replicated)
    return jax.tree.map(place, tree)

  # ---- checkpoints ------------------------------------------------------------------------------------

  def _save(self, step: int, *, force: bool = False) -> None:
    meta = dict(self.meta, step=step, fingerprint=self.fingerprint, data_iterator=self.data_iter.get_state(),
                kl_coef=self.kl_ctrl.value)
    self.checkpointer.save(step, self.state, meta, force=force)

  def _restore(self, step: int) -> None:
    self.state, meta = self.checkpointer.restore(step, self.state, self.fingerprint)
    self.data_iter.set_state(meta["data_iterator"])
    self.kl_ctrl.value = float(meta["kl_coef"])
    self.meta = {k: v for k, v in meta.items() if k not in ("step", "fingerprint", "data_iterator", "kl_coef")}

  # ---- warm-up and evaluation -------------------------------------------------------------------------

  def warmup(self, log, progress: WarmupCheckpoints | None = None) -> None:
    """Supervised warm-up (`warmup.run.warm_up`: its stages, then extra rounds while its read check fails),
    resumed and saved by `progress`; afterwards the optimizer state restarts and the reference and the critic's
    backbone become the warmed-up actor."""
    params, record = warmup_run.warm_up(self.c, self.task, self.actor_graphdef, self.state["actor"], log=log,
                                        verbose=self.is_chief, progress=progress)
    self._start_policy(params)
    self.meta.update(record)

  def init_from(self, source: str) -> None:
    """RL starts from `source`'s policy (`--config.init_from`: another run's step-0 checkpoint or a Hugging Face
    directory) instead of a warm-up; the optimizer state, data order and workdir stay this run's own."""
    self._start_policy(actor_checkpoint.load_initial_actor(source, self.c, self.arch, self.mesh))
    self.meta["init_from"] = str(source)
    if self.is_chief:
      print(f"RL starts from {source} (its step-0 policy); no warm-up", flush=True)

  def _start_policy(self, params) -> None:
    """`params` become the actor, the frozen reference and the critic's backbone (its value head kept);
    both optimizer states restart."""
    self.state["actor"] = params
    self.state["actor_opt"] = self._on_mesh(self.learner.actor_tx.init(params))
    if "ref" in self.state:
      self.state["ref"] = build.copy_tree(params)
    if "critic" in self.state:
      self.state["critic"] = build.critic_from_actor(self.state["critic"], params)
      self.state["critic_opt"] = self._on_mesh(self.learner.critic_tx.init(self.state["critic"]))

  def evaluate(self, sources: dict, *, max_examples: int | None) -> tuple[dict, list]:
    c = self.c
    return evaluation.evaluate_sources(
        self.sampler, self.state["actor"], self.task.env, self.task.tokenizer, self.task.render, sources,
        self.rollout_cfg, self.greedy, jax.random.key(c.seed + 7), batch_size=c.trainer.eval_batch_size,
        max_examples=max_examples, reward_style=c.algorithm.reward_style, slot_options=self.eval_slot_options())

  # ---- one RL step ------------------------------------------------------------------------------------

  def step(self, step: int) -> dict[str, Any]:
    """One RL step (see the module docstring); returns its metrics."""
    key = jax.random.fold_in(jax.random.wrap_key_data(self.state["rng"]), step)
    t0 = time.perf_counter()
    traj, scores = self.rollout(step, key)
    t1 = time.perf_counter()
    onpolicy = self.onpolicy_shortcut(step)
    batch, metrics = self.prepare_batch(traj, scores, old_logprobs=not onpolicy)
    metrics.update(self._update(step, batch, key, onpolicy=onpolicy))
    jax.block_until_ready(self.state["actor"])
    t2 = time.perf_counter()
    metrics.update({("reward" if k == "score" else k): float(np.mean([s[k] for s in scores]))
                    for k in evaluation.RECORD_METRICS})
    metrics.update(traj.metrics())
    metrics["time/rollout"] = t1 - t0  # its generation / tools / host split: rollout/time_*_s
    metrics["time/learner"] = t2 - t1
    return metrics

  def _update(self, step: int, batch: dict[str, jax.Array], key: jax.Array, *, onpolicy: bool = False
              ) -> dict[str, Any]:
    """ppo_epochs passes over shuffled mini-batches: critic first, then actor (after critic_warmup).

    `onpolicy`: the batch has no old log-probs (`prepare_batch(..., old_logprobs=False)`); the one actor update
    holds its own fixed (`Learner.actor_step`).
    """
    c = self.c
    if onpolicy and not self.onpolicy_shortcut(step):
      raise ValueError(f"step {step} is not an on-policy update (onpolicy_shortcut): its old log-probs need their "
                       "own pass")
    rows = batch["input_ids"].shape[0]  # global rows (all processes)
    mini_rows = rows // c.actor.num_mini_batches
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def record(m):
      for k, v in m.items():
        sums[k] = sums.get(k, 0.0) + float(v)
        counts[k] = counts.get(k, 0) + 1

    update_actor = step > c.trainer.critic_warmup  # steps count from 1: steps 1..critic_warmup train the critic only
    for epoch in range(c.actor.ppo_epochs):
      perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 1000 + epoch), rows))
      for start in range(0, rows, mini_rows):
        # Every process holds the same permutation; a replicated index keeps the gather a global computation.
        idx = place_on_mesh(np.sort(perm[start:start + mini_rows]), self.replicated)
        mini = self._take_rows(batch, idx)
        if c.algorithm.use_critic:
          self.state["critic"], self.state["critic_opt"], m = self.learner.critic_step(
              self.state["critic"], self.state["critic_opt"], mini,
              num_micro=batch_split.micro_batches(c, "critic", mini_rows, jax.device_count()))
          record(m)
        if update_actor:
          self.state["actor"], self.state["actor_opt"], m = self.learner.actor_step(
              self.state["actor"], self.state["actor_opt"], mini,
              num_micro=batch_split.micro_batches(c, "actor", mini_rows, jax.device_count()), onpolicy=onpolicy)
          record(m)
    out = {k: sums[k] / counts[k] for k in sums}
    for k in ("actor/skipped", "critic/skipped"):  # counts, not means
      if k in sums:
        out[k] = sums[k]
    return out

  # ---- the loop ---------------------------------------------------------------------------------------

  def run(self) -> RunResult:
    """Resumes from the latest checkpoint, or starts (warm-up or `init_from`, the held-out evaluation before RL,
    step 0), then runs the RL steps. SIGTERM or SIGINT saves the current step (of RL or of the warm-up) and
    returns a preempted result after one line saying how to resume."""
    c = self.c
    latest = self.checkpointer.latest_step()
    if self.is_chief and wandb_logging.enabled(c):  # before the warm-up: a W&B login or network error shows now
      self.wandb = wandb_logging.WandbSink.start(c, self.workdir, resumed=latest is not None)
    with Preemption() as preemption:
      try:
        start, final_eval = self._start(latest, preemption)
      except WarmupInterrupted as stop:
        self._stopped(preemption, f"saved warm-up step {stop.step} to {stop.directory}")
        return RunResult(step=0, preempted=True, summary={})
      step = self._rl_steps(start, preemption)
    if step < c.trainer.total_steps:
      self._stopped(preemption, f"saved step {step} to {self.checkpointer.directory}")
      return RunResult(step=step, preempted=True, summary={})
    final_eval = final_eval if step == start else self._final_validation
    summary = self.finish(final_eval)
    self.checkpointer.close()
    return RunResult(step=step, preempted=False, summary=summary)

  def _start(self, latest: int | None, preemption: Preemption) -> tuple[int, tuple[dict, list] | None]:
    """(the step RL starts after, the held-out evaluation of that policy where it ran): the latest checkpoint
    restored, or the policy RL starts from made (`init_from` or the warm-up, resumed from its own saves) and
    evaluated as step 0."""
    c = self.c
    if latest is not None:
      self._restore(latest)
      print(f"resuming from {self.checkpointer.directory} at step {latest}")
      return latest, None
    warmup_saves = None
    if c.init_from:
      self.init_from(c.init_from)
    elif c.sft.enabled:
      warmup_saves = WarmupCheckpoints(
          self.workdir, save_every=c.sft.save_every, preemption=preemption, on_mesh=self._on_mesh,
          fingerprint=warmup_checkpoints.warmup_fingerprint(c, self.fingerprint))
      if warmup_saves.latest is not None:
        print(f"resuming the warm-up from {warmup_saves.directory} at its step {warmup_saves.latest}")
      sft_log = reporting.sft_logger(sum(st.steps for st in sft_lib.parse_stages(c.sft.stages)),
                                     c.trainer.progress_bar and self.is_chief, initial=warmup_saves.latest or 0)
      try:
        self.warmup(sft_log, warmup_saves)
      finally:
        sft_log.close()
    warm_eval = self.evaluate(self.task.test, max_examples=c.trainer.eval_num_examples)
    self.meta["initial_eval"] = warm_eval[0]
    if self.is_chief:
      reporting.print_eval("held-out evaluation before RL", warm_eval[0])
    self._save(0, force=True)
    self.checkpointer.wait()
    if warmup_saves is not None:
      warmup_saves.discard()  # step 0 holds the warmed-up policy now
    return 0, warm_eval  # a warm-up-only run (total_steps = 0): its step-0 policy is the last one

  def _rl_steps(self, start: int, preemption: Preemption) -> int:
    """RL steps start + 1 .. total_steps with their metrics, validation and checkpoints; returns the last step
    taken (below total_steps when a signal stopped the run, its step saved). The last step's validation, where
    it is the held-out test split, is kept in `_final_validation` for `finish`."""
    c = self.c
    writer = MetricsWriter(self.workdir, start_step=start + 1, enabled=self.is_chief)
    progress = reporting.progress_bar(c.trainer.total_steps, start, c.trainer.progress_bar and self.is_chief)
    self._final_validation = None
    step = start
    while step < c.trainer.total_steps:
      step += 1
      metrics = self.step(step)
      if step % c.trainer.eval_every == 0 or step == c.trainer.total_steps:
        summaries, records = self.evaluate(self.task.validation, max_examples=c.trainer.eval_num_examples)
        if step == c.trainer.total_steps and self.task.validation is self.task.test:
          self._final_validation = summaries, records
        for source, summary in summaries.items():
          for k in ("em", "substring_acc", "f1", "format", "score", "tool_calls"):
            metrics[f"eval/{source}/{k}"] = summary[k]
          for k in summary:  # EM per question type, where the data set has types (the mixed world)
            if k.startswith("em_"):
              metrics[f"eval/{source}/{k}"] = summary[k]
      row = writer.write(step, metrics)
      if self.wandb is not None:
        self.wandb.log(row)
      reporting.update_progress(progress, row)
      saved = step % c.trainer.save_every == 0 or step == c.trainer.total_steps
      if saved:
        self._save(step)
        writer.sync()  # a bucket workdir holds every metrics row up to the checkpoint a rerun resumes from
      if step < c.trainer.total_steps and preemption.agreed():
        if not saved:
          self._save(step, force=True)
        break
    progress.close()
    writer.close()
    self.checkpointer.wait()
    return step

  def _stopped(self, preemption: Preemption, saved: str) -> None:
    """The one line a signal's stop prints (how to resume), W&B told, checkpoints closed."""
    if self.is_chief:
      print(f"{preemption.signal_name or 'a signal on another process'}: {saved}; rerun the same command (the same "
            f"--workdir) to resume", flush=True)
    if self.wandb is not None:
      self.wandb.preempted()
    self.checkpointer.close()

  def finish(self, final_eval: tuple[dict[str, Any], list[Any]] | None = None) -> dict[str, Any]:
    """Held-out evaluation after RL (`final_eval`: its (summaries, records) where it already ran: validation is
    the test split, or no RL step ran), the summary table, the curves PNG and the HF export."""
    c = self.c
    if final_eval is None:
      final_eval = self.evaluate(self.task.test, max_examples=c.trainer.eval_num_examples)
    final_eval, records = final_eval
    summary = {"before_rl": self.meta.get("initial_eval", {}), "after_rl": final_eval}
    if "sft_read_checks" in self.meta:
      summary["warmup_read_checks"] = self.meta["sft_read_checks"]
    if self.is_chief:
      (self.workdir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
      reporting.write_samples(self.workdir / "samples.jsonl", records[:50])
      print(reporting.summary_table(summary))
      curves = reporting.plot_curves(self.workdir)
      if self.wandb is not None:
        self.wandb.finish(summary, curves)
    if c.trainer.export_hf:
      model = nnx.merge(self.actor_graphdef, self.state["actor"])
      with workdir_lib.staged_dir(self.workdir / "hf_export") as export:  # a bucket's: uploaded at the end
        save_hf_checkpoint(model, export)  # collective gathers; process 0 writes
        if self.is_chief:
          self.task.tokenizer.save_pretrained(str(export))
    return summary


def prepare_config(c: config_dict.ConfigDict) -> None:
  """Resolves the model and data paths (`trainer.assets`) and validates the config, in place (train, dry run)."""
  assets.resolve(c)
  config_lib.validate(c)


def train(c: config_dict.ConfigDict, workdir: str | pathlib.Path) -> RunResult:
  """Validates the config and trains, after refusing a real preset on the CPU backend
  (`backend.check_accelerator`) and printing the backend line. A config with `dry_run` is sized instead by the
  CLI (`python -m agent_r1_jax.train`, or `sizing.dry_run` after `prepare_config`), never trained."""
  if c.dry_run:
    raise ValueError("dry_run=True sizes a run and trains nothing: run it with `python -m agent_r1_jax.train`, or "
                     "call agent_r1_jax.trainer.prepare_config(c) and then agent_r1_jax.sizing.dry_run(c)")
  wandb_logging.check_installed(c)  # a missing W&B package stops the run before assets are prepared
  workdir_lib.require_backend(workdir)  # a gs:// workdir without its package: one error before assets are prepared
  prepare_config(c)
  backend.check_accelerator(c)  # a real preset on a CPU-only jaxlib: refuse, naming the extra to install
  if jax.process_index() == 0:
    print(backend.describe_backend(), flush=True)
  return RLTrainer(c, workdir).run()
