"""Building a run's pieces from its config: mesh, models, sampler, learner, and what a checkpoint must match.

The trainer, the evaluation CLI and the dry run all construct through these functions, so a policy is
sampled and scored the same way wherever it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import config_dict

from agent_r1_jax.models import (Qwen2Config, Qwen2ForCausalLM, Qwen2ValueModel, abstract_model, load_hf_checkpoint,
                                 make_mesh, shard_model, state_shardings)
from agent_r1_jax.rollout import RolloutConfig
from agent_r1_jax.rollout.stop_strings import turn_stop_sequences
from agent_r1_jax.sampling import Sampler
from agent_r1_jax.learner import optimizer as optimizer_lib
from agent_r1_jax.learner import updates as learner_lib
from agent_r1_jax.learner.checks import loss_agg_horizon

_MODEL_FINGERPRINT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings")


# --------------------------------------------------------------------------------------------------
# Construction.


def build_mesh(c: config_dict.ConfigDict, devices: Sequence[Any] | None = None):
  """The (data, fsdp, tensor) mesh of `c.mesh` over `devices` (default: `jax.devices()`; the dry run passes a
  TPU topology's); fixed sizes whose product is below the device count use the first devices only (e.g. a
  1-device run on a host with 8), a -1 size fills all devices."""
  sizes = dict(c.mesh)
  devices = list(jax.devices() if devices is None else devices)
  if -1 in sizes.values():
    return make_mesh(**sizes, devices=devices)
  count = int(np.prod(list(sizes.values())))
  if count > len(devices):
    raise ValueError(f"mesh {sizes} needs {count} devices, {len(devices)} are available; change "
                     f"--config.mesh.*")
  return make_mesh(**sizes, devices=devices[:count])


def model_config(c: config_dict.ConfigDict, vocab_size: int) -> Qwen2Config:
  """The policy's architecture: from `model.path`'s config.json, else the tiny from-scratch shape."""
  if c.model.path:
    return Qwen2Config.from_pretrained_dir(c.model.path)
  m = c.model
  return Qwen2Config(vocab_size=vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                     num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
                     num_key_value_heads=m.num_key_value_heads, head_dim=m.hidden_size // m.num_attention_heads,
                     rope_theta=m.rope_theta, tie_word_embeddings=m.tie_word_embeddings,
                     max_position_embeddings=c.rollout.max_prompt_length + c.rollout.max_response_length)


def build_model(c: config_dict.ConfigDict, arch: Qwen2Config, mesh, *, head: str) -> nnx.Module:
  """Actor (`head="lm"`) or critic (`head="value"`): loaded from `model.path` or freshly initialised."""
  dtypes = dict(compute_dtype=getattr(jnp, c.model.compute_dtype), remat=c.model.remat,
                scan_layers=c.model.scan_layers, attention_chunk_size=c.model.attention_chunk_size)
  if c.model.path:
    return load_hf_checkpoint(c.model.path, dtype=c.model.param_dtype, mesh=mesh, head=head, seed=c.seed + 1,
                              **dtypes)
  cls = Qwen2ForCausalLM if head == "lm" else Qwen2ValueModel
  model = cls(arch, rngs=nnx.Rngs(c.seed + (0 if head == "lm" else 1)),
              param_dtype=getattr(jnp, c.model.param_dtype), **dtypes)
  return shard_model(model, mesh)


def abstract_params(c: config_dict.ConfigDict, arch: Qwen2Config, mesh, *, head: str) -> tuple[nnx.GraphDef, Any]:
  """(graphdef, parameter state of `jax.ShapeDtypeStruct`s placed by the sharding rules) of the actor
  (`head="lm"`) or critic (`head="value"`): shapes and shardings without memory, for restoring checkpoints
  into and for compiling programs ahead of time."""
  model = abstract_model(arch, head=head, param_dtype=getattr(jnp, c.model.param_dtype),
                         compute_dtype=getattr(jnp, c.model.compute_dtype), remat=c.model.remat,
                         scan_layers=c.model.scan_layers, attention_chunk_size=c.model.attention_chunk_size)
  graphdef, state = nnx.split(model)
  shardings = state_shardings(state, mesh)
  return graphdef, jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)


def rollout_config(c: config_dict.ConfigDict, tokenizer: Any) -> RolloutConfig:
  """The rollout limits of `c.rollout`; `<|endoftext|>` ends an episode (EpisodeStop.EOS)."""
  return dataclasses.replace(RolloutConfig.from_config(c.rollout),
                             end_of_text_ids=(int(tokenizer.convert_tokens_to_ids("<|endoftext|>")),))


def build_sampler(c: config_dict.ConfigDict, graphdef: nnx.GraphDef, tokenizer: Any, rcfg: RolloutConfig,
                  mesh) -> Sampler:
  """A turn ends on `<|im_end|>` or `<|endoftext|>`, and on `</tool_call>` unless several calls may share a
  turn (`env.parallel_tool_calls`); each as the tokenizer spells it (one id, or a sequence of ids plus its
  boundary-merged spellings, see `rollout.stop_strings`)."""
  stops = turn_stop_sequences(tokenizer, c.env.parallel_tool_calls)
  return Sampler(graphdef, max_cache_length=rcfg.cache_length, stop_sequences=stops,
                 pad_id=int(tokenizer.pad_token_id), cache_dtype=getattr(jnp, c.rollout.cache_dtype), mesh=mesh)


def fingerprint(c: config_dict.ConfigDict, arch: Qwen2Config) -> dict[str, Any]:
  """What must match for a checkpoint to be resumable into this config."""
  out = {f"model.{k}": getattr(arch, k) for k in _MODEL_FINGERPRINT_FIELDS}
  out.update({"algorithm.adv_estimator": c.algorithm.adv_estimator, "algorithm.use_critic": c.algorithm.use_critic,
              "model.param_dtype": c.model.param_dtype})
  return out


def needs_reference(c: config_dict.ConfigDict) -> bool:
  return bool(c.actor.use_kl_loss or c.algorithm.use_kl_in_reward)


def copy_tree(tree):
  return jax.tree.map(jnp.copy, tree)


def critic_from_actor(critic_params: nnx.State, actor_params: nnx.State) -> nnx.State:
  """The critic's parameters with its backbone replaced by a copy of the actor's (its value head kept):
  PPO's critic starts from the policy it judges, as the released scripts start it from the same checkpoint."""
  out = jax.tree.map(lambda x: x, critic_params)
  out["model"] = copy_tree(actor_params["model"])
  return out


