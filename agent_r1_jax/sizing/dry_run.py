"""`--config.dry_run=True`: size a configured run per device, without weights, before renting the hardware.

Every program one RL step runs is sized by the compiler itself: it is AOT-lowered for abstract inputs
(`jax.ShapeDtypeStruct` parameters, optimizer states, caches and batches, each with the sharding the run gives
it; no array is allocated) and compiled for the configured mesh, and `Compiled.memory_analysis()` gives its
per-device argument, output and temporary bytes, `Compiled.cost_analysis()` its FLOPs and bytes accessed (the
body of a loop counted once: per micro-batch, per logits block).

No analytic memory plan is printed beside it. One was, until it had drifted to 0.54-3.2x the compiled totals of
the recorded TPU reports (docs/tpu_dry_run: the sampling weights at 0.54-0.59x, the scanned 3B updates at
2.85x and 3.2x, since it modelled every layer's activations as held at once) and to 0.94-4.6x at tiny shapes on
XLA:CPU and XLA:TPU; no decision read it (the verdict reads the compiled figures, and every dry run compiles),
and modelling the scan, the slot engine and each target's scheduler by hand would have duplicated the compiler.

Where it compiles:

  XLA:CPU   (default) on this host's devices; on a CPU host a mesh of N simulated devices comes from
            `XLA_FLAGS=--xla_force_host_platform_device_count=N`. An estimate: XLA:CPU lays out and schedules
            differently from an accelerator. The verdict's budget is `--config.dry_run_memory_gb`.
  XLA:TPU   with `--config.dry_run_topology=v5e:2x4` (libtpu, `sizing.tpu`): the mesh spans that slice's
            devices and the TPU compiler itself sizes every program, as it would on the hardware (tiled
            layouts, its scheduler). The budget is the HBM that compiler allows one device (15.75 GiB of a
            v5e's 16); a program it refuses as too large becomes a "does not fit" row quoting its figure.
            Each row also gets a roofline time per loop iteration from the chip's published peak and HBM
            bandwidth (`sizing.roofline`).

A program's peak is its compiled total (arguments + outputs - donated + temporaries) plus the state that
stays resident on the device while it runs but is not one of its arguments (e.g. the optimizer state and
the frozen reference during the rollout), laid out as the target's compiler lays it out (`memory.resident_bytes`:
tile-padded on a TPU); the run fits when every program's peak is within the budget.
Shapes are the configured limits (the longest prompt and response a step can hold, rows bucketed as the
sampler buckets them), so the figures bound what any step of the run needs. With `rollout.engine="slots"` the
rollout's programs are the slot engine's (`slot_extend`, `decode_chunk` over its N slots, and the same two
compacted to half the slots per chip, `*_gathered`, which hold the gathered rows beside the slots) instead of the
lockstep sampler's prefill, extend and decode over the step's (or a wave's) rows. With the paged cache
(`model.kv_cache`, `sizing.paged_sizing`) they are compiled with the configured pool and the platform's
kernel (on a TPU Ragged Paged Attention, lowered under a device of the slice); each adds the kernel's bytes and
FLOPs, which `cost_analysis` cannot see (`sizing.rpa_cost`), and the report the pages per chip that fit, the
episodes they hold against the dense cache's, and decode's bytes against what a step must read.
`--config.dry_run_report=PATH` writes the figures as JSON (`DryRunReport.to_json`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from ml_collections import config_dict

from agent_r1_jax import models
from agent_r1_jax.models import Qwen2Config
from agent_r1_jax.rollout import RolloutConfig
from agent_r1_jax.rollout.stop_strings import turn_stop_strings
from agent_r1_jax.sampling import Sampler, SamplingParams, buckets
from agent_r1_jax.sampling import programs as sampling_programs
from agent_r1_jax.sampling.paging import PagingConfig
from agent_r1_jax.sampling.slots import SlotDecoder
from agent_r1_jax.learner import batch_split, build
from agent_r1_jax.learner import updates as learner_lib
from agent_r1_jax.sizing import checks as sizing_checks
from agent_r1_jax.sizing import flops as flops_lib
from agent_r1_jax.sizing import hlo_flops, memory, paged_sizing, roofline, rollout_sizing, tpu
from agent_r1_jax.sizing.report import _GIB, DryRunReport, ProgramMemory

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


# Decoding stops on data (every row done or out of budget): these programs' FLOPs are per decode step, one trip of
# that loop (`hlo_flops.FlopCount.per_trip`); every other program's are exact or unknown.
_DECODE_PROGRAMS = ("decode", "decode_chunk", "decode_chunk_gathered")


def _measure(name: str, lowered, resident: float, num_micro: int | None = None) -> ProgramMemory:
  """Compiles `lowered` and reads its memory and cost analyses; a program the compiler refuses as too large
  for the device becomes a row with the compiler's figure (`ProgramMemory.error`), other errors raise."""
  t0 = time.perf_counter()
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if not tpu.out_of_memory(e):
      raise
    first = str(e).strip().splitlines()[0]
    sizes = tpu.parse_sizes(first)
    return ProgramMemory(name=name, arguments=None, outputs=None, temporaries=None, aliased=None,
                         resident=resident, compile_seconds=time.perf_counter() - t0,
                         required=sizes[0] if sizes else None, error=first)
  seconds = time.perf_counter() - t0
  stats = compiled.memory_analysis()
  flops, bytes_accessed = _cost(compiled)
  count, per_trip = hlo_flops.count(compiled.as_text()), name in _DECODE_PROGRAMS
  iteration = count.per_trip if per_trip else count.exact
  return ProgramMemory(name=name, arguments=int(stats.argument_size_in_bytes),
                       outputs=int(stats.output_size_in_bytes), temporaries=int(stats.temp_size_in_bytes),
                       aliased=int(stats.alias_size_in_bytes), resident=resident,
                       compile_seconds=seconds, flops=flops, bytes_accessed=bytes_accessed,
                       iteration_flops=None if iteration is None else iteration / (num_micro or 1),
                       flops_unknown=count.why_unknown(per_trip),
                       iteration="decode step" if per_trip else "micro-batch" if num_micro else "call")


