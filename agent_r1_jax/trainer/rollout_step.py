"""A step's learner batch: the rollout on the step's prompts, its scores, and the learner's inputs built from them.

`RLTrainer` (trainer/loop.py) gets these methods from `RolloutStepMixin`; the loop then runs the updates on
the batch. They read the trainer's components: `c`, `task`, `data_iter`, `prompts_per_process`, `sampler`,
`rollout_cfg`, `sampling`, `state` (actor, and ref / critic when present), `learner`, `batch_sharding`,
`kl_ctrl` (whose coefficient `prepare_batch` updates), `adv_params`, `_kl_penalty` and `_advantages`.

rollout(step, key): the next `batch_size / processes` prompts, `n_samples` episodes each (their group ids offset
by step and process, so they are unique over the run and the processes), with the current actor parameters and
`fold_in(key, 0)`, on the configured engine (`rollout.engine`: the lockstep driver in waves, or the slot
engine, its options from `rollout_sizing.slot_engine_options`); returns the trajectories (this process's rows) and
one score dict per row. eval_slot_options(): the periodic evaluation's engine, the same function's options for
`trainer.eval_batch_size` (None: the lockstep driver).

prepare_batch(traj, scores): the learner batch of `B` global rows (all processes), prompt width `P` and response
width `R` (the layout in learner/updates.py), in this order:

    trim              P, R cut to the longest prompt / response over all processes, rounded up to
                      `trainer.length_multiple` (at most the rollout limits): only padding columns go
    rewards  [B, R]   r_t = the row's score on its last action token (+ per-turn process rewards)
    masks    [B, R]   loss_mask, advantage_mask = the action or the response mask (`algorithm.loss_mask`,
                      `algorithm.advantage_mask`)
    old_logprobs      log pi_theta(a_t | s_t) from a learner pass, with `logprob_drift_max` and `entropy` over
                      the action tokens; in an on-policy step (`onpolicy_shortcut`) not computed: the batch
                      carries `sampler_logprobs` and `action_mask` instead and the update reports them
    ref_logprobs      log pi_ref(a_t | s_t) of the frozen reference, when a KL term is on
    KL in reward      r_t <- r_t - beta * kl_t on action tokens (`use_kl_in_reward`), then beta updated from the
                      batch's mean KL
    old_values        V(s_t) of the critic (PPO)
    advantages, returns [B, R]  the registered estimator (`algorithm.adv_estimator`) on the rewards over the
                      advantage mask, with the group ids (GRPO-style) or the values (GAE)

All arrays are on device, rows sharded over the mesh's (data, fsdp) axes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from agent_r1_jax import rl
from agent_r1_jax.rollout import evaluation, run_episodes_in_waves, run_slot_episodes
from agent_r1_jax.sampling.multihost import agreed_max
from agent_r1_jax.learner import batch_split
from agent_r1_jax.sizing import rollout_sizing
from agent_r1_jax.learner import updates as learner_lib


class RolloutStepMixin:
  """The rollout of one RL step and the learner batch built from it; mixed into `RLTrainer` (see the module
  docstring for the trainer attributes these methods read)."""

  def _masks(self, dev: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(loss_mask, advantage_mask), float32 `[B, R]`: the action or the response mask, as the config picks."""
    pick = {"action": dev["action_mask"], "response": dev["response_mask"]}
    return (pick[self.c.algorithm.loss_mask].astype(jnp.float32),
            pick[self.c.algorithm.advantage_mask].astype(jnp.float32))

  def rollout(self, step: int, key: jax.Array):
    """Samples `n_samples` episodes for each of the next `batch_size` training prompts with the configured engine
    (`rollout.engine`: the lockstep driver in waves, or the slot engine) and scores them."""
    c = self.c
    examples = next(self.data_iter)
    episodes = dict(samples_per_prompt=c.rollout.n_samples, ground_truths=[list(ex["answers"]) for ex in examples],
                    data_sources=[ex["data_source"] for ex in examples],
                    group_offset=(step * jax.process_count() + jax.process_index()) * self.prompts_per_process,
                    check_env=False)
    args = (self.sampler, self.state["actor"], self.task.env, self.task.tokenizer,
            [self.task.render(ex) for ex in examples], self.rollout_cfg, self.sampling, jax.random.fold_in(key, 0))
    if c.rollout.engine == "slots":
      traj = run_slot_episodes(
          *args, **rollout_sizing.slot_engine_options(c, jax.device_count(), jax.process_count()), **episodes)
    else:
      traj = run_episodes_in_waves(
          *args, prompts_per_wave=rollout_sizing.prompts_per_wave(c, jax.device_count(), jax.process_count()),
          **episodes)
    return traj, evaluation.score_batch(traj, reward_style=c.algorithm.reward_style)

  def eval_slot_options(self) -> dict[str, int] | None:
    """The periodic evaluation's engine (`rollout.engine`): the slot engine's options for `trainer.eval_batch_size`
    prompts per rollout (`rollout_sizing.evaluation_slot_options`), or None for the lockstep driver."""
    return rollout_sizing.evaluation_slot_options(self.c, jax.device_count(), jax.process_count(),
                                                  self.c.trainer.eval_batch_size)

  def _trim(self, traj):
    """`traj` cut to its longest prompt / response (over all processes), rounded up to
    `trainer.length_multiple`: the learner's passes then cost what the rows need, not the rollout limits."""
    multiple = self.c.trainer.length_multiple
    if not multiple:
      return traj
    need_p, need_r = agreed_max([traj.prompt_mask.sum(axis=1).max(), traj.response_lengths.max()])
    return traj.trimmed(learner_lib.bucket_length(int(need_p), multiple, traj.prompt_length),
                        learner_lib.bucket_length(int(need_r), multiple, traj.response_length))

  def onpolicy_shortcut(self, step: int) -> bool:
    """Whether step `step`'s actor update takes its old log-probs from its own forward (`Learner.actor_step`
    with `onpolicy`) instead of a separate pass before it.

    Only where nothing else needs them first: one epoch of one mini-batch (the update then sees exactly the
    parameters that sampled the batch), no KL penalty in the reward (it reads them to build the rewards and
    so the advantages) and an actor that is updated at this step (during the critic warm-up the pass is the
    only source of the drift and entropy metrics).
    """
    c = self.c
    return bool(c.actor.reuse_onpolicy_logprobs and c.actor.ppo_epochs == 1 and c.actor.num_mini_batches == 1
                and not c.algorithm.use_kl_in_reward and step > c.trainer.critic_warmup)

  def prepare_batch(self, traj, scores: list[dict], *, old_logprobs: bool = True
                    ) -> tuple[dict[str, jax.Array], dict[str, Any]]:
    """Learner inputs for a scored rollout: masks, old/ref log-probs, (KL-penalised) rewards, values,
    advantages and returns, all on device with the batch sharded over (data, fsdp).

    `old_logprobs=False` (an on-policy step, `onpolicy_shortcut`): no old-log-prob pass; the batch carries the
    sampler's log-probs and the action mask instead, from which the update reports the drift and entropy.
    """
    c = self.c
    traj = self._trim(traj)
    token_rewards = traj.token_level_rewards([s["score"] for s in scores])
    rl.check_inputs(token_rewards, traj.action_mask, group_ids=traj.group_ids)
    dev = traj.to_device(self.batch_sharding, extra={"token_level_rewards": token_rewards})
    loss_mask, adv_mask = self._masks(dev)
    batch = {"input_ids": dev["input_ids"], "attention_mask": dev["attention_mask"],
             "response_ids": dev["response_ids"], "loss_mask": loss_mask, "advantage_mask": adv_mask}
    rows = batch["input_ids"].shape[0]  # global rows (all processes)
    actor_micro = batch_split.micro_batches(c, "actor", rows, jax.device_count())
    action = dev["action_mask"].astype(jnp.float32)
    metrics: dict[str, Any] = {}
    if old_logprobs:
      batch["old_logprobs"], entropy = self.learner.logprobs(self.state["actor"], batch, num_micro=actor_micro)
      metrics.update(learner_lib.rollout_logprob_metrics(batch["old_logprobs"], entropy, dev["sampler_logprobs"],
                                                         action))
    elif c.algorithm.use_kl_in_reward:
      raise ValueError("the KL penalty in the reward reads the old log-probs: prepare_batch needs old_logprobs=True")
    else:
      batch["sampler_logprobs"], batch["action_mask"] = dev["sampler_logprobs"], action
    if "ref" in self.state:
      batch["ref_logprobs"], _ = self.learner.logprobs(self.state["ref"], batch, num_micro=actor_micro,
                                                         with_entropy=False)
    rewards = dev["token_level_rewards"]
    if c.algorithm.use_kl_in_reward:
      rewards, kl = self._kl_penalty(rewards, batch["old_logprobs"], batch["ref_logprobs"], action, self.kl_ctrl.value,
                                     kind=c.algorithm.kl_penalty)
      metrics["kl_in_reward"] = kl.value()
      metrics["kl_coef"] = self.kl_ctrl.value
      self.kl_ctrl.update(float(kl.value()), rows)
    values = None
    if c.algorithm.use_critic:
      values = self.learner.values(self.state["critic"], batch,
                                   num_micro=batch_split.micro_batches(c, "critic", rows, jax.device_count()))
      batch["old_values"] = values
    batch["advantages"], batch["returns"] = self._advantages(
        c.algorithm.adv_estimator, rewards, adv_mask, values=values, group_ids=dev["group_ids"],
        params=self.adv_params)
    return batch, metrics
