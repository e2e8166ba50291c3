"""Matmul FLOPs of a compiled program with every loop expanded, read from its optimized HLO text.

`Compiled.cost_analysis()` counts the body of a `while` loop once, so the flops of a program whose attention
runs in blocks (`lax.map` / `lax.scan`) come out per block. This walks the optimized module instead
(`Compiled.as_text()`), and counts

    dot          2 * prod(output dims) * prod(lhs contracting dims)
    convolution  2 * (output elements / prod(output spatial dims)) * input features per group
                   * prod over spatial dims d of (sum over output positions o of the kernel taps that land on
                     the input, padding, strides and dilations applied)

(the TPU compiler writes batched matmuls as convolutions whose window walks a batch dimension over padding; only
taps on real input count, as in XLA's own `HloCostAnalysis`). A fusion, call or async computation adds the
computations it calls; a `conditional` its costliest branch; a `while` of n trips adds n * body + (n + 1) *
condition, n being XLA's `known_trip_count` or else proven from the loop's HLO (`hlo_loops.trip_count`).

A loop whose trips cannot be proven (a data-dependent stop, e.g. decoding) makes the count inexact unless it runs
no matmul: `FlopCount` then counts it for one trip and names it, so a caller either has the exact total
(`FlopCount.exact`) or asks explicitly for one trip of the program's data-dependent loop (`FlopCount.per_trip`),
never a silent figure. Elementwise work is not counted: on programs without loops the result equals
cost_analysis's flops up to that (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

from agent_r1_jax.sizing import hlo_loops
from agent_r1_jax.sizing.hlo_text import Instruction, called, parse


@dataclasses.dataclass(frozen=True)
class FlopCount:
  """Matmul FLOPs of a program, each loop of proven trips expanded and each unproven one counted for one trip.

  `unproven` names the `while` loops that run matmuls and whose trips are not proven, outermost first; `nested`
  says whether one of them runs inside another loop (so that `flops` does not hold one trip of it, but one per
  trip of the loop around it).
  """
  flops: float
  unproven: tuple[str, ...] = ()
  nested: bool = False

  @property
  def exact(self) -> float | None:
    """The program's FLOPs, None unless every loop that runs a matmul has proven trips."""
    return None if self.unproven else self.flops

  @property
  def per_trip(self) -> float | None:
    """FLOPs of one trip of the program's one unproven loop plus the work outside it (a decode step): None
    unless exactly one loop is unproven and it runs in no other loop."""
    return self.flops if len(self.unproven) == 1 and not self.nested else None

  def why_unknown(self, per_trip: bool = False) -> str | None:
    """What keeps `exact` (with `per_trip`, `per_trip`) unknown; None when it is known."""
    if (self.per_trip if per_trip else self.exact) is not None:
      return None
    if not self.unproven:
      return "no loop of unproven trips to take one trip of"
    return f"trips of {', '.join(self.unproven)} not proven" + (", one inside another loop" if self.nested else "")


def count(text: str) -> FlopCount:
  """Dot and convolution FLOPs of the optimized HLO module `text` (module docstring)."""
  computations, entry = parse(text)

  @functools.lru_cache(maxsize=None)
  def cost(name: str) -> FlopCount:
    instructions = computations.get(name, [])
    shape_of = {inst.name: inst.dims for inst in instructions}
    parts = []
    for inst in instructions:
      if inst.opcode == "dot":
        parts.append(FlopCount(_dot_flops(inst, shape_of)))
      elif inst.opcode == "convolution":
        parts.append(FlopCount(_convolution_flops(inst, shape_of)))
      elif inst.opcode == "while":
        parts.append(_loop_cost(inst, name, computations, cost))
      elif inst.opcode == "conditional":
        branches = [cost(c) for key in ("branch_computations", "true_computation", "false_computation")
                    for c in called(inst.attributes, key)]
        if branches:
          costliest = max(branches, key=lambda b: b.flops)
          parts.append(dataclasses.replace(_sum(branches), flops=costliest.flops))
      else:
        parts += [cost(c) for key in ("calls", "to_apply") for c in called(inst.attributes, key)]
    return _sum(parts)

  return cost(entry)