def _cost(compiled) -> tuple[float | None, float | None]:
  """(flops, bytes accessed) per device of a compiled program from XLA's cost analysis: the body of a
  while loop (a scan over micro-batches or logits blocks) is counted once, not once per iteration."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per partition
    cost = cost[0] if cost else None
  if not cost:
    return None, None
  return cost.get("flops", 0.0), cost.get("bytes accessed")  # a program without arithmetic reports no flops


def _busiest(decoder: SlotDecoder, name: str) -> int | None:
  """The slot program `name`'s compaction: "_gathered" at its widest gather (half the slots per chip), else none."""
  return decoder.slots_per_device // 2 if name.endswith("_gathered") else None


def size_programs(c: config_dict.ConfigDict, arch: Qwen2Config, mesh, *, programs: tuple[str, ...] | None = None,
                  log=None, pages_per_device: int | None = None) -> tuple[list[ProgramMemory], dict[str, int]]:
  """Every program of one step of `c` (or those named in `programs`) compiled on `mesh`.

  Returns the programs' figures and the per-device bytes of the state a step keeps (`actor`, `actor_opt`,
  `ref`, `critic`, `critic_opt`, `batch`), as `mesh`'s compiler lays it out (`memory.resident_bytes`).
  The slot engine's programs over a paged cache (`model.kv_cache`) are compiled with the configured pool
  (or `pages_per_device`), and carry the kernel's bytes and FLOPs per iteration beside the compiler's
  (`paged_sizing`: every slot at the same point of the worst case's episode).
  """
  rows = c.trainer.batch_size * c.rollout.n_samples
  mini_rows = rows // c.actor.num_mini_batches
  devices = mesh.devices.size
  micro = {s: batch_split.micro_batches(c, s, rows, devices) for s in ("actor", "critic")}
  mini_micro = {s: batch_split.micro_batches(c, s, mini_rows, devices) for s in ("actor", "critic")}
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
  held = {name: memory.resident_bytes(tree) for name, tree in {**state, "batch": batch}.items()}
  # The sampler holds one wave's rows (`rollout.max_rows_per_device`), or the whole step's; the slot engine its slots.
  slots = c.rollout.engine == "slots"
  if slots:
    sampled_rows = rollout_sizing.slots_per_device(c, devices, 1) * batch_split.batch_devices(c, devices)
  else:
    sampled_rows = rollout_sizing.prompts_per_wave(c, devices, 1) * c.rollout.n_samples or rows

  # Each program: (name, lower() -> Lowered, the state it takes as arguments). Lowered lazily, one at a time.
  paging = PagingConfig.from_config(c, platform=mesh.devices.flat[0].platform) if slots else None
  if paging is not None and pages_per_device is not None:
    paging = dataclasses.replace(paging, pages_per_device=pages_per_device)
  # Token ids are values, not shapes: any ids of the vocabulary compile the same sampler programs.
  sampler = Sampler(actor_graphdef, max_cache_length=RolloutConfig.from_config(c.rollout).cache_length,
                    stop_token_ids=range(len(turn_stop_strings(c.env.parallel_tool_calls)) + 1), pad_id=0,
                    cache_dtype=getattr(jnp, c.rollout.cache_dtype), mesh=mesh)
  decoder = SlotDecoder(sampler, slots_per_device=sampled_rows // batch_split.batch_devices(c, devices),
                        decode_chunk=c.rollout.decode_chunk, paging=paging) if slots else None
  extend_length = max(c.rollout.max_prompt_length, observation_tokens(c))

  def sampler_program(name):
    sampling = SamplingParams(temperature=c.rollout.temperature, top_k=c.rollout.top_k, top_p=c.rollout.top_p)
    prepared = sampler.abstract_prepared(actor)
    if slots:  # a prompt and an observation are appended by the same program: its widest call is the longer
      # "_gathered": the call compacted to its widest gather (half the slots per chip), which holds the gathered
      # rows beside the slots.
      return decoder.lower(prepared, extend_length=extend_length, sampling=sampling,
                           only=name.removesuffix("_gathered"), busiest=_busiest(decoder, name))
    return sampler.lower(prepared, rows=sampled_rows, prompt_length=c.rollout.max_prompt_length,
                         extend_length=observation_tokens(c), width=c.rollout.max_new_tokens_per_turn,
                         sampling=sampling, only=name)

  # The sampler's programs read the prepared weights (`Sampler.prepare`), the actor's own stay resident.
  rollout_programs = ("prefill", "extend", "decode")
  if slots:
    rollout_programs = ("slot_extend", "decode_chunk")
    if rollout_sizing.slots_per_device(c, devices, 1) >= 2:  # with one slot per chip no call is ever gathered
      rollout_programs += ("slot_extend_gathered", "decode_chunk_gathered")
  candidates = [("sampling_weights", lambda: sampling_programs.sampling_weights_jit.lower(actor_graphdef, actor),
                 ("actor", "batch"))]
  candidates += [(name, functools.partial(sampler_program, name), ("batch",)) for name in rollout_programs]
  candidates.append(("logprobs", lambda: learner.logprobs.lower(actor, batch, num_micro=micro["actor"]), ("actor",)))
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
  # An update's micro-batch: its rows per device, through the actor's LM head or the critic's value head.
  updates = {"actor_update": ("actor", True), "critic_update": ("critic", False)}
  # Iterations per call (micro-batches of a learner pass) and per RL step (every turn at its full budget).
  waves = -(-rows // sampled_rows)
  updates_per_step = c.actor.num_mini_batches * c.actor.ppo_epochs
  per_call = {"logprobs": micro["actor"], "ref_logprobs": micro["actor"], "values": micro["critic"],
              "actor_update": mini_micro["actor"], "critic_update": mini_micro["critic"]}
  tokens_per_row = min(c.rollout.max_turns * c.rollout.max_new_tokens_per_turn, c.rollout.max_response_length)
  # The slot engine: each slot serves rows / N episodes in turn, every one at its full budget (an upper bound: it
  # assumes no slot ever idles); one extend per turn of each (its prompt, then an observation per later turn).
  per_step = {"sampling_weights": 1, "prefill": waves, "extend": waves * (c.rollout.max_turns - 1),
              "decode": waves * tokens_per_row, "slot_extend": waves * c.rollout.max_turns,
              "decode_chunk": waves * tokens_per_row,
              # Gathered calls replace some full ones; the step estimate counts every call as a full one.
              "slot_extend_gathered": 0, "decode_chunk_gathered": 0,
              "logprobs": micro["actor"], "ref_logprobs": micro["actor"], "values": micro["critic"],
              "actor_update": mini_micro["actor"] * updates_per_step,
              "critic_update": mini_micro["critic"] * updates_per_step}
  measured = []
  for name, lower, uses in candidates:
    if programs is not None and name not in programs:
      continue
    resident = float(sum(v for k, v in held.items() if k not in uses))
    section, lm_head = updates.get(name, (None, False))
    # The TPU paged kernel's lowering asks the default device for its TPU generation: a device of the target.
    on_tpu = paging is not None and name in rollout_programs and mesh.devices.flat[0].platform == "tpu"
    with jax.default_device(mesh.devices.flat[0]) if on_tpu else contextlib.nullcontext():
      with jax.set_mesh(mesh):
        lowered = lower()
      measured.append(_measure(name, lowered, resident, per_call.get(name)))
    measured[-1].iterations_per_step = per_step[name]
    if paging is not None and name in rollout_programs and measured[-1].error is None:
      paged_sizing.add_kernel_cost(measured[-1], c, arch, mesh, decoder, width=buckets.slot_extend_bucket(
          extend_length), rows=decoder.compact_width(_busiest(decoder, name) or decoder.slots_per_device),
                                   observation=observation_tokens(c))
    if section and measured[-1].iteration_flops is not None:
      measured[-1].micro_flops_analytic = flops_lib.update_flops(
          arch, rows=c[section].micro_batch_size_per_device, prompt_length=c.rollout.max_prompt_length,
          response_length=c.rollout.max_response_length, remat=bool(c.model.remat),
          attention_chunk=c.model.attention_chunk_size, logits_chunk=c.model.logits_chunk_size,
          lm_head=lm_head) / mesh.shape["tensor"]
    if name in ("decode", "decode_chunk") and paging is None:
      measured[-1].must_read = memory.decode_step_bytes(c, arch, dict(mesh.shape),
                                                        buckets.batch_bucket(sampled_rows))
    if log:
      log(f"  compiled {name} in {measured[-1].compile_seconds:.1f} s")
  return measured, held


@dataclasses.dataclass(frozen=True)
class _Target:
  """What the programs compile for: this host's devices (XLA:CPU) or a TPU slice's, and the verdict's budget."""
  devices: list[Any] | None     # None: jax.devices()
  chip: roofline.Chip | None
  budget_bytes: float


def _target(c: config_dict.ConfigDict) -> _Target:
  """`dry_run_topology`'s devices, chip and compiler-allowed HBM per device (one ValueError for a name libtpu
  rejects or a mesh that does not span the slice); without one, this host and `dry_run_memory_gb`."""
  if not c.dry_run_topology:
    return _Target(devices=None, chip=None, budget_bytes=float(c.dry_run_memory_gb) * _GIB)
  devices = tpu.topology_devices(c.dry_run_topology)
  chip = tpu.chip_of(devices)
  sizing_checks.check_topology_mesh(c, len(devices))
  budget = tpu.compiler_hbm_bytes(devices, fallback=chip.compiler_hbm_bytes)
  return _Target(devices=devices, chip=chip, budget_bytes=float(budget))


def _describe_devices(c: config_dict.ConfigDict, target: _Target, mesh) -> str:
  if target.chip is None:
    return f"{mesh.devices.size} {jax.devices()[0].platform} devices"
  chips = tpu.slice_chips(target.devices, target.chip)
  return f"{c.dry_run_topology}: {mesh.devices.size} {target.devices[0].device_kind!r} devices on {chips} chips"


def _waves(c: config_dict.ConfigDict, mesh) -> str:
  wave = rollout_sizing.prompts_per_wave(c, mesh.devices.size, 1) * c.rollout.n_samples
  return f", sampled in waves of {wave}" if wave and wave < c.trainer.batch_size * c.rollout.n_samples else ""


def _log_header(c: config_dict.ConfigDict, arch: Qwen2Config, target: _Target, mesh, log) -> None:
  sizes = dict(mesh.shape)
  rows = c.trainer.batch_size * c.rollout.n_samples
  log(f"model: {c.model.shape_preset or c.model.path or 'tiny'}  parameters: {arch.num_params():,} "
      f"({arch.num_params() / 1e9:.2f} B)")
  log(f"mesh: data={sizes['data']} fsdp={sizes['fsdp']} tensor={sizes['tensor']} on "
      f"{_describe_devices(c, target, mesh)}  rollout rows per step: {rows}{_waves(c, mesh)} (mini-batch "
      f"{rows // c.actor.num_mini_batches}; micro-batch {c.actor.micro_batch_size_per_device} per device)  "
      f"context {c.rollout.max_prompt_length} + {c.rollout.max_response_length}")
  if target.chip is not None:
    log(f"chip: {target.chip.describe()}; XLA:TPU allows {target.budget_bytes / _GIB:.2f} GiB per device: the "
        f"verdict's budget")
    return
  log("note: these figures are an estimate from XLA:CPU, whose layouts and schedule differ from an "
      "accelerator's; --config.dry_run_topology=v5e:2x4 (or another TPU slice) compiles with XLA:TPU")
  if not _memory_scheduled():
    log(f"note: XLA:CPU schedules for concurrency here and keeps more buffers alive than an accelerator would; "
        f"set XLA_FLAGS={_MEMORY_SCHEDULER_FLAG} (the train CLI does) for representative figures")


def dry_run(c: config_dict.ConfigDict, *, verbose: bool = True) -> DryRunReport:
  """Compiles every program of one step of `c` on its mesh (over `dry_run_topology`'s TPU devices
  when set, else this host's); prints the table and the verdict, and writes `dry_run_report` when set."""
  arch = _architecture(c)
  target = _target(c)
  mesh = build.build_mesh(c, devices=target.devices)
  log = (lambda line: print(line, flush=True)) if verbose else None
  if log:
    _log_header(c, arch, target, mesh, log)
  measured, held = size_programs(c, arch, mesh, log=log)
  paged = paged_sizing.plan(c, arch, mesh, measured, budget_bytes=target.budget_bytes,
                            observation=observation_tokens(c), remeasure=lambda pages: size_programs(
                                c, arch, mesh, programs=paged_sizing.SLOT_PROGRAMS, pages_per_device=pages)[0])
  report = DryRunReport(num_params=arch.num_params(), mesh=dict(mesh.shape), programs=measured,
                        budget_bytes=target.budget_bytes, topology=c.dry_run_topology or None, chip=target.chip,
                        paged=paged)
  if log:
    log(f"per-device memory and cost, XLA:{'TPU' if target.chip else 'CPU'}'s compiled figures:")
    log(report.table())
    for line in report.checks():
      log(line)
    log("resident state per device, as the compiler lays it out: "
        + ", ".join(f"{k} {v / _GIB:.2f} GiB" for k, v in held.items()))
  if c.dry_run_report:
    path = pathlib.Path(c.dry_run_report).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if log:
      log(f"report: {path}")
  if log:
    log(report.verdict())
  return report
