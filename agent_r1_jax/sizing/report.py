"""The dry run's figures: one compiled program's per-device memory and costs (`ProgramMemory`) and the run's
report (`DryRunReport`): the printed table, the checks beside it, the verdict, the estimated step and the JSON."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from agent_r1_jax.sizing import roofline

_GIB = float(1 << 30)


@dataclasses.dataclass
class ProgramMemory:
  """Per-device bytes and costs of one compiled program, and what stays resident beside it.

  A program the compiler refused as too large for the device (RESOURCE_EXHAUSTED) has no memory analysis:
  its `arguments`, `outputs`, `temporaries`, `aliased`, `flops` and `bytes_accessed` are None, `error` holds the
  message's first line and `required` the total the compiler said it needs (arguments, outputs and temporaries).
  """
  name: str
  arguments: int | None
  outputs: int | None
  temporaries: int | None
  aliased: int | None         # output bytes that reuse donated argument buffers
  resident: float             # state on the device beside the program, not its argument (`memory.resident_bytes`)
  compile_seconds: float
  flops: float | None = None  # `cost_analysis()`: per device, a loop body counted once
  bytes_accessed: float | None = None
  required: int | None = None
  error: str | None = None
  # Matmul FLOPs per device of one `iteration` (a learner pass's "micro-batch", a "decode step": one trip of the
  # decode loop, whose stop is data, or else the whole "call") from the compiled HLO with every loop expanded
  # (`hlo_flops`); None with `flops_unknown` saying why where a loop's trips are not proven. For an update, the
  # analytic count beside.
  iteration_flops: float | None = None
  flops_unknown: str | None = None
  iteration: str = "call"
  micro_flops_analytic: float | None = None
  iterations_per_step: int = 1  # how often one RL step runs that iteration (the step-time estimate)
  # Decode: the bytes one step must read per device (`memory.decode_step_bytes`; paged: the worst case's weights +
  # cache attended at hd, and at the pages' padded hd', `paged_sizing.decode_checks`), beside `bytes_accessed`.
  must_read: float | None = None
  must_read_padded: float | None = None
  # A paged slot program's kernel per iteration (`paged_sizing.add_kernel_cost`), which `cost_analysis` cannot see
  # inside: its HBM bytes and FLOPs, added to the compiler's for the roofline.
  kernel_bytes: float | None = None
  kernel_flops: float | None = None

  @property
  def iteration_bytes(self) -> float | None:
    """Bytes of one iteration: the compiler's count plus the kernel's."""
    return None if self.bytes_accessed is None else self.bytes_accessed + (self.kernel_bytes or 0.0)

  @property
  def total(self) -> int | None:
    if self.error is not None:
      return self.required
    return self.arguments + self.outputs - self.aliased + self.temporaries

  @property
  def peak(self) -> float | None:
    return None if self.total is None else self.total + self.resident

  def fits(self, budget_bytes: float) -> bool:
    return self.error is None and self.peak <= budget_bytes


@dataclasses.dataclass
class DryRunReport:
  """What `dry_run` prints and writes: the parameter count, the mesh, one row per program and the verdict
  against `budget_bytes` per device (`dry_run_memory_gb`, or with a TPU `topology` the HBM its compiler
  allows one device of `chip`)."""
  num_params: int
  mesh: dict[str, int]
  programs: list[ProgramMemory]
  budget_bytes: float
  topology: str | None = None
  chip: roofline.Chip | None = None
  paged: Any = None  # `paged_sizing.PoolPlan` of a paged slot engine run

  @property
  def peak(self) -> ProgramMemory:
    return max(self.programs, key=lambda p: math.inf if p.peak is None else p.peak)

  @property
  def fits(self) -> bool:
    return all(p.fits(self.budget_bytes) for p in self.programs)

  def step_seconds(self) -> dict[str, float] | None:
    """Roofline seconds of one RL step per program (and `total`): each iteration at max(its loop-expanded
    FLOPs / peak, its bytes / bandwidth), times the iterations a step runs. None on XLA:CPU, and where a
    program's FLOPs are unknown (`ProgramMemory.flops_unknown`: no partial count stands in)."""
    seconds = {p.name: self.estimated_seconds(p) for p in self.programs}
    if any(t is None for t in seconds.values()):
      return None
    out = {p.name: seconds[p.name] * p.iterations_per_step for p in self.programs}
    out["total"] = sum(out.values())
    return out

  def estimated_seconds(self, p: ProgramMemory) -> float | None:
    """Roofline seconds of one iteration of `p` (`p.iteration`) on the chip: max(its loop-expanded FLOPs / peak,
    its bytes accessed / bandwidth). None on XLA:CPU, for a refused program, or where its FLOPs are unknown."""
    if self.chip is None or p.iteration_flops is None or p.bytes_accessed is None:
      return None
    return roofline.estimate_seconds(p.iteration_flops + (p.kernel_flops or 0.0), p.iteration_bytes, self.chip)

  def table(self) -> str:
    head = (f"  {'program':<15s} {'args':>8s} {'outputs':>8s} {'donated':>8s} {'temps':>8s} {'total':>8s} "
            f"{'+resident':>9s} {'peak':>8s} {'GFLOP':>9s} {'iter GF':>9s} {'accessed':>8s} {'est ms':>8s} "
            f"{'fits':>4s} {'compile':>8s}")
    lines = [head, "  " + "-" * (len(head) - 2)]
    for p in self.programs:
      seconds = self.estimated_seconds(p)
      lines.append(f"  {p.name:<15s} {_cell(p.arguments)} {_cell(p.outputs)} {_cell(p.aliased)} "
                   f"{_cell(p.temporaries)} {_cell(p.total)} {_cell(p.resident, width=9)} {_cell(p.peak)} "
                   f"{_cell(p.flops, 1e9, 9, 3)} {_flops_cell(p)} "
                   f"{_cell(p.iteration_bytes, digits=3)} {_cell(seconds, 1e-3, digits=3)} "
                   f"{'yes' if p.fits(self.budget_bytes) else 'no':>4s} {p.compile_seconds:7.1f}s")
    lines.append("  (GiB per device; total = args + outputs - donated + temps; peak = total + resident state, as the "
                 "compiler lays it out; GFLOP and accessed GiB per device from cost_analysis, a loop body counted "
                 "once; iter GF: matmul GFLOP per device of one iteration, every loop expanded: a learner pass's "
                 "micro-batch, a decode program's decode step (one trip of its data-dependent loop), else the call; "
                 "? where a loop's trips are not proven; a paged program's accessed adds its kernel's reads and its "
                 "est ms the kernel's FLOPs too (sizing.rpa_cost); est ms: roofline max(iter GF / peak FLOP/s, "
                 "accessed / HBM bandwidth) of one iteration)")
    for p in self.programs:
      if p.flops_unknown is not None:
        lines.append(f"  {p.name}: iter GF unknown: {p.flops_unknown}")
    for p in self.programs:
      if p.error is not None:
        lines.append(f"  {p.name}: {p.error}")
    return "\n".join(lines)

  def checks(self) -> list[str]:
    """The lines that set compiled figures beside what they should be: decode's bytes per step against the
    bytes it must read, an update's FLOPs per micro-batch against the analytic count."""
    lines = []
    for p in self.programs:
      if p.must_read and p.bytes_accessed and p.must_read_padded is None:
        lines.append(f"  {p.name}: {p.bytes_accessed / _GIB:.2f} GiB accessed per step (the compiler's count, "
                     f"one-time work outside the loop included) / {p.must_read / _GIB:.2f} GiB it must read "
                     f"(weights + KV cache) = {p.bytes_accessed / p.must_read:.2f}x")
      if p.iteration_flops and p.micro_flops_analytic:
        lines.append(f"  {p.name}: {p.iteration_flops / 1e12:.3f} TFLOP per micro-batch per device compiled "
                     f"(matmuls, every loop expanded) / {p.micro_flops_analytic / 1e12:.3f} analytic (6 x parameters "
                     f"x tokens + attention + recompute) = {p.iteration_flops / p.micro_flops_analytic:.2f}x")
    lines += self.paged.lines() if self.paged is not None else []
    step = self.step_seconds()
    if step is not None:
      parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in step.items() if name != "total")
      lines.append(f"  estimated RL step: {step['total']:.0f} s ({step['total'] / 60:.1f} min; {parts} s), from the "
                   f"compiler's counts at the chip's peak and bandwidth, every turn using its full token budget; an "
                   f"estimate, no TPU ran")
    unknown = [p for p in self.programs if p.flops_unknown is not None]
    if self.chip is not None and unknown:
      lines.append(f"  estimated RL step: none, the FLOPs of {', '.join(p.name for p in unknown)} are unknown (a "
                   f"loop's trips not proven; no partial count stands in)")
    return lines

  def verdict(self) -> str:
    limit = (f"XLA:TPU's limit for one {self.chip.name} device of {self.topology}" if self.chip else
             "--config.dry_run_memory_gb, against XLA:CPU's estimate")
    budget = f"{self.budget_bytes / _GIB:.2f} GiB per device ({limit})"
    if self.fits:
      worst = self.peak
      return f"verdict: fits in {budget}; largest peak: {worst.name}, {worst.peak / _GIB:.2f} GiB"
    over = [p for p in self.programs if not p.fits(self.budget_bytes)]
    needs = ", ".join(f"{p.name} {'?' if p.peak is None else f'{p.peak / _GIB:.2f}'} GiB"
                      + (" (refused by the compiler)" if p.error else "") for p in over)
    return f"verdict: does NOT fit in {budget}: {needs}"

  def to_json(self) -> dict[str, Any]:
    """The report as JSON values, bytes as ints (None where a refused program has no figure)."""
    return {"topology": self.topology, "chip": None if self.chip is None else dataclasses.asdict(self.chip),
            "chip_hbm_bytes": int(self.budget_bytes), "fits": self.fits, "mesh": dict(self.mesh),
            "num_params": int(self.num_params), "programs": [self._program_json(p) for p in self.programs],
            "estimated_step_seconds": self.step_seconds(),
            **({"paged": self.paged.to_json()} if self.paged is not None else {})}

  def _program_json(self, p: ProgramMemory) -> dict[str, Any]:
    out = {"name": p.name, "arguments": _int(p.arguments), "outputs": _int(p.outputs),
           "temporaries": _int(p.temporaries), "aliased": _int(p.aliased), "total": _int(p.total),
           "resident": _int(p.resident), "peak": _int(p.peak), "flops": _int(p.flops),
           "bytes_accessed": _int(p.bytes_accessed), "fits": p.fits(self.budget_bytes),
           "compile_seconds": p.compile_seconds, "estimated_seconds_per_iteration": self.estimated_seconds(p)}
    if p.must_read is not None:
      out["must_read_bytes"] = int(p.must_read)
    if p.must_read_padded is not None:
      out["must_read_padded_bytes"] = int(p.must_read_padded)
    if p.kernel_bytes is not None:
      out.update(kernel_bytes=p.kernel_bytes, kernel_flops=p.kernel_flops)
    if p.iteration_flops is not None or p.flops_unknown is not None:
      out.update(iteration_flops=p.iteration_flops, iteration_flops_exact=p.flops_unknown is None,
                 iteration=p.iteration, iterations_per_step=p.iterations_per_step)
    if p.flops_unknown is not None:
      out["iteration_flops_unknown"] = p.flops_unknown
    if p.micro_flops_analytic is not None:
      out["micro_batch_flops_analytic"] = p.micro_flops_analytic
    if p.error is not None:
      out["error"] = p.error
    return out


def _cell(value: float | None, unit: float = _GIB, width: int = 8, digits: int = 2) -> str:
  """`value / unit` right-aligned in `width` columns, "-" for None."""
  return f"{'-':>{width}s}" if value is None else f"{value / unit:{width}.{digits}f}"


def _flops_cell(p: ProgramMemory) -> str:
  """`p`'s iteration GFLOP, "?" where they are unknown, "-" where the program has none (refused)."""
  return f"{'?':>9s}" if p.flops_unknown is not None else _cell(p.iteration_flops, 1e9, 9, 3)


def _int(value: float | None) -> int | None:
  return None if value is None else int(value)


# --------------------------------------------------------------------------------------------------
# Abstract state: shapes and shardings of everything a step holds, no arrays.
