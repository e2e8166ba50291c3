"""Warm-up throughput with length-grouped batches (`sft.length_group`) against random batches, in the same run.

Not a test: prints figures measured in this run on this machine, for a preset's real warm-up data (the synthetic
world, its expert episodes, the reading and naive-RAG practice; `warmup.data.warmup_data`):

  padding   for each group size g, over the preset's whole planned stage list (`sft.stages`, every batch its
            stage would draw with the run's seed): the tokens the batches compute, B * (P + R) after bucketing
            to `trainer.length_multiple`, and the attention work, B * (P + R)^2, each divided by the same sums
            over the examples' own lengths (1.00 = no padding). Counting only: no model runs.
  timing    the preset's model (random weights) trains `--steps` steps of the whole-episode stage (`all`, the
            stage that dominates the warm-up) on batches drawn with g = 0 and with g = `--group`, from the same
            parameters: seconds including compilation (one program per bucketed shape, as in a run), the number
            of distinct shapes, and seconds per step without the first step of each shape; the ratio is
            g = 0's time over g's.

Both draw the same examples per epoch; only which examples share a batch differs. The float32 matmul rate and the
load average are printed because these shared machines differ several-fold.

    python bench/sft.py                               # tiny-mixed, g in 0, 4, 8, 16, 32; timing 40 steps at g = 8
    python bench/sft.py --preset=tiny --steps=20
    python bench/sft.py --smoke                       # tiny at toy data sizes (SMOKE), 3 timed steps of both
                                                      # timings: that it runs
    python bench/sft.py --attention_chunks=512,0      # timing compares attention block sizes instead

  With --attention_chunks the timing section runs the same whole-episode steps at g = 0 with the model built at
  each `model.attention_chunk_size` (0: dense [B, H, T, T] scores): same parameters, same batches; ratios are
  against the first size.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agent_r1_jax.data.sft import first_turns
from agent_r1_jax.learner import build as build_lib
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.learner import optimizer as optimizer_lib
from agent_r1_jax.warmup import sft as sft_lib
from agent_r1_jax.trainer import task as task_lib
from agent_r1_jax.warmup import data as warmup_lib


# --smoke: the tiny preset with a few hundred examples per pool, a short stage list and a one-layer model, so the
# bench's code paths (every pool, both groupings, a compilation per shape) run in about a minute; its figures mean
# nothing.
SMOKE = {"model.num_hidden_layers": 1, "model.hidden_size": 64, "model.intermediate_size": 128,
         "data.synthetic.num_train": 200, "sft.reading_questions": 40, "sft.multi_hop_questions": 40,
         "sft.rag_questions": 20, "sft.stages": "copy:4:8,1:4:8,2:4:8,all:24:16"}
SMOKE_ATTENTION_CHUNKS = "64,0"  # --smoke also times these (its episodes are longer than 64 positions)


def matmul_rate(n: int = 2048, repeats: int = 20) -> float:
  """GFLOP/s of a jitted float32 [n, n] @ [n, n]."""
  f = jax.jit(lambda a, b: a @ b)
  a = jnp.ones((n, n), jnp.float32)
  f(a, a).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(repeats):
    out = f(a, a)
  out.block_until_ready()
  return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e9


def stage_pools(stage: sft_lib.Stage, data: warmup_lib.WarmupData) -> list:
  """The pools `run_sft` draws `stage`'s batches from."""
  if stage.is_copy_drill:
    return [data.drill]
  whole = stage.turns == 0
  return [[first_turns(ex, stage.turns) for ex in data.examples], data.rag_examples if whole else (),
          data.reading_examples if whole else ()]


def padding_ratios(c, data: warmup_lib.WarmupData, group: int) -> tuple[float, float]:
  """(computed tokens / example tokens, computed attention / example attention) over every planned stage."""
  layout = dict(prompt_length=data.prompt_length, response_length=c.rollout.max_response_length,
                pad_id=0, multiple=c.trainer.length_multiple or None)
  rng = np.random.default_rng(c.seed)
  sums = np.zeros(4)
  for stage in sft_lib.parse_stages(c.sft.stages):
    stream = sft_lib.BatchStream(stage_pools(stage, data), stage.batch_size, rng, layout, length_group=group)
    for _ in range(stage.steps):
      k, chosen = stream.next_indices()
      examples = [stream.pools[k][i] for i in chosen]
      own = np.array([len(e.prompt_ids) + min(len(e.response_ids), layout["response_length"]) for e in examples])
      width = sft_lib.learner_batch(examples, **layout)["input_ids"].shape[1]
      sums += [len(own) * width, own.sum(), len(own) * width**2, (own**2).sum()]
  return sums[0] / sums[1], sums[2] / sums[3]


