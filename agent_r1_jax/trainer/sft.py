"""Supervised warm-up on the scripted expert's trajectories (the tiny preset starts from random weights).

Examples are laid out exactly like a learner batch (prompt left-padded to P, response right-padded to R), and
the loss is the token-mean negative log-likelihood over ACTION tokens only:

    L = - sum_{b,t} m_bt log pi(y_bt | y_<t) / sum_{b,t} m_bt,      m = action mask (observations excluded)

so warm-up, like RL, never trains the model to produce tool output.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agent_r1_jax.data.sft import collate
from agent_r1_jax.trainer import learner as learner_lib


def learner_batch(examples: Sequence[Any], prompt_length: int, response_length: int,
                  pad_id: int, *, multiple: int | None = None) -> dict[str, np.ndarray]:
  """`SFTExample`s in the learner layout: `input_ids`/`attention_mask` [B, P+R], `responses`, `loss_mask`.

  Built on `data.collate` (the rollout's layout); a response longer than R is cut on the right. With
  `multiple`, P and R shrink to the batch's longest prompt / response rounded up to that multiple
  (`learner.bucket_length`); the loss is unchanged because the dropped columns are all padding.
  """
  if multiple:
    prompt_length = learner_lib.bucket_length(max(len(e.prompt_ids) for e in examples), multiple, prompt_length)
    response_length = learner_lib.bucket_length(max(len(e.response_ids) for e in examples), multiple, response_length)
  c = collate(examples, prompt_length=prompt_length, response_length=response_length, pad_id=pad_id)
  ids = np.concatenate([c["prompt_ids"], c["response_ids"]], axis=1)
  return {"input_ids": ids, "attention_mask": np.concatenate([c["prompt_mask"], c["response_mask"]], axis=1),
          "responses": c["response_ids"], "loss_mask": c["action_mask"].astype(np.float32)}


def sft_loss(params: nnx.State, graphdef: nnx.GraphDef, batch: dict[str, jax.Array]) -> jax.Array:
  """Token-mean NLL of the action tokens (see module docstring)."""
  model = nnx.merge(graphdef, params)
  logp, _ = learner_lib.response_log_probs(model, batch)
  mask = batch["loss_mask"]
  return -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)


class SupervisedTrainer:
  """Jitted AdamW steps on the SFT loss; parameters and optimizer state are passed in and out."""

  def __init__(self, graphdef: nnx.GraphDef, *, lr: float, warmup_steps: int, total_steps: int,
               weight_decay: float, grad_clip: float = 1.0):
    self.graphdef = graphdef
    self.tx = learner_lib.make_optimizer(lr=lr, warmup_steps=warmup_steps, weight_decay=weight_decay,
                                         grad_clip=grad_clip, total_steps=total_steps, schedule="cosine")
    self.step = jax.jit(self._step, donate_argnums=(0, 1))

  def _step(self, params, opt_state, batch):
    loss, grads = jax.value_and_grad(sft_loss)(params, self.graphdef, batch)
    params, opt_state, upd = learner_lib.apply_update(self.tx, params, opt_state, grads)
    return params, opt_state, {"sft/loss": loss, "sft/grad_norm": upd["grad_norm"]}


def run_sft(graphdef: nnx.GraphDef, params: nnx.State, examples: Sequence[Any], *, steps: int, batch_size: int,
            lr: float, warmup_steps: int, weight_decay: float, prompt_length: int, response_length: int,
            pad_id: int, seed: int, length_multiple: int | None = 64, log_fn=None) -> nnx.State:
  """Runs `steps` warm-up updates over shuffled epochs of `examples`; returns the trained parameters.

  Each batch is padded only to its own length bucket (`length_multiple`; None pads to the full P and R).
  """
  if not examples:
    raise ValueError("supervised warm-up has no examples (the expert produced no grounded trajectory)")
  trainer = SupervisedTrainer(graphdef, lr=lr, warmup_steps=warmup_steps, total_steps=steps,
                              weight_decay=weight_decay)
  opt_state = trainer.tx.init(params)
  rng = np.random.default_rng(seed)
  order: list[int] = []
  for step in range(steps):
    if len(order) < batch_size:
      order.extend(rng.permutation(len(examples)).tolist())
    chosen, order = order[:batch_size], order[batch_size:]
    batch = learner_batch([examples[i] for i in chosen], prompt_length, response_length, pad_id,
                          multiple=length_multiple)
    params, opt_state, metrics = trainer.step(params, opt_state, batch)
    if log_fn is not None:
      log_fn(step, metrics)
  return params
