"""Matmul FLOPs of a compiled program with every counted loop expanded, read from its optimized HLO text.

`Compiled.cost_analysis()` counts the body of a `while` loop once, so the flops of a program whose attention
runs in blocks (`lax.map` / `lax.scan`) come out per block. This walks the optimized module instead
(`Compiled.as_text()`), and counts

    dot          2 * prod(output dims) * prod(lhs contracting dims)
    convolution  2 * (output elements / prod(output spatial dims)) * input features per group
                   * prod over spatial dims d of (sum over output positions o of the kernel taps that land on
                     the input, padding, strides and dilations applied)

(the TPU compiler writes batched matmuls as convolutions whose window walks a batch dimension over padding; only
taps on real input count, as in XLA's own `HloCostAnalysis`). A fusion, call or async computation adds the
computations it calls; a `while` adds `trips * (body + condition)`, where `trips` is the bound its condition
compares the loop counter with, less its start and divided by its constant step (`lax.scan`, `lax.map`,
`fori_loop` with static bounds, the TPU's windowed matmuls; or XLA's own `known_trip_count`), or 1 when the bound
is not a constant (a data-dependent loop, e.g. decoding: then the figure is per iteration, as cost_analysis's);
a `conditional` adds its costliest branch. Elementwise work is not counted: on programs without loops the
result equals cost_analysis's flops up to that (tested).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"^[a-z]+\d*\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class _Instruction:
  name: str
  dims: tuple[int, ...] | None     # None for a tuple-shaped result
  opcode: str
  operands: tuple[str, ...]
  literal: str                     # the text inside the parentheses (a constant's value)
  attributes: str


def _dims(shape: str) -> tuple[int, ...] | None:
  match = _ARRAY.match(shape)
  if match is None:
    return None
  return tuple(int(d) for d in match.group(1).split(",") if d)


def _split_operands(rest: str) -> tuple[str, str]:
  """`a, b), attr=...` -> ("a, b", "attr=...") at the parenthesis that closes the operand list."""
  depth = 1
  for i, ch in enumerate(rest):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      return rest[:i], rest[i + 1:]
  return rest, ""


def parse(text: str) -> tuple[dict[str, list[_Instruction]], str]:
  """The module's computations (name -> instructions) and the entry computation's name."""
  computations: dict[str, list[_Instruction]] = {}
  entry, current = "", None
  for line in text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      current = computations.setdefault(head.group(1), [])
      entry = head.group(1) if line.startswith("ENTRY") else entry
      continue
    if line.startswith("}"):
      current = None
      continue
    match = _INSTRUCTION.match(line) if current is not None else None
    if match:
      name, shape, opcode, rest = match.groups()
      operands, attributes = _split_operands(rest)
      current.append(_Instruction(name, _dims(shape), opcode, tuple(re.findall(r"%([\w.\-]+)", operands)),
                                  operands.strip(), attributes))
  return computations, entry


def _called(attributes: str, key: str) -> list[str]:
  match = re.search(key + r"=\{?([%\w.\-, ]+?)\}?(?:,|$)", attributes)
  return [] if match is None else [n.strip().lstrip("%") for n in match.group(1).split(",") if n.strip()]


def _dot_flops(inst: _Instruction, dims_of: dict[str, tuple[int, ...] | None]) -> float:
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


def _convolution_flops(inst: _Instruction, dims_of: dict[str, tuple[int, ...] | None]) -> float:
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


def _tuple_index(inst: _Instruction | None) -> int | None:
  """The element a `get-tuple-element` reads, else None."""
  if inst is None or inst.opcode != "get-tuple-element":
    return None
  match = re.search(r"index=(\d+)", inst.attributes)
  return None if match is None else int(match.group(1))


def _constant(inst: _Instruction | None) -> int | None:
  if inst is None or inst.opcode != "constant" or not re.fullmatch(r"-?\d+", inst.literal):
    return None
  return int(inst.literal)


def _trip_count(loop: _Instruction, condition: list[_Instruction], body: list[_Instruction],
                caller: list[_Instruction]) -> int:
  """The trips of `loop`: XLA's `known_trip_count` when it annotated one; else ceil((N - start) / step) for a
  condition `counter < N` on a tuple element that the body's root advances by a constant `step` from a constant
  `start` (0 and 1 when they are not visible); else 1 (a data-dependent bound).

  The TPU compiler's windowed (collective) matmuls advance their counter by 2 per trip (`counter < 16`
  for 8 trips over 32 shards), so the bound alone would count them twice.
  """
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attributes)
  if known:
    return int(known.group(1))
  in_condition = {inst.name: inst for inst in condition}
  bound = index = None
  for inst in condition:
    if inst.opcode in ("compare", "fusion") and ("direction=LT" in inst.attributes or inst.opcode == "fusion"):
      bounds = [_constant(in_condition.get(o)) for o in inst.operands]
      bounds = [b for b in bounds if b is not None]
      if bounds and bounds[-1] > 0:
        bound = bounds[-1]
        index = next((i for i in (_tuple_index(in_condition.get(o)) for o in inst.operands) if i is not None),
                     None)
        break
  if bound is None:
    return 1
  step, start = 1, 0
  if index is not None and body and body[-1].opcode == "tuple" and index < len(body[-1].operands):
    in_body = {inst.name: inst for inst in body}
    advance = in_body.get(body[-1].operands[index])
    if advance is not None and advance.opcode == "add":
      steps = [_constant(in_body.get(o)) for o in advance.operands]
      steps = [c for c in steps if c is not None]
      step = steps[0] if steps and steps[0] > 0 else 1
    in_caller = {inst.name: inst for inst in caller}
    init = in_caller.get(loop.operands[0]) if loop.operands else None
    if init is not None and init.opcode == "tuple" and index < len(init.operands):
      start = _constant(in_caller.get(init.operands[index])) or 0
  return max(1, -(-(bound - start) // step))


def matmul_flops(text: str) -> float:
  """Dot and convolution FLOPs of the optimized HLO module `text`, every loop expanded (module docstring)."""
  computations, entry = parse(text)

  @functools.lru_cache(maxsize=None)
  def cost(name: str) -> float:
    instructions = computations.get(name, [])
    dims_of = {inst.name: inst.dims for inst in instructions}
    total = 0.0
    for inst in instructions:
      if inst.opcode == "dot":
        total += _dot_flops(inst, dims_of)
      elif inst.opcode == "convolution":
        total += _convolution_flops(inst, dims_of)
      elif inst.opcode == "while":
        body, condition = _called(inst.attributes, "body"), _called(inst.attributes, "condition")
        trips = (_trip_count(inst, computations.get(condition[0], []), computations.get(body[0], []) if body else [],
                             instructions) if condition else 1)
        total += trips * sum(cost(c) for c in body + condition)
      elif inst.opcode == "conditional":
        total += max((cost(c) for c in _called(inst.attributes, "branch_computations")), default=0.0)
      else:
        total += sum(cost(c) for key in ("calls", "to_apply") for c in _called(inst.attributes, key))
    return total

  return cost(entry)
