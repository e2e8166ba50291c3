"""The exact trip count of an HLO `while` loop, or None where its HLO does not prove one.

XLA annotates most loops with `known_trip_count`; where it does not (the TPU compiler's windowed matmuls, a
loop whose test XLA:CPU rewrote in terms of a second counter, a negative annotation such as the -2 XLA:CPU writes
for a loop that never runs) the count is proven by a small symbolic evaluation of the loop's HLO. Over the loop
state's integer scalars x_i, the condition must reduce to one compare

    f(x) <direction> 0,   f(x) = sum_i a_i x_i + c   (lhs - rhs of the compare, either operand order)

and each x_i it reads must start at a constant s_i (the caller's init tuple) and advance by a constant d_i per
trip (the body's root: x_i + d_i). After k trips f = A + B k with A = sum_i a_i s_i + c and B = sum_i a_i d_i,
so the trips are the first k >= 0 at which the compare fails (`_first_failure`, a closed form for every
direction LT, LE, GT, GE, EQ, NE; zero trips included). Values are followed through copies, bitcasts, widening
converts, scalar broadcasts and reshapes, adds, subtracts, negates, multiplies by constants, tuples and the
parameters of fusions and calls, as integers: each counter and each side of the compare must stay within its
type (checked at k = 0 and at the last k, between which it is monotone). Anything else (a data-dependent bound, a
stop flag, a start that is not a constant, a step that is not, a compare that never fails, a counter that would
wrap) is None: unknown, never a guess.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Optional, Union

from agent_r1_jax.sizing.hlo_text import Instruction, called, dtype, tuple_elements

_INTEGER = re.compile(r"^([su])(\d+)\[\]")


@dataclasses.dataclass(frozen=True)
class _Affine:
  """sum over (i, a) in `coefficients` of a * x_i, plus `constant`: x_i the loop state's element i."""
  coefficients: tuple[tuple[int, int], ...]  # sorted by element, no zero coefficient
  constant: int

  def plus(self, other: _Affine, sign: int = 1) -> _Affine:
    merged = dict(self.coefficients)
    for i, a in other.coefficients:
      merged[i] = merged.get(i, 0) + sign * a
    return _Affine(tuple(sorted((i, a) for i, a in merged.items() if a)), self.constant + sign * other.constant)

  def times(self, factor: int) -> _Affine:
    return _Affine(tuple((i, a * factor) for i, a in self.coefficients if a * factor), self.constant * factor)

  def at(self, start: dict[int, int], step: dict[int, int], k: int) -> int:
    """The value after k trips of a loop whose element i starts at start[i] and advances by step[i]."""
    return self.constant + sum(a * (start[i] + k * step[i]) for i, a in self.coefficients)


@dataclasses.dataclass(frozen=True)
class _Compare:
  direction: str
  lhs: _Affine
  rhs: _Affine
  operand_shape: str  # the type both sides are compared in, e.g. `s32[]`


# Resolves parameter `n` of a computation at tuple `path` (element indices) to a value, or to None.
_Binding = Callable[[int, tuple[int, ...]], Optional[Union[_Affine, _Compare]]]


