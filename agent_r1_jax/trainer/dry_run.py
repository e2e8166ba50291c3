"""`--config.dry_run=True`: size a configured run per device, without weights, before renting the hardware.

Every program one RL step runs is sized twice, side by side:

  plan      the analytic estimate of `trainer.memory` (shapes and formulas only; instant);
  compiled  XLA's own account: the program is AOT-lowered for abstract inputs (`jax.ShapeDtypeStruct`
            parameters, optimizer states, caches and batches, each with the sharding the run gives it; no
            array is allocated) and compiled for the configured mesh, and `Compiled.memory_analysis()`
            gives its per-device argument, output and temporary bytes.

A program's peak is its compiled total (arguments + outputs - donated + temporaries) plus the state that
stays resident on the device while it runs but is not one of its arguments (e.g. the optimizer state and
the frozen reference during the rollout); the verdict compares the largest peak with
`--config.dry_run_memory_gb`. Shapes are the configured limits (the longest prompt and response a step
can hold, rows bucketed as the sampler buckets them), so the figures bound what any step of the run
needs. On a CPU host a mesh of N simulated devices comes from
`XLA_FLAGS=--xla_force_host_platform_device_count=N`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections import config_dict

from agent_r1_jax import models
from agent_r1_jax.models import Qwen2Config
from agent_r1_jax.rollout import RolloutConfig
from agent_r1_jax.rollout.stop_strings import turn_stop_strings
from agent_r1_jax.sampling import Sampler, SamplingParams, buckets
from agent_r1_jax.trainer import build
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.trainer import learner as learner_lib
from agent_r1_jax.trainer import memory

_GIB = float(1 << 30)


@dataclasses.dataclass
class ProgramMemory:
  """Per-device bytes of one compiled program, its analytic plan, and what stays resident beside it."""
  name: str
  arguments: int
  outputs: int
  temporaries: int
  aliased: int                # output bytes that reuse donated argument buffers
  plan: float                 # analytic estimate of `total`
  resident: float             # state on the device during the program that is not one of its arguments
  compile_seconds: float

  @property
  def total(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporaries

  @property
  def peak(self) -> float:
    return self.total + self.resident


@dataclasses.dataclass
class DryRunReport:
  """What `dry_run` prints: the parameter count, the mesh, one row per program and the verdict."""
  num_params: int
  mesh: dict[str, int]
  programs: list[ProgramMemory]
  budget_bytes: float

  @property
  def peak(self) -> ProgramMemory:
    return max(self.programs, key=lambda p: p.peak)

  @property
  def fits(self) -> bool:
    return self.peak.peak <= self.budget_bytes

  def table(self) -> str:
    head = (f"  {'program':<15s} {'args':>8s} {'outputs':>8s} {'donated':>8s} {'temps':>8s} {'total':>8s} "
            f"{'plan':>8s} {'plan/xla':>8s} {'+resident':>9s} {'peak':>8s} {'compile':>8s}")
    lines = [head, "  " + "-" * (len(head) - 2)]
    for p in self.programs:
      ratio = p.plan / p.total if p.total else float("nan")
      lines.append(f"  {p.name:<15s} {p.arguments / _GIB:8.2f} {p.outputs / _GIB:8.2f} {p.aliased / _GIB:8.2f} "
                   f"{p.temporaries / _GIB:8.2f} {p.total / _GIB:8.2f} {p.plan / _GIB:8.2f} {ratio:8.2f} "
                   f"{p.resident / _GIB:9.2f} {p.peak / _GIB:8.2f} {p.compile_seconds:7.1f}s")
    lines.append("  (GiB per device; total = args + outputs - donated + temps; peak = total + resident state)")
    return "\n".join(lines)

  def verdict(self) -> str:
    worst = self.peak
    word = "fits" if self.fits else "does NOT fit"
    return (f"verdict: {word} in {self.budget_bytes / _GIB:.1f} GiB per device (largest peak: {worst.name}, "
            f"{worst.peak / _GIB:.2f} GiB)")


# --------------------------------------------------------------------------------------------------
# Abstract state: shapes and shardings of everything a step holds, no arrays.


def abstract_opt_state(tx, params: Any, mesh) -> Any:
  """The optimizer state of `params` as the trainer holds it: every parameter-shaped leaf (AdamW's moments)
  placed like its parameter, the rest (step counts) replicated."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return optax.tree_map_params(
      tx, lambda x, p: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=p.sharding), jax.eval_shape(tx.init, params),
      params, transform_non_params=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated))


