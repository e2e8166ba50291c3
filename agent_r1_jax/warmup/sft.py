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

    "copy:800:32,1:200:32,2:150:32,all:550:16"
        800 steps of 32 copy drills (~80 tokens each: learn to copy a span just read),
        200 steps of 32 first turns (the question -> query copy),
        150 steps of 32 two-turn prefixes (reading the first observation),
        550 steps of 16 whole trajectories (or of single-turn naive-RAG examples, in batches of their own).

All stages run in order with one AdamW state and one schedule planned over every stage's steps: a
linear warm-up, then a cosine decay to 0 at the last step.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agent_r1_jax.data.sft import collate, first_turns
from agent_r1_jax.learner import updates as learner_lib
from agent_r1_jax.learner import optimizer as optimizer_lib


COPY_DRILL = -1  # `Stage.turns` of a copy-drill stage


class Progress(Protocol):
  """Where a warm-up phase resumes and what follows each of its updates (the trainer's checkpoints).

  Steps count optimizer updates over the whole warm-up: a phase of `steps` updates starting at `first_step`
  takes steps first_step + 1 .. first_step + steps. `checks` is the read checks recorded so far (`ReadCheck`
  dicts, in order), which a resumed warm-up reads instead of measuring again.
  """
  checks: list[dict[str, Any]]

  def resume(self, first_step: int, steps: int, params: nnx.State, opt_state: Any) -> tuple[nnx.State, Any, int]:
    """`(params, opt_state, done)`: the phase's state after its first `done` updates (0: the given state)."""

  def after_step(self, step: int, params: nnx.State, opt_state: Any, *, phase_end: bool) -> None:
    """Called after update `step` (a phase's last one with `phase_end`); may save, and may raise to stop."""


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
  """`SFTExample`s in the learner layout: `input_ids`/`attention_mask` [B, P+R], `response_ids`, `loss_mask`.

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
          "response_ids": c["response_ids"], "loss_mask": c["action_mask"].astype(np.float32)}


def sft_loss(params: nnx.State, graphdef: nnx.GraphDef, batch: dict[str, jax.Array], *,
             logits_chunk_size: int = 0) -> jax.Array:
  """Token-mean NLL of the action tokens (see module docstring); the LM head runs over blocks of
  `logits_chunk_size` response positions (0: all at once), as in the RL learner."""
  model = nnx.merge(graphdef, params)
  logp, _ = learner_lib.response_logprobs(model, batch, chunk_size=logits_chunk_size)
  mask = batch["loss_mask"]
  return -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)


class SupervisedTrainer:
  """Jitted steps of `tx` on the SFT loss; parameters and optimizer state are passed in and out."""

  def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation, *, logits_chunk_size: int = 0):
    self.graphdef = graphdef
    self.tx = tx
    self.chunk = logits_chunk_size
    self.step = jax.jit(self._step, donate_argnums=(0, 1))

  def _step(self, params, opt_state, batch):
    loss, grads = jax.value_and_grad(sft_loss)(params, self.graphdef, batch, logits_chunk_size=self.chunk)
    params, opt_state, upd = optimizer_lib.apply_update(self.tx, params, opt_state, grads)
    return params, opt_state, {"sft/loss": loss, "sft/grad_norm": upd["grad_norm"]}


class BatchStream:
  """Batches of `batch_size` examples in the learner layout, each drawn from ONE of `pools` (chosen with
  probability proportional to its size), in shuffled epochs per pool: pools of very different lengths (e.g.
  naive-RAG prompts and tool-loop episodes) never share a batch, so no batch pads to the other's length.

  With `length_group = g > 0` a pool's batches come from windows of its shuffled order: the next `g *
  batch_size` examples are sorted by length (prompt + response tokens), cut into `g` batches of neighbours in
  length, and those batches are served in a random order. Every example is still seen once per epoch; a batch
  then pads to the length of its own examples, not to the longest of `batch_size` random ones. On the mixed
  world's warm-up (episodes of 2 to 5 turns, 16 to 466 response tokens) random batches of 16 pad the episodes to
  2.5x their tokens (bench/sft.py). `length_group = 0` draws exactly the ungrouped batches.
  """

  def __init__(self, pools: Sequence[Sequence[Any]], batch_size: int, rng: np.random.Generator, layout: dict,
               length_group: int = 0):
    self.pools = [pool for pool in pools if len(pool)]
    sizes = np.array([len(pool) for pool in self.pools], np.float64)
    self.weights = sizes / sizes.sum()
    self.batch_size, self.rng, self.layout, self.length_group = batch_size, rng, layout, length_group
    self.orders: list[list[int]] = [[] for _ in self.pools]
    self.ready: list[list[list[int]]] = [[] for _ in self.pools]  # grouped batches not yet served, per pool
    self.lengths = [np.array([len(ex.prompt_ids) + len(ex.response_ids) for ex in pool]) if length_group else None
                    for pool in self.pools]

  def _take(self, k: int, count: int) -> list[int]:
    """The next `count` indices of pool k's shuffled epochs."""
    order = self.orders[k]
    while len(order) < count:
      order.extend(self.rng.permutation(len(self.pools[k])).tolist())
    chosen, self.orders[k] = order[:count], order[count:]
    return chosen

  def next_indices(self) -> tuple[int, list[int]]:
    """(pool, example indices) of the next batch."""
    k = int(self.rng.choice(len(self.pools), p=self.weights)) if len(self.pools) > 1 else 0
    if not self.length_group:
      return k, self._take(k, self.batch_size)
    if not self.ready[k]:
      window = self._take(k, self.length_group * self.batch_size)
      window.sort(key=lambda i: self.lengths[k][i])  # stable: ties keep the shuffled order
      groups = [window[j:j + self.batch_size] for j in range(0, len(window), self.batch_size)]
      self.ready[k] = [groups[j] for j in self.rng.permutation(len(groups))]
    return k, self.ready[k].pop()

  def next(self) -> dict[str, np.ndarray]:
    k, chosen = self.next_indices()
    return learner_batch([self.pools[k][i] for i in chosen], **self.layout)

  def skip(self) -> None:
    """Draws the next batch's indices without building it: a resumed phase replays the batches it trained on
    before the interruption, so its stream goes on exactly where it stopped."""
    self.next_indices()


def run_sft(graphdef: nnx.GraphDef, params: nnx.State, examples: Sequence[Any], *, stages: Sequence[Stage],
            lr: float, warmup_steps: int, weight_decay: float, prompt_length: int, response_length: int,
            pad_id: int, seed: int | tuple[int, ...], length_multiple: int | None = 64, log_fn=None,
            drill_examples: Sequence[Any] = (), single_turn_examples: Sequence[Any] = (),
            reading_examples: Sequence[Any] = (), adam_b2: float = 0.999, logits_chunk_size: int = 0,
            length_group: int = 0, first_step: int = 0, progress: Progress | None = None) -> nnx.State:
  """Runs the warm-up `stages` in order and returns the trained parameters (see the module docstring).

  Copy-drill stages draw shuffled epochs of `drill_examples` (`data.synthetic.copy_drill`), the others of
  `examples` cut to the stage's turns; whole-trajectory (`all`) stages also draw `single_turn_examples`
  (naive-RAG prompts answered in one turn: no tool loop whose first turns an earlier stage could teach) and
  `reading_examples` (episodes whose first turn is context, action mask 0: `first_turns` cannot cut them like
  the others), each in batches of their own. Each batch is padded only to its own length bucket
  (`length_multiple`; None pads to the full P and R). AdamW uses `adam_b2` as its second-moment decay.
  `log_fn(step, metrics)` receives the warm-up's step (0-based, `first_step` + this phase's), the loss, the
  gradient norm and the stage's `sft/turns` (-1 for the copy drill). `seed` (an int or a tuple of ints) seeds the
  batch draws. With `progress` the phase resumes where `progress.resume` says: the batch draws of the updates
  already taken are replayed (indices only, no update), so a resumed phase trains on exactly the batches an
  uninterrupted one does; `progress.after_step` follows every update.
  `logits_chunk_size` bounds the LM head's `[B, C, V]` block (see `sft_loss`). `length_group` > 0 cuts each
  pool's batches out of length-sorted windows of that many batches (`BatchStream`).
  """
  if not examples:
    raise ValueError("supervised warm-up has no examples (the expert produced no grounded trajectory)")
  if any(stage.is_copy_drill and stage.steps for stage in stages) and not drill_examples:
    raise ValueError("a 'copy' warm-up stage needs copy-drill examples (drill_examples)")
  layout = dict(prompt_length=prompt_length, response_length=response_length, pad_id=pad_id,
                multiple=length_multiple)
  rng = np.random.default_rng(seed)
  schedule = optimizer_lib.lr_schedule(lr, warmup_steps, total_steps=sum(s.steps for s in stages),
                                      schedule="cosine")
  tx = optimizer_lib.clipped_adamw(schedule, weight_decay=weight_decay, grad_clip=1.0, b2=adam_b2)
  trainer = SupervisedTrainer(graphdef, tx, logits_chunk_size=logits_chunk_size)
  opt_state = tx.init(params)
  total = sum(stage.steps for stage in stages)
  done = 0
  if progress is not None:
    params, opt_state, done = progress.resume(first_step, total, params, opt_state)
  step = 0
  for stage in stages:
    if stage.is_copy_drill:
      pools = [drill_examples]
    else:
      whole = stage.turns == 0
      pools = [[first_turns(ex, stage.turns) for ex in examples], single_turn_examples if whole else (),
               reading_examples if whole else ()]
    batches = BatchStream(pools, stage.batch_size, rng, layout, length_group=length_group)
    for _ in range(stage.steps):
      if step < done:  # taken before an interruption
        batches.skip()
        step += 1
        continue
      params, opt_state, metrics = trainer.step(params, opt_state, batches.next())
      if log_fn is not None:
        log_fn(first_step + step, dict(metrics, **{"sft/turns": stage.turns}))
      step += 1
      if progress is not None:
        progress.after_step(first_step + step, params, opt_state, phase_end=step == total)
  return params
