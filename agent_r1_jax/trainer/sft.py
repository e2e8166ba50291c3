"""Supervised warm-up on the scripted expert's trajectories (the tiny preset starts from random weights).

Examples are laid out exactly like a learner batch (prompt left-padded to P, response right-padded to R), and
the loss is the token-mean negative log-likelihood over ACTION tokens only:

    L = - sum_{b,t} m_bt log pi(y_bt | y_<t) / sum_{b,t} m_bt,      m = action mask (observations excluded)

so warm-up, like RL, never trains the model to produce tool output.

Warm-up runs in stages of growing length (`parse_stages`): a model trained from scratch must first learn to
copy names (from the question into its thought and query, from an observation into the next thought), and it
learns that far faster on short sequences. Stage `k` trains on every trajectory cut after its first k
assistant turns (`data.sft.first_turns`: a prefix, so the loss on those tokens is unchanged); a `copy` stage
trains on copy-drill examples instead (`data.synthetic.copy_drill`: repeat a list of random names), e.g.

    "copy:300:64,1:200:32,2:150:32,all:550:16"
        300 steps of 64 copy drills (~80 tokens each: learn to copy a span just read),
        200 steps of 32 first turns (the question -> query copy),
        150 steps of 32 two-turn prefixes (reading the first observation),
        550 steps of 16 whole trajectories,

under one warm-up + cosine learning-rate schedule over all 1,200 steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agent_r1_jax.data.sft import collate, first_turns
from agent_r1_jax.trainer import learner as learner_lib


COPY_DRILL = -1  # `Stage.turns` of a copy-drill stage


@dataclasses.dataclass(frozen=True)
class Stage:
  """`steps` updates on batches of `batch_size` trajectories cut after `turns` assistant turns (0 = whole;
  `COPY_DRILL`: copy-drill examples instead of trajectories)."""
  turns: int
  steps: int
  batch_size: int

  @property
  def is_copy_drill(self) -> bool:
    return self.turns == COPY_DRILL


def _parse_stage(item: str) -> Stage | None:
  """One `turns:steps:batch_size` entry, or None when it is malformed or out of range."""
  fields = item.split(":")
  if len(fields) != 3 or not all(f.isdigit() for f in fields[1:]):
    return None
  turns, steps, batch = fields
  named = {"all": 0, "copy": COPY_DRILL}
  if turns not in named and not (turns.isdigit() and int(turns) >= 1):
    return None
  stage = Stage(turns=named.get(turns) if turns in named else int(turns), steps=int(steps), batch_size=int(batch))
  return stage if stage.batch_size >= 1 else None


def parse_stages(spec: str) -> list[Stage]:
  """`"turns:steps:batch_size,..."` (turns an integer >= 1, `all` or `copy`) -> stages, with one clear error."""
  stages = []
  for item in (part.strip() for part in spec.split(",") if part.strip()):
    stage = _parse_stage(item)
    if stage is None:
      raise ValueError(f"sft.stages entry {item!r} must be turns:steps:batch_size with turns >= 1, 'all' or "
                       f"'copy', steps >= 0 and batch_size >= 1 (e.g. 'copy:200:64,1:300:32,all:150:16')")
    stages.append(stage)
  if not stages:
    raise ValueError("sft.stages is empty; give at least one turns:steps:batch_size entry (e.g. 'all:150:16')")
  return stages


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


def run_sft(graphdef: nnx.GraphDef, params: nnx.State, examples: Sequence[Any], *, stages: Sequence[Stage],
            lr: float, warmup_steps: int, weight_decay: float, prompt_length: int, response_length: int,
            pad_id: int, seed: int, length_multiple: int | None = 64, log_fn=None,
            drill_examples: Sequence[Any] = ()) -> nnx.State:
  """Runs the warm-up `stages` in order over shuffled epochs of `examples`; returns the trained parameters.

  Copy-drill stages draw from `drill_examples` instead (`data.synthetic.copy_drill`). Each batch is padded
  only to its own length bucket (`length_multiple`; None pads to the full P and R). `log_fn(step, metrics)`
  receives the global step (0 .. total - 1) and the stage's `sft/turns` (-1 for the copy drill).
  """
  if not examples:
    raise ValueError("supervised warm-up has no examples (the expert produced no grounded trajectory)")
  if any(stage.is_copy_drill and stage.steps for stage in stages) and not drill_examples:
    raise ValueError("a 'copy' warm-up stage needs copy-drill examples (drill_examples)")
  total = sum(stage.steps for stage in stages)
  trainer = SupervisedTrainer(graphdef, lr=lr, warmup_steps=warmup_steps, total_steps=total,
                              weight_decay=weight_decay)
  opt_state = trainer.tx.init(params)
  rng = np.random.default_rng(seed)
  step = 0
  for stage in stages:
    pool = list(drill_examples) if stage.is_copy_drill else [first_turns(ex, stage.turns) for ex in examples]
    order: list[int] = []
    for _ in range(stage.steps):
      if len(order) < stage.batch_size:
        order.extend(rng.permutation(len(pool)).tolist())
      chosen, order = order[:stage.batch_size], order[stage.batch_size:]
      batch = learner_batch([pool[i] for i in chosen], prompt_length, response_length, pad_id,
                            multiple=length_multiple)
      params, opt_state, metrics = trainer.step(params, opt_state, batch)
      if log_fn is not None:
        log_fn(step, dict(metrics, **{"sft/turns": stage.turns}))
      step += 1
  return params