def matmul_flops(text: str) -> float | None:
  """The exact dot and convolution FLOPs of `text`, None where a loop's trips are not proven (`count`)."""
  return count(text).exact


def _sum(parts: list[FlopCount]) -> FlopCount:
  return FlopCount(sum(p.flops for p in parts), tuple(n for p in parts for n in p.unproven),
                   any(p.nested for p in parts))


def _loop_cost(loop: Instruction, caller: str, computations: dict[str, list[Instruction]], cost) -> FlopCount:
  """n * body + (n + 1) * condition for a loop of n proven trips; else one trip of each, the loop named as
  unproven unless it runs no matmul (then its trips do not change the count)."""
  body, condition = called(loop.attributes, "body"), called(loop.attributes, "condition")
  body_cost = cost(body[0]) if body else FlopCount(0.0)
  condition_cost = cost(condition[0]) if condition else FlopCount(0.0)
  inner = _sum([body_cost, condition_cost])
  trips = hlo_loops.trip_count(loop, caller, computations)
  if trips is not None:
    return FlopCount(trips * body_cost.flops + (trips + 1) * condition_cost.flops, inner.unproven,
                     bool(inner.unproven))
  if inner.flops == 0 and not inner.unproven:
    return inner
  return FlopCount(inner.flops, (loop.name,) + inner.unproven, bool(inner.unproven))


def _dot_flops(inst: Instruction, dims_of: dict[str, tuple[int, ...] | None]) -> float:
  lhs = dims_of.get(inst.operands[0])
  match = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", inst.attributes)
  if lhs is None or inst.dims is None or match is None:
    return 0.0
  contracted = math.prod(lhs[int(d)] for d in match.group(1).split(",") if d)
  return 2.0 * math.prod(inst.dims) * contracted


def _window(attributes: str) -> dict[str, list[list[int]]]:
  """`window={size=2x7 stride=2x1 pad=1_1x6_6 lhs_dilate=2x1 rhs_dilate=.. rhs_reversal=1x1}` -> per-dim lists."""
  match = re.search(r"window=\{([^}]*)\}", attributes)
  out: dict[str, list[list[int]]] = {}
  for item in (match.group(1).split() if match else []):
    key, value = item.split("=")
    out[key] = [[int(p) for p in part.split("_")] for part in value.split("x")]
  return out


def _taps(out_size: int, in_size: int, size: int, stride: int, pad_low: int, lhs_dilate: int,
          rhs_dilate: int) -> int:
  """Sum over output positions of the kernel taps that fall on a real (not padding, not dilation-hole) input."""
  total = 0
  for o in range(out_size):
    for k in range(size):
      p = o * stride + k * rhs_dilate - pad_low
      total += p >= 0 and p % lhs_dilate == 0 and p // lhs_dilate < in_size
  return total


def _convolution_flops(inst: Instruction, dims_of: dict[str, tuple[int, ...] | None]) -> float:
  lhs, rhs = (dims_of.get(n) for n in inst.operands[:2])
  labels = re.search(r"dim_labels=([\w]+)_([\w]+)->([\w]+)", inst.attributes)
  if lhs is None or rhs is None or inst.dims is None or labels is None:
    return 0.0
  lhs_l, rhs_l, out_l = labels.groups()
  window = _window(inst.attributes)
  spatial = sorted(c for c in out_l if c.isdigit())
  batch_groups = int((re.search(r"batch_group_count=(\d+)", inst.attributes) or [0, 1])[1])
  per_position = math.prod(inst.dims) / max(math.prod(inst.dims[out_l.index(c)] for c in spatial), 1)
  taps = 1
  for i, c in enumerate(spatial):
    get = lambda key, default, i=i: window.get(key, [[default]] * len(spatial))[i]  # noqa: E731
    taps *= _taps(inst.dims[out_l.index(c)], lhs[lhs_l.index(c)], get("size", 1)[0], get("stride", 1)[0],
                  get("pad", 0)[0], get("lhs_dilate", 1)[0], get("rhs_dilate", 1)[0])
  in_features = rhs[rhs_l.index("i")]  # per feature group already
  return 2.0 * per_position * taps * in_features / batch_groups