def abstract_batch(c: config_dict.ConfigDict, mesh, rows: int, *, with_ref: bool, with_values: bool) -> dict:
  """A learner batch of `rows` rows at the configured prompt and response limits, rows over (data, fsdp)."""
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
  fields = learner_lib.batch_fields(rows, c.rollout.max_prompt_length, c.rollout.max_response_length,
                                    with_ref=with_ref, with_values=with_values)
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for k, (shape, dtype) in fields.items()}


def device_bytes(tree: Any) -> int:
  """Bytes one device holds of a pytree of sharded abstract (or concrete) arrays: the largest shard's size."""
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
    total += math.prod(shape) * np.dtype(x.dtype).itemsize
  return total


def observation_tokens(c: config_dict.ConfigDict) -> int:
  """The widest observation an extend call appends: `rollout.max_observation_tokens`, else one tool result
  of `env.max_tool_response_length` characters (at most one token each) per call plus its chat framing."""
  if c.rollout.max_observation_tokens:
    return c.rollout.max_observation_tokens
  calls = c.rollout.max_turns if c.env.parallel_tool_calls else 1
  return calls * (c.env.max_tool_response_length + 16) + 16


# --------------------------------------------------------------------------------------------------
# The dry run.


def _architecture(c: config_dict.ConfigDict) -> Qwen2Config:
  if c.model.path:
    return Qwen2Config.from_pretrained_dir(c.model.path)
  if c.model.shape_preset:
    return getattr(models, c.model.shape_preset)()
  return build.model_config(c, vocab_size=4096)


