"""Learner throughput vs the same model, batch and loss in `transformers` PyTorch, and the on-policy shortcut.

Not a test: prints tokens/s measured in this run on this machine, for two passes of the actor:

  * update:   one `Learner.actor_step` (forward, backward over every micro-batch with gradient
              accumulation, global-norm clipping, one AdamW step) against the same in PyTorch
              (`loss.backward()` per micro-batch, `clip_grad_norm_`, `torch.optim.AdamW.step`);
  * log-prob: one `Learner.logprobs` pass (response log-probs and entropy, micro-batch by micro-batch)
              against the same forward under `torch.inference_mode`.

Target: ours >= 1x PyTorch on both passes, at both shapes.

Then the learner's share of an on-policy RL step (one epoch, one mini-batch, KL loss to a reference: GRPO's
defaults), ours only, both ways in the same run: with the separate old-log-prob pass (old log-probs pass +
reference log-probs pass + update fed the pass's output) and with the shortcut (reference pass + an update that
holds its own log-probs fixed, `actor_step(..., onpolicy=True)`); the ratio is the time saved by the shortcut.

Both sides hold the same random weights (our model exported with `save_hf_checkpoint`, loaded by
`transformers.AutoModelForCausalLM.from_pretrained` in float32), read the same batch (left-padded prompts,
right-padded responses with action/observation segments, the same masks) and minimise the same objective:
PPO clipped surrogate (clip 0.2, dual clip 3.0) + 0.001 * low_var_kl (k3) to the reference, token-mean over
the loss mask; the entropy is computed and reported but not in the loss (entropy_coef = 0). Log-probs of
response token j come from the hidden state at P + j - 1 at temperature 1, and on both sides the LM head is
applied to the response positions only. Before timing, the bench prints the largest log-prob and entropy
difference between the two sides and the first update's pre-clip gradient norm of each, so the comparison
is of the same computation.

Timing: every callable is warmed up once (compilation, first-call allocations), then the two sides are run
alternately `--repeats` times; the table reports the median (each detail line also gives the fastest
repeat); tokens/s = rows * (P + R) / seconds, padding included, as both sides compute it. PyTorch uses
`torch.set_num_threads(os.cpu_count())`; XLA:CPU uses all cores by default. The float32 matmul rate and the
load average are printed because these shared machines differ up to 4x, and so is the CPU share other
processes used while each pass was timed: PyTorch's OpenMP threads slow down far more than XLA's under
contention, so only a run where that share stays near 0% compares the two fairly.

  python bench/learner.py                          # both shapes
  python bench/learner.py --shapes=tiny --repeats=5
  python bench/learner.py --smoke                  # a 2 x 32 model, 4 rows, one repeat: that it runs
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
try:
  import torch
except ImportError:  # `pip install -e .` does not install it: the comparison needs the test requirements
  sys.exit("bench/learner.py compares against PyTorch, which `pip install -e .` does not install: install the CPU "
           "build (pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu) or the test "
           "requirements. For this machine's float32 matmul rate alone: python bench/matmul_rate.py")
import transformers
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM, qwen2_5_0_5b, save_hf_checkpoint  # noqa: E402
from agent_r1_jax.learner import updates as lrn  # noqa: E402
from agent_r1_jax.learner import optimizer as optimizer_lib  # noqa: E402

LR = 1e-6  # small, so repeated updates leave the weights (and so the work) essentially unchanged
CLIP, DUAL_CLIP, KL_COEF = 0.2, 3.0, 0.001


@dataclasses.dataclass(frozen=True)
class Shape:
  """One benchmarked setting: model, batch, micro-batch, and our LM-head block sizes to try."""
  name: str
  config: Qwen2Config
  rows: int
  prompt: int        # P
  response: int      # R
  micro_rows: int
  logits_chunks: tuple[int, ...]
  attention_chunk: int = 512  # the trainer's default (model.attention_chunk_size)


def shapes() -> dict[str, Shape]:
  """The tiny preset (R = 256, P = 32: a typical batch after trimming to its longest row; the preset's caps
  are P = 64, R = 384), the Qwen2.5-0.5B shape cut to 2 layers, and the smoke shape (seconds: that the bench
  runs, not a measurement)."""
  smoke = Qwen2Config.tiny(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
  tiny = Qwen2Config.tiny(vocab_size=1600, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
  qwen = dataclasses.replace(qwen2_5_0_5b(), num_hidden_layers=2)
  return {
      "tiny": Shape("tiny (4 x 128, vocab 1600)", tiny, rows=40, prompt=32, response=256, micro_rows=8,
                    logits_chunks=(256,)),
      "qwen0.5b": Shape("Qwen2.5-0.5B shape, 2 layers", qwen, rows=4, prompt=64, response=192, micro_rows=2,
                        logits_chunks=(0, 128)),
      "smoke": Shape("smoke (2 x 32, vocab 64)", smoke, rows=4, prompt=8, response=16, micro_rows=2,
                     logits_chunks=(0,)),
  }


# --------------------------------------------------------------------------------------------------
# Machine and timing helpers.


def load() -> str:
  """The 1/5/15-minute load averages as text."""
  return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def matmul_gflops(n: int = 2048, repeats: int = 10) -> tuple[float, float]:
  """GFLOP/s of an n x n float32 matmul: jitted jnp (median of repeats) and torch (same), for reference."""
  a = jnp.asarray(np.random.RandomState(0).randn(n, n).astype(np.float32))
  mm = jax.jit(jnp.matmul)
  mm(a, a).block_until_ready()
  t_jax = median_time(lambda: mm(a, a).block_until_ready(), repeats)
  ta = torch.from_numpy(np.array(a))
  torch.matmul(ta, ta)
  t_torch = median_time(lambda: torch.matmul(ta, ta), repeats)
  flops = 2.0 * n ** 3
  return flops / t_jax / 1e9, flops / t_torch / 1e9


class ForeignCpu:
  """Share of the machine's CPU time used by other processes between `start()` and `share()`.

  Busy time of all CPUs from /proc/stat minus this process's own user + system time (all its threads), as a
  fraction of wall time x CPUs; None where /proc/stat is unreadable. The load average cannot show this: the
  bench's own threads keep it near the core count either way.
  """

  def start(self) -> None:
    self._begin = (self._busy(), self._own(), time.perf_counter())

  def share(self) -> float | None:
    busy, own, wall = self._busy(), self._own(), time.perf_counter()
    if busy is None or self._begin[0] is None:
      return None
    foreign = (busy - self._begin[0]) - (own - self._begin[1])
    return max(0.0, foreign / ((wall - self._begin[2]) * os.cpu_count()))

  @staticmethod
  def _busy() -> float | None:
    try:
      with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
      return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

  @staticmethod
  def _own() -> float:
    t = os.times()
    return t.user + t.system


def median_time(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


@dataclasses.dataclass(frozen=True)
class Timing:
  """Median and fastest of the repeats, in seconds."""
  median: float
  best: float
  foreign: float | None = None  # CPU share other processes used meanwhile (`ForeignCpu`)


def timed_pair(fn_a, fn_b, repeats: int) -> tuple[Timing, Timing]:
  """Wall times of two callables run alternately (a, b, a, b, ...) after one warm-up call each.

  Alternating keeps both sides under the same background load on a shared machine.
  """
  fn_a()
  fn_b()
  t_a, t_b = [], []
  others = ForeignCpu()
  others.start()
  for _ in range(repeats):
    start = time.perf_counter()
    fn_a()
    t_a.append(time.perf_counter() - start)
    start = time.perf_counter()
    fn_b()
    t_b.append(time.perf_counter() - start)
  foreign = others.share()
  return (Timing(statistics.median(t_a), min(t_a), foreign), Timing(statistics.median(t_b), min(t_b), foreign))


def report(what: str, tokens: int, ours: Timing, theirs: Timing) -> None:
  """One line: tokens/s of both sides at the median (and the fastest) repeat, the ratio, the load."""
  print(f"  {what:9s} ours {tokens / ours.median:9.1f} tok/s ({ours.median * 1e3:8.1f} ms, best "
        f"{ours.best * 1e3:8.1f}) | torch {tokens / theirs.median:9.1f} tok/s ({theirs.median * 1e3:8.1f} ms, "
        f"best {theirs.best * 1e3:8.1f}) | ratio {theirs.median / ours.median:5.2f}x (best/best "
        f"{theirs.best / ours.best:5.2f}x) | {load()}, {others(ours.foreign)}", flush=True)


def others(share: float | None) -> str:
  """`ForeignCpu.share` as text."""
  if share is None:
    return "other processes' CPU share unknown"
  return f"other processes used {100 * share:.0f}% of the CPUs"


# --------------------------------------------------------------------------------------------------
# Models and batch.


def build_models(shape: Shape, seed: int = 0):
  """Our model (split) and the same weights in transformers PyTorch (float32).

  Biases and norm weights are perturbed from their 0 / 1 initial values so that nothing is trivial.
  """
  model = Qwen2ForCausalLM(shape.config, rngs=nnx.Rngs(seed), attention_chunk_size=shape.attention_chunk)
  graphdef, params = nnx.split(model)
  rng = np.random.RandomState(seed + 1)  # NumPy draws: no XLA program to compile per parameter shape
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: (jnp.asarray(np.asarray(x) + 0.02 * rng.randn(*x.shape).astype(x.dtype))
                       if any(s in jax.tree_util.keystr(path) for s in ("bias", "norm")) else x), params)
  model = nnx.merge(graphdef, params)
  with tempfile.TemporaryDirectory() as tmp:
    save_hf_checkpoint(model, tmp)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
  hf.eval()  # Qwen2 has no dropout (attention_dropout 0), so train and eval modes compute the same
  return graphdef, params, hf


def make_batch(shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
  """A learner batch (`lrn.batch_fields` layout) without old/ref log-probs (filled in later).

  Prompts are left-padded to P with lengths in [P/2, P]; responses are right-padded to R with lengths in
  [R/2, R] (one row reaches R, as after trimming to the longest row) and alternate 48 action tokens (loss
  mask on) with 64 observation tokens (off), like the tiny preset's tool turns. Advantages are one normal
  value per row (outcome-reward style).
  """
  rows, p, r, vocab = shape.rows, shape.prompt, shape.response, shape.config.vocab_size
  rng = np.random.RandomState(seed)
  ids = np.zeros((rows, p + r), np.int32)
  mask = np.zeros((rows, p + r), np.int32)
  loss_mask = np.zeros((rows, r), np.float32)
  p_len = rng.randint(p // 2, p + 1, size=rows)
  r_len = rng.randint(r // 2, r + 1, size=rows)
  r_len[0] = r
  for i in range(rows):
    ids[i, p - p_len[i]:p + r_len[i]] = rng.randint(0, vocab, size=p_len[i] + r_len[i])
    mask[i, p - p_len[i]:p + r_len[i]] = 1
    loss_mask[i, :r_len[i]] = (np.arange(r_len[i]) % 112) < 48
  adv = rng.randn(rows, 1).astype(np.float32) * loss_mask
  return {"input_ids": ids, "attention_mask": mask, "response_ids": ids[:, p:].copy(), "loss_mask": loss_mask,
          "advantage_mask": loss_mask.copy(), "advantages": adv, "returns": adv.copy()}


def add_old_and_ref(batch: dict[str, np.ndarray], logp: np.ndarray, seed: int = 1) -> dict[str, np.ndarray]:
  """old/ref log-probs = the current policy's plus noise, so ratios and KL are not trivially 1 and 0 and
  some tokens take the clipped and dual-clipped branches."""
  rng = np.random.RandomState(seed)
  m = batch["loss_mask"]
  old = (logp + 0.3 * rng.randn(*logp.shape)).astype(np.float32) * m
  ref = (logp + 0.1 * rng.randn(*logp.shape)).astype(np.float32) * m
  return {**batch, "old_logprobs": old, "ref_logprobs": ref}


# --------------------------------------------------------------------------------------------------
# The PyTorch side.


def torch_logprobs(hf, ids, mask, prompt: int, response: int, *, with_entropy: bool):
  """Response log-probs `[m, R]` (with grad) and entropy (detached, or None) of one micro-batch.

  Positions are `cumsum(mask) - 1` clipped at 0 (left padding); the LM head sees the response slice only.
  """
  positions = (mask.cumsum(-1) - 1).clamp(min=0)
  hidden = hf.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
  logits = hf.lm_head(hidden[:, prompt - 1:prompt + response - 1]).float()
  logz = torch.log_softmax(logits, dim=-1)
  logp = logz.gather(-1, ids[:, prompt:, None].long()).squeeze(-1)
  entropy = None
  if with_entropy:
    with torch.no_grad():
      entropy = -(logz.exp() * logz).sum(-1)
  return logp, entropy


def torch_actor_total(logp, old, ref, adv, mask):
  """Sum over the mask of the PPO dual-clip surrogate + KL_COEF * k3, as `actor_loss` (token-mean total)."""
  on = mask > 0
  logp, old, ref, adv = (torch.where(on, x, torch.zeros_like(x)) for x in (logp, old, ref, adv))
  ratio = torch.exp((logp - old).clamp(-20.0, 20.0))
  unclipped = -adv * ratio
  clipped = -adv * ratio.clamp(1.0 - CLIP, 1.0 + CLIP)
  ppo = torch.maximum(unclipped, clipped)
  per_token = torch.where(adv < 0, torch.minimum(ppo, -adv * DUAL_CLIP), ppo)
  neg = (ref - logp).clamp(-20.0, 20.0)
  kl = (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)
  return (torch.where(on, per_token + KL_COEF * kl, torch.zeros_like(kl))).sum()


class TorchLearner:
  """The same actor update and log-prob pass in PyTorch, micro-batch by micro-batch."""

  def __init__(self, hf, shape: Shape, batch: dict[str, np.ndarray]):
    self.hf, self.shape = hf, shape
    self.opt = torch.optim.AdamW(hf.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    n = shape.rows // shape.micro_rows
    # Micro-batch k holds rows k, k + n, ... (as `microbatch.split_micro`); the gradient sum does not depend on it.
    self.micro = [{k: torch.from_numpy(np.ascontiguousarray(v[j::n])) for k, v in batch.items()}
                  for j in range(n)]
    self.denominator = float(batch["loss_mask"].sum())

  def update(self) -> float:
    """One optimizer step on the whole batch; returns the pre-clip gradient norm."""
    p, r = self.shape.prompt, self.shape.response
    self.opt.zero_grad(set_to_none=True)
    for mb in self.micro:
      logp, _ = torch_logprobs(self.hf, mb["input_ids"], mb["attention_mask"], p, r, with_entropy=True)
      total = torch_actor_total(logp, mb["old_logprobs"], mb["ref_logprobs"], mb["advantages"], mb["loss_mask"])
      (total / self.denominator).backward()
    norm = torch.nn.utils.clip_grad_norm_(self.hf.parameters(), 1.0)
    self.opt.step()
    return float(norm)

  def logprobs(self) -> tuple[np.ndarray, np.ndarray]:
    """Log-probs and entropy `[B, R]` in row order, no autograd."""
    p, r, n = self.shape.prompt, self.shape.response, len(self.micro)
    logp = np.zeros((self.shape.rows, r), np.float32)
    ent = np.zeros((self.shape.rows, r), np.float32)
    with torch.inference_mode():
      for j, mb in enumerate(self.micro):
        lp, e = torch_logprobs(self.hf, mb["input_ids"], mb["attention_mask"], p, r, with_entropy=True)
        logp[j::n], ent[j::n] = lp.numpy(), e.numpy()
    return logp, ent


# --------------------------------------------------------------------------------------------------
# Our side.


class OurLearner:
  """`lrn.Learner` with its parameters and optimizer state threaded through repeated calls."""

  def __init__(self, graphdef, params, shape: Shape, chunk: int, batch: dict[str, np.ndarray]):
    cfg = lrn.ActorLossConfig(clip_ratio_low=CLIP, clip_ratio_high=CLIP, clip_ratio_c=DUAL_CLIP,
                              loss_agg_mode="token-mean", use_kl_loss=True, kl_loss_coef=KL_COEF,
                              kl_loss_type="low_var_kl", logits_chunk_size=chunk)
    tx = optimizer_lib.make_optimizer(lr=LR, warmup_steps=0, weight_decay=0.01, grad_clip=1.0)
    self.learner = lrn.Learner(graphdef, tx, cfg)
    self.params = jax.tree.map(jnp.copy, params)  # actor_step donates its params and optimizer state
    self.opt_state = tx.init(self.params)
    self.num_micro = shape.rows // shape.micro_rows
    self.batch = {k: jnp.asarray(v) for k, v in batch.items()}

  def update(self) -> float:
    """One `actor_step`; returns the pre-clip gradient norm."""
    self.params, self.opt_state, metrics = self.learner.actor_step(self.params, self.opt_state, self.batch,
                                                                   num_micro=self.num_micro)
    return float(metrics["actor/grad_norm"])

  def logprobs(self) -> tuple[jax.Array, jax.Array]:
    out = self.learner.logprobs(self.params, self.batch, num_micro=self.num_micro, with_entropy=True)
    return jax.block_until_ready(out)


class OnPolicyStep:
  """The learner's part of an on-policy step of `lrn.Learner` (GRPO's defaults: one epoch, one mini-batch, KL
  loss to a frozen reference), two ways; parameters and optimizer state threaded through repeated calls.

  with the pass: old log-probs pass, reference log-probs pass, `actor_step` fed the pass's old log-probs;
  shortcut:      reference log-probs pass, `actor_step(..., onpolicy=True)` (old log-probs = its own, held fixed).
  The batch's advantages, masks and sampler log-probs are the same for both.
  """

  def __init__(self, ours: OurLearner):
    self.ours = ours
    self.ref = jax.tree.map(jnp.copy, ours.params)
    base = {k: v for k, v in self.ours.batch.items() if k not in ("old_logprobs", "ref_logprobs")}
    self.shortcut_batch = {**base, "sampler_logprobs": self.ours.batch["old_logprobs"],
                           "action_mask": self.ours.batch["loss_mask"]}
    self.pass_batch = base

  def _ref_logprobs(self) -> jax.Array:
    ours = self.ours
    logp, _ = ours.learner.logprobs(self.ref, self.pass_batch, num_micro=ours.num_micro, with_entropy=False)
    return logp

  def with_pass(self) -> float:
    """Old and reference passes, then the update fed both; returns the pre-clip gradient norm."""
    ours = self.ours
    old, _ = ours.learner.logprobs(ours.params, self.pass_batch, num_micro=ours.num_micro, with_entropy=True)
    batch = {**self.pass_batch, "old_logprobs": old, "ref_logprobs": self._ref_logprobs()}
    ours.params, ours.opt_state, metrics = ours.learner.actor_step(ours.params, ours.opt_state, batch,
                                                                   num_micro=ours.num_micro)
    return float(metrics["actor/grad_norm"])

  def shortcut(self) -> float:
    """Reference pass, then the on-policy update; returns the pre-clip gradient norm."""
    ours = self.ours
    batch = {**self.shortcut_batch, "ref_logprobs": self._ref_logprobs()}
    ours.params, ours.opt_state, metrics = ours.learner.actor_step(ours.params, ours.opt_state, batch,
                                                                   num_micro=ours.num_micro, onpolicy=True)
    return float(metrics["actor/grad_norm"])


# --------------------------------------------------------------------------------------------------


TableRow = tuple[str, str, int, float, float]  # shape, pass, our logits_chunk_size, our tokens/s, PyTorch tokens/s
OnPolicyRow = tuple[str, float, float]  # shape, seconds with the old-log-prob pass, with the shortcut


def run_shape(shape: Shape, repeats: int) -> tuple[list[TableRow], OnPolicyRow]:
  """Checks agreement, then times both passes for each of our LM-head block sizes, and (at the first size) our
  on-policy step with the old-log-prob pass and with the shortcut (`run_onpolicy`).

  Returns the table's rows and the on-policy row.
  """
  tokens = shape.rows * (shape.prompt + shape.response)
  print(f"\n== {shape.name}: {shape.rows} rows x (P={shape.prompt} + R={shape.response}) = {tokens} tokens, "
        f"micro-batch {shape.micro_rows} rows ({shape.rows // shape.micro_rows} micro-batches), "
        f"{load()}", flush=True)
  graphdef, params, hf = build_models(shape)
  batch = make_batch(shape)
  probe = OurLearner(graphdef, params, shape, 0, batch)
  logp0, _ = probe.logprobs()
  batch = add_old_and_ref(batch, np.asarray(logp0))
  del probe
  rows = []
  theirs = TorchLearner(hf, shape, batch)
  t_logp, t_ent = theirs.logprobs()
  for chunk in shape.logits_chunks:
    ours = OurLearner(graphdef, params, shape, chunk, batch)
    o_logp, o_ent = (np.asarray(x) for x in ours.logprobs())
    on = batch["attention_mask"][:, shape.prompt:] > 0
    print(f"  logits_chunk_size={chunk}: max |logp ours - torch| {np.abs(o_logp - t_logp)[on].max():.2e}, "
          f"max |entropy diff| {np.abs(o_ent - t_ent)[on].max():.2e} (over {int(on.sum())} response tokens)",
          flush=True)
    if chunk == shape.logits_chunks[0]:
      # The first update of each side from the same weights: pre-clip gradient norms must agree.
      g_ours, g_torch = ours.update(), theirs.update()
      print(f"  first update's gradient norm: ours {g_ours:.6e}, torch {g_torch:.6e} "
            f"(rel diff {abs(g_ours - g_torch) / g_torch:.1e})", flush=True)
    for what, fn_ours, fn_theirs in (("update", ours.update, theirs.update),
                                     ("log-prob", ours.logprobs, theirs.logprobs)):
      t_o, t_t = timed_pair(fn_ours, fn_theirs, repeats)
      report(what + ":", tokens, t_o, t_t)
      rows.append((shape.name, what, chunk, tokens / t_o.median, tokens / t_t.median))
    if chunk == shape.logits_chunks[0]:
      onpolicy = run_onpolicy(shape, chunk, ours, repeats)
    del ours
  return rows, onpolicy


def run_onpolicy(shape: Shape, chunk: int, ours: OurLearner, repeats: int) -> OnPolicyRow:
  """Times the learner's part of an on-policy step with the old-log-prob pass and with the shortcut, alternately,
  on `ours` (its compiled programs, parameters and batch; the batch's noisy old log-probs, `add_old_and_ref`,
  serve as the sampler's)."""
  step = OnPolicyStep(ours)
  t_pass, t_short = timed_pair(step.with_pass, step.shortcut, repeats)
  print(f"  on-policy step (logits_chunk_size={chunk}): old-log-prob pass + ref pass + update "
        f"{t_pass.median * 1e3:8.1f} ms (best {t_pass.best * 1e3:8.1f}) | shortcut: ref pass + update "
        f"{t_short.median * 1e3:8.1f} ms (best {t_short.best * 1e3:8.1f}) | ratio "
        f"{t_pass.median / t_short.median:5.2f}x (best/best {t_pass.best / t_short.best:5.2f}x) | {load()}, "
        f"{others(t_short.foreign)}", flush=True)
  return shape.name, t_pass.median, t_short.median


def main():
  transformers.logging.set_verbosity_error()
  transformers.logging.disable_progress_bar()
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--shapes", default="tiny,qwen0.5b", help="comma-separated subset of: tiny, qwen0.5b, smoke")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--smoke", action="store_true",
                      help="the smoke shape only, one repeat, a small matmul probe: checks that the bench runs")
  args = parser.parse_args()
  if args.smoke:
    args.shapes, args.repeats = "smoke", 1
  torch.set_num_threads(os.cpu_count())
  available = shapes()
  selected = [s.strip() for s in args.shapes.split(",") if s.strip()]
  unknown = sorted(set(selected) - set(available))
  if unknown:
    parser.error(f"unknown shape(s) {unknown}; use a subset of {sorted(available)}")
  print(f"jax {jax.__version__} ({jax.devices()[0].platform}, {os.cpu_count()} CPUs), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), transformers {transformers.__version__}; {load()}", flush=True)
  n = 256 if args.smoke else 2048
  g_jax, g_torch = matmul_gflops(n, repeats=1 if args.smoke else 10)
  print(f"float32 {n}x{n} matmul: jitted jnp {g_jax:.1f} GFLOP/s (torch {g_torch:.1f} GFLOP/s)", flush=True)
  table, onpolicy = [], []
  for name in selected:
    rows, onpolicy_row = run_shape(available[name], args.repeats)
    table += rows
    onpolicy.append(onpolicy_row)
  print("\n| shape | pass | our logits_chunk_size | ours tok/s | PyTorch tok/s | ours / PyTorch |")
  print("|---|---|---|---|---|---|")
  for name, what, chunk, ours, theirs in table:
    print(f"| {name} | {what} | {chunk} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.2f}x |")
  print("\n| shape | learner step with the old-log-prob pass | with the on-policy shortcut | pass / shortcut |")
  print("|---|---|---|---|")
  for name, t_pass, t_short in onpolicy:
    print(f"| {name} | {t_pass * 1e3:.1f} ms | {t_short * 1e3:.1f} ms | {t_pass / t_short:.2f}x |")
  print(f"({args.repeats} repeats, median; {load()})")


if __name__ == "__main__":
  main()