def trip_count(loop: Instruction, caller: str, computations: dict[str, list[Instruction]]) -> int | None:
  """The trips of the `while` instruction `loop` of computation `caller` (module docstring)."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attributes)
  if known:
    return int(known.group(1))
  body, condition = called(loop.attributes, "body"), called(loop.attributes, "condition")
  if not body or not condition or not loop.operands:
    return None
  evaluate = _Evaluator(computations)
  state = tuple_elements(loop.shape)

  def counter(n: int, path: tuple[int, ...]) -> _Affine | None:
    scalar = len(path) == 1 and path[0] < len(state) and _INTEGER.match(state[path[0]])
    return _Affine(((path[0], 1),), 0) if n == 0 and scalar else None

  test = evaluate.root(condition[0], (), counter)
  if not isinstance(test, _Compare):
    return None
  start, step = {}, {}
  for i in sorted({i for i, _ in test.lhs.coefficients + test.rhs.coefficients}):
    advanced = evaluate.root(body[0], (i,), counter)
    initial = evaluate.value(caller, loop.operands[0], (i,), lambda n, path: None)  # no parameter: a constant
    if not isinstance(advanced, _Affine) or advanced.coefficients != ((i, 1),) or not isinstance(initial, _Affine):
      return None
    start[i], step[i] = initial.constant, advanced.constant
  difference = test.lhs.plus(test.rhs, -1)
  a = difference.at(start, step, 0)
  trips = _first_failure(test.direction, a, difference.at(start, step, 1) - a)
  if trips is None:
    return None
  # Each counter and each side of the compare is monotone in k: in range at both ends, in range throughout.
  ends = [(state[i], start[i] + k * step[i]) for i in start for k in (0, trips)]
  ends += [(test.operand_shape, side.at(start, step, k)) for side in (test.lhs, test.rhs) for k in (0, trips)]
  return trips if all(_fits(shape, value) for shape, value in ends) else None


def _first_failure(direction: str, a: int, b: int) -> int | None:
  """min {k >= 0 : not (a + b k <direction> 0)}; None when the compare holds for every k.

  GT and GE negate f (a + b k > 0 <=> -a - b k < 0), LE shifts it (f <= 0 <=> f - 1 < 0) onto LT: f < 0 fails
  at once when a >= 0, never when b <= 0, else first at k = ceil(-a / b).
  """
  if direction in ("GT", "GE"):
    a, b, direction = -a, -b, {"GT": "LT", "GE": "LE"}[direction]
  if direction == "LE":
    a, direction = a - 1, "LT"
  if direction == "LT":
    return 0 if a >= 0 else (-(a // b) if b > 0 else None)
  if direction == "NE":  # fails where f reaches 0 exactly
    return 0 if a == 0 else (-a // b if b and -a % b == 0 and -a // b > 0 else None)
  if direction == "EQ":
    return 0 if a != 0 else (1 if b != 0 else None)
  return None


def _fits(shape: str, value: int) -> bool:
  """Whether `value` is representable in the integer scalar type of `shape` (`s32[]`, `u8[]`)."""
  kind, bits = _INTEGER.match(shape).groups()
  low, high = (-(1 << int(bits) - 1), (1 << int(bits) - 1) - 1) if kind == "s" else (0, (1 << int(bits)) - 1)
  return low <= value <= high


def _widens(source: str | None, target: str | None) -> bool:
  """Whether every value of integer type `source` (`s32`) is one of `target`."""
  s, t = (re.fullmatch(r"([su])(\d+)", x or "") for x in (source, target))
  if s is None or t is None:
    return False
  (s_kind, s_bits), (t_kind, t_bits) = s.groups(), t.groups()
  return (s_kind == t_kind and int(t_bits) >= int(s_bits)) or (s_kind == "u" and t_kind == "s"
                                                               and int(t_bits) > int(s_bits))


class _Evaluator:
  """Values of a module's scalar integer instructions as affine functions of a loop's state (`_Affine`), and of
  a compare as `_Compare`; None for anything else."""

  def __init__(self, computations: dict[str, list[Instruction]]):
    self.computations = computations
    self.by_name = {name: {inst.name: inst for inst in insts} for name, insts in computations.items()}

  def root(self, computation: str, path: tuple[int, ...], bind: _Binding):
    roots = [inst for inst in self.computations.get(computation, []) if inst.root]
    return self.value(computation, roots[0].name, path, bind) if roots else None

  def value(self, computation: str, name: str, path: tuple[int, ...], bind: _Binding):
    """The value of instruction `name` of `computation` at tuple `path`, its parameters resolved by `bind`:
    tuples, copies and calls followed here, scalar arithmetic by `_scalar`."""
    inst = self.by_name.get(computation, {}).get(name)
    if inst is None:
      return None
    op, args = inst.opcode, inst.operands
    if op == "get-tuple-element":
      return self.value(computation, args[0], (int(re.search(r"index=(\d+)", inst.attributes)[1]),) + path, bind)
    if op == "tuple":
      return self.value(computation, args[path[0]], path[1:], bind) if path and path[0] < len(args) else None
    if op == "parameter":
      return bind(int(inst.literal), path)
    if op in ("copy", "bitcast"):  # the same value, also for a tuple
      return self.value(computation, args[0], path, bind)
    if op in ("fusion", "call"):
      callee = (called(inst.attributes, "calls") or called(inst.attributes, "to_apply"))[:1]
      operand = lambda n, p: self.value(computation, args[n], p, bind) if n < len(args) else None  # noqa: E731
      return self.root(callee[0], path, operand) if callee else None
    if path or inst.dims != ():
      return None
    shapes = [self.by_name[computation][a].shape if a in self.by_name[computation] else "" for a in args]
    return _scalar(inst, [self.value(computation, a, (), bind) for a in args], shapes)


def _scalar(inst: Instruction, operands: list, shapes: list[str]) -> _Affine | _Compare | None:
  """The value of the scalar instruction `inst` from its operands' values and shapes: an integer constant, a
  widening convert, a scalar broadcast or reshape, an add, subtract, negate, multiply by a constant or compare."""
  if inst.opcode == "constant":
    integer = _INTEGER.match(inst.shape) and re.fullmatch(r"-?\d+", inst.literal)
    return _Affine((), int(inst.literal)) if integer else None
  if not operands or not all(isinstance(o, _Affine) for o in operands):
    return None
  op, first = inst.opcode, operands[0]
  if op in ("reshape", "broadcast") or (op == "convert" and _widens(dtype(shapes[0]), inst.dtype)):
    return first
  if op in ("add", "subtract"):
    return first.plus(operands[1], 1 if op == "add" else -1)
  if op == "negate":
    return first.times(-1)
  if op == "multiply":
    constant = [o for o in operands if not o.coefficients]
    return operands[1 - operands.index(constant[0])].times(constant[0].constant) if constant else None
  direction = re.search(r"direction=(\w+)", inst.attributes)
  if op == "compare" and direction and _INTEGER.match(shapes[0]):
    return _Compare(direction[1], first, operands[1], shapes[0])
  return None