def build_learner(c: config_dict.ConfigDict, actor_graphdef: nnx.GraphDef, critic_graphdef: nnx.GraphDef | None,
                  *, logprob_temperature: float) -> learner_lib.Learner:
  """The jitted learner with the actor's (and, with a critic, the critic's) optimizer and loss settings.

  Optimizer steps count mini-batch updates, so `warmup_steps` (in RL steps) is scaled by the updates per
  step. The critic's lr is constant after its own warm-up (0 steps in every preset: the released PPO script
  has none); `trainer.critic_warmup` (actor frozen) is the loop's business.
  """
  a, cr = c.actor, c.critic
  horizon = loss_agg_horizon(c)
  updates_per_step = a.ppo_epochs * a.num_mini_batches
  actor_tx = optimizer_lib.make_optimizer(lr=a.lr, warmup_steps=a.warmup_steps * updates_per_step,
                                          weight_decay=a.weight_decay, grad_clip=a.grad_clip,
                                          total_steps=c.trainer.total_steps * updates_per_step,
                                          schedule=a.lr_schedule)
  actor_cfg = learner_lib.ActorLossConfig(
      clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high, clip_ratio_c=a.clip_ratio_c,
      loss_agg_mode=a.loss_agg_mode, entropy_coef=a.entropy_coef, use_kl_loss=a.use_kl_loss,
      kl_loss_coef=a.kl_loss_coef, kl_loss_type=a.kl_loss_type, temperature=logprob_temperature,
      horizon=horizon, logits_chunk_size=c.model.logits_chunk_size)
  critic_tx = None
  if critic_graphdef is not None:
    critic_tx = optimizer_lib.make_optimizer(lr=cr.lr, warmup_steps=cr.warmup_steps * updates_per_step,
                                             weight_decay=cr.weight_decay, grad_clip=cr.grad_clip)
  return learner_lib.Learner(
      actor_graphdef, actor_tx, actor_cfg, critic_graphdef=critic_graphdef, critic_tx=critic_tx,
      critic_cfg=learner_lib.CriticLossConfig(clip_range_value=cr.clip_range_value, loss_agg_mode=cr.loss_agg_mode,
                                              horizon=horizon))