# XLA:CPU's default scheduler orders a program for thread-level concurrency and keeps many more buffers alive
# than the TPU and GPU schedulers, which minimise memory (a 3B actor update: 2.3x the temporaries). XLA reads
# the flag once, when the CPU client starts.
_MEMORY_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def use_memory_scheduler() -> None:
  """Makes XLA:CPU schedule for memory (`_MEMORY_SCHEDULER_FLAG`); call before any JAX backend exists."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_MEMORY_SCHEDULER_FLAG}".strip()


def _memory_scheduled() -> bool:
  return jax.default_backend() != "cpu" or _MEMORY_SCHEDULER_FLAG in os.environ.get("XLA_FLAGS", "")


def _measure(name: str, lowered, plan: float, resident: float) -> ProgramMemory:
  t0 = time.perf_counter()
  stats = lowered.compile().memory_analysis()
  return ProgramMemory(name=name, arguments=int(stats.argument_size_in_bytes),
                       outputs=int(stats.output_size_in_bytes), temporaries=int(stats.temp_size_in_bytes),
                       aliased=int(stats.alias_size_in_bytes), plan=plan, resident=resident,
                       compile_seconds=time.perf_counter() - t0)


def size_programs(c: config_dict.ConfigDict, arch: Qwen2Config, mesh, *, programs: tuple[str, ...] | None = None,
                  log=None) -> tuple[list[ProgramMemory], dict[str, int]]:
  """Every program of one step of `c` (or those named in `programs`) planned and compiled on `mesh`.

  Returns the programs' figures and the per-device bytes of the state a step keeps (`actor`, `actor_opt`,
  `ref`, `critic`, `critic_opt`, `batch`).
  """
  rows = c.trainer.batch_size * c.rollout.n_samples
  mini_rows = rows // c.actor.num_mini_batches
  devices = mesh.devices.size
  micro = {s: config_lib.micro_batches(c, s, rows, devices) for s in ("actor", "critic")}
  mini_micro = {s: config_lib.micro_batches(c, s, mini_rows, devices) for s in ("actor", "critic")}
  with_ref, with_critic = build.needs_reference(c), bool(c.algorithm.use_critic)
  actor_graphdef, actor = build.abstract_params(c, arch, mesh, head="lm")
  critic_graphdef, critic = build.abstract_params(c, arch, mesh, head="value") if with_critic else (None, None)
  learner = build.build_learner(c, actor_graphdef, critic_graphdef, logprob_temperature=c.rollout.temperature)
  state = {"actor": actor, "actor_opt": abstract_opt_state(learner.actor_tx, actor, mesh)}
  if with_ref:
    state["ref"] = actor
  if with_critic:
    state.update(critic=critic, critic_opt=abstract_opt_state(learner.critic_tx, critic, mesh))
  batch = abstract_batch(c, mesh, rows, with_ref=with_ref, with_values=with_critic)
  mini = abstract_batch(c, mesh, mini_rows, with_ref=with_ref, with_values=with_critic)
  held = {name: device_bytes(tree) for name, tree in state.items()}
  held["batch"] = device_bytes(batch)
  shape = memory.RunShape.from_config(c, arch, dict(mesh.shape), rollout_rows=buckets.batch_bucket(rows),
                                      extend_tokens=observation_tokens(c))
  plan = memory.plan_programs(shape)

  # Each program: (name, lower() -> Lowered, the state it takes as arguments). Lowered lazily, one at a time.
  def sampler_program(name):
    # Token ids are values, not shapes: any ids of the vocabulary compile the same sampler programs.
    stops = range(len(turn_stop_strings(c.env.parallel_tool_calls)) + 1)
    sampler = Sampler(actor_graphdef, max_cache_length=RolloutConfig.from_config(c.rollout).cache_length,
                      stop_token_ids=stops, pad_id=0, cache_dtype=getattr(jnp, c.rollout.cache_dtype), mesh=mesh)
    sampling = SamplingParams(temperature=c.rollout.temperature, top_k=c.rollout.top_k, top_p=c.rollout.top_p)
    return sampler.lower(actor, rows=rows, prompt_length=c.rollout.max_prompt_length,
                         extend_length=observation_tokens(c), width=c.rollout.max_new_tokens_per_turn,
                         sampling=sampling, only=name)

  candidates = [
      ("prefill", lambda: sampler_program("prefill"), ("actor", "batch")),
      ("extend", lambda: sampler_program("extend"), ("actor", "batch")),
      ("decode", lambda: sampler_program("decode"), ("actor", "batch")),
      ("logprobs", lambda: learner.logprobs.lower(actor, batch, num_micro=micro["actor"]), ("actor",)),
  ]
  if with_ref:
    candidates.append(("ref_logprobs", lambda: learner.logprobs.lower(actor, batch, num_micro=micro["actor"],
                                                                        with_entropy=False), ("ref",)))
  if with_critic:
    candidates += [
        ("values", lambda: learner.values.lower(critic, batch, num_micro=micro["critic"]), ("critic",)),
        ("critic_update", lambda: learner.critic_step.lower(critic, state["critic_opt"], mini,
                                                            num_micro=mini_micro["critic"]), ("critic", "critic_opt"))]
  candidates.append(("actor_update", lambda: learner.actor_step.lower(actor, state["actor_opt"], mini,
                                                                      num_micro=mini_micro["actor"]),
                     ("actor", "actor_opt")))
  measured = []
  for name, lower, uses in candidates:
    if programs is not None and name not in programs:
      continue
    with jax.set_mesh(mesh):
      lowered = lower()
    resident = float(sum(v for k, v in held.items() if k not in uses))
    measured.append(_measure(name, lowered, plan[name], resident))
    if log:
      log(f"  compiled {name} in {measured[-1].compile_seconds:.1f} s")
  return measured, held


def dry_run(c: config_dict.ConfigDict, *, verbose: bool = True) -> DryRunReport:
  """Plans and compiles every program of one step of `c` on its mesh; prints the table and the verdict."""
  arch = _architecture(c)
  mesh = build.build_mesh(c)
  sizes = dict(mesh.shape)
  rows = c.trainer.batch_size * c.rollout.n_samples
  log = (lambda line: print(line, flush=True)) if verbose else None
  if log:
    log(f"model: {c.model.shape_preset or c.model.path or 'tiny'}  parameters: {arch.num_params():,} "
        f"({arch.num_params() / 1e9:.2f} B)")
    log(f"mesh: data={sizes['data']} fsdp={sizes['fsdp']} tensor={sizes['tensor']} on {mesh.devices.size} "
        f"{jax.devices()[0].platform} devices  rollout rows per step: {rows} (mini-batch "
        f"{rows // c.actor.num_mini_batches}; micro-batch {c.actor.micro_batch_size_per_device} per device)  "
        f"context {c.rollout.max_prompt_length} + {c.rollout.max_response_length}")
  if log and not _memory_scheduled():
    log(f"note: XLA:CPU schedules for concurrency here and keeps more buffers alive than an accelerator would; "
        f"set XLA_FLAGS={_MEMORY_SCHEDULER_FLAG} (the train CLI does) for representative figures")
  measured, held = size_programs(c, arch, mesh, log=log)
  report = DryRunReport(num_params=arch.num_params(), mesh=sizes, programs=measured,
                        budget_bytes=float(c.dry_run_memory_gb) * _GIB)
  if log:
    log("per-device memory, XLA's compiled figures beside the analytic plan:")
    log(report.table())
    log("resident state per device: " + ", ".join(f"{k} {v / _GIB:.2f} GiB" for k, v in held.items()))
    log(report.verdict())
  return report