def time_stage(c, data: warmup_lib.WarmupData, group: int, steps: int, graphdef, params0) -> dict:
  """`steps` steps of the preset's whole-episode stage on batches drawn with `group`, from `params0`."""
  stage = next(s for s in sft_lib.parse_stages(c.sft.stages) if s.turns == 0)
  layout = dict(prompt_length=data.prompt_length, response_length=c.rollout.max_response_length,
                pad_id=0, multiple=c.trainer.length_multiple or None)
  stream = sft_lib.BatchStream(stage_pools(stage, data), stage.batch_size, np.random.default_rng(c.seed), layout,
                               length_group=group)
  tx = optimizer_lib.clipped_adamw(1e-3, weight_decay=0.0, grad_clip=1.0, b2=c.sft.adam_b2)
  trainer = sft_lib.SupervisedTrainer(graphdef, tx, logits_chunk_size=c.sft.logits_chunk_size)
  params = jax.tree.map(jnp.copy, params0)
  opt_state = tx.init(params)
  shapes, steady, total_t0 = set(), [], time.perf_counter()
  for _ in range(steps):
    batch = stream.next()
    shape = batch["input_ids"].shape
    t0 = time.perf_counter()
    params, opt_state, metrics = trainer.step(params, opt_state, batch)
    jax.block_until_ready(metrics)
    if shape in shapes:
      steady.append(time.perf_counter() - t0)
    shapes.add(shape)
  return dict(seconds=time.perf_counter() - total_t0, shapes=len(shapes),
              steady=float(np.mean(steady)) if steady else float("nan"))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="tiny-mixed")
  parser.add_argument("--groups", default="0,4,8,16,32", help="group sizes g whose padding is counted")
  parser.add_argument("--group", type=int, default=8, help="the group size timed against g = 0")
  parser.add_argument("--steps", type=int, default=40, help="timed steps of the whole-episode stage per side")
  parser.add_argument("--smoke", action="store_true", help="tiny preset, 3 timed steps: that it runs")
  parser.add_argument("--attention_chunks", default="",
                      help="comma-separated model.attention_chunk_size values to time at g = 0 (0: dense), "
                           "instead of the group sizes")
  args = parser.parse_args()
  if args.smoke:
    args.preset, args.steps, args.groups = "tiny", 3, "0,8"
  print(f"float32 matmul {matmul_rate():.0f} GFLOP/s, load average {os.getloadavg()[0]:.2f}, "
        f"{os.cpu_count()} CPUs", flush=True)
  c = config_lib.base_config("grpo", args.preset)
  if args.smoke:
    c.update_from_flattened_dict(SMOKE)
  t0 = time.perf_counter()
  task = task_lib.build_task(c)
  data = warmup_lib.warmup_data(c, task, sft_lib.parse_stages(c.sft.stages), verbose=False)
  print(f"{args.preset}: warm-up data built in {time.perf_counter() - t0:.0f} s: {len(data.examples)} episodes, "
        f"{len(data.reading_examples)} reading, {len(data.rag_examples)} naive-RAG, {len(data.drill)} drills; "
        f"stages {c.sft.stages}", flush=True)

  print("\npadding over the planned stages (computed / the examples' own; 1.00 = none)")
  print("| g | tokens | attention |\n|---|---|---|")
  for group in (int(g) for g in args.groups.split(",")):
    tokens, attention = padding_ratios(c, data, group)
    print(f"| {group} | {tokens:.2f} | {attention:.2f} |", flush=True)

  arch = build_lib.model_config(c, len(task.tokenizer))
  # The run's actor (its attention blocks: tiny-mixed's 832-token episodes exceed the default 512).
  graphdef, params0 = nnx.split(build_lib.build_model(c, arch, build_lib.build_mesh(c), head="lm"))
  if not args.attention_chunks or args.smoke:
    time_groups(c, data, args.group, args.steps, graphdef, params0)
  if args.attention_chunks or args.smoke:
    chunks = [int(x) for x in (args.attention_chunks or SMOKE_ATTENTION_CHUNKS).split(",")]
    time_attention_chunks(c, data, arch, chunks, args.steps, params0)


def _seconds_text(seconds: float) -> str:
  return "n/a" if np.isnan(seconds) else f"{seconds:.3f} s"


def _ratio_text(ratio: float) -> str:
  """nan when a side never repeated a shape (too few steps)."""
  return "n/a" if np.isnan(ratio) else f"{ratio:.2f}x"


def time_groups(c, data: warmup_lib.WarmupData, group: int, steps: int, graphdef, params0) -> None:
  """The whole-episode stage with random batches (g = 0) and with length groups of `group`."""
  print(f"\ntiming: {steps} steps of the whole-episode stage, batch "
        f"{next(s for s in sft_lib.parse_stages(c.sft.stages) if s.turns == 0).batch_size}")
  results = {}
  for g in (0, group):
    results[g] = r = time_stage(c, data, g, steps, graphdef, params0)
    print(f"  g = {g:2d}: {r['seconds']:.1f} s with compilation, {r['shapes']} shapes, {_seconds_text(r['steady'])} "
          f"per step once compiled", flush=True)
  base, grouped = results[0], results[group]
  print(f"ratio (g = 0 / g = {group}): {base['seconds'] / grouped['seconds']:.2f}x with compilation, "
        f"{_ratio_text(base['steady'] / grouped['steady'])} per compiled step; load average "
        f"{os.getloadavg()[0]:.2f}")


def time_attention_chunks(c, data: warmup_lib.WarmupData, arch, chunks: list[int], steps: int, params0) -> None:
  """The whole-episode stage at g = 0 with the model built at each attention block size (same weights)."""
  print(f"\nattention blocks: {steps} steps of the whole-episode stage at g = 0, the longest row "
        f"{data.prompt_length + c.rollout.max_response_length} positions")
  preset_chunk = c.model.attention_chunk_size
  first = None
  for chunk in chunks:
    c.model.attention_chunk_size = chunk
    graphdef, _ = nnx.split(build_lib.build_model(c, arch, build_lib.build_mesh(c), head="lm"))
    r = time_stage(c, data, 0, steps, graphdef, params0)
    if first is None:
      first = r
    name = "dense" if chunk == 0 else f"{chunk}-blocks"
    print(f"  {name:>10}: {r['seconds']:.1f} s with compilation ({r['shapes']} shapes), "
          f"{_seconds_text(r['steady'])} per compiled step; the first size's time over this one's: "
          f"{first['seconds'] / r['seconds']:.2f}x with compilation, {_ratio_text(first['steady'] / r['steady'])} "
          f"per compiled step; load average {os.getloadavg()[0]:.2f}", flush=True)
  c.model.attention_chunk_size = preset_chunk


if __name__ == "__main__":
  main()
