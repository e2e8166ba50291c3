"""The optimized HLO text of a compiled program (`Compiled.as_text()`) as computations of instructions: what
`hlo_flops` and `hlo_loops` read (names, shapes, opcodes, operands, attributes and which instruction is a
computation's root)."""

from __future__ import annotations

import dataclasses
import re

_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  shape: str                       # e.g. `f32[8,32]{1,0}` or `(s32[], f32[8,32]{1,0})`
  opcode: str
  operands: tuple[str, ...]
  literal: str                     # the text inside the parentheses (a constant's value, a parameter's number)
  attributes: str
  root: bool = False

  @property
  def dims(self) -> tuple[int, ...] | None:
    """The array's dimensions, None for a tuple."""
    return dims(self.shape)

  @property
  def dtype(self) -> str | None:
    return dtype(self.shape)


def dims(shape: str) -> tuple[int, ...] | None:
  """An array shape's dimensions (`f32[8,32]{1,0}` -> (8, 32)), None for a tuple."""
  match = _ARRAY.match(shape)
  if match is None:
    return None
  return tuple(int(d) for d in match.group(2).split(",") if d)


def dtype(shape: str) -> str | None:
  """An array shape's element type (`s32`, `f32`, `pred`), None for a tuple."""
  match = _ARRAY.match(shape)
  return None if match is None else match.group(1)


def tuple_elements(shape: str) -> list[str]:
  """`(a, (b, c), d)` -> ["a", "(b, c)", "d"]: a tuple shape's top-level elements (layouts' commas kept inside)."""
  if not shape.startswith("("):
    return []
  out, depth, start = [], 0, 1
  for i, ch in enumerate(shape[1:-1] + ",", start=1):
    depth += (ch in "([{") - (ch in ")]}")
    if ch == "," and depth == 0:
      out.append(shape[start:i].strip())
      start = i + 1
  return [e for e in out if e]


def _split_operands(rest: str) -> tuple[str, str]:
  """`a, b), attr=...` -> ("a, b", "attr=...") at the parenthesis that closes the operand list."""
  depth = 1
  for i, ch in enumerate(rest):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      return rest[:i], rest[i + 1:]
  return rest, ""


def parse(text: str) -> tuple[dict[str, list[Instruction]], str]:
  """The module's computations (name -> instructions) and the entry computation's name."""
  computations: dict[str, list[Instruction]] = {}
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
      root, name, shape, opcode, rest = match.groups()
      operands, attributes = _split_operands(rest)
      current.append(Instruction(name, shape, opcode, tuple(re.findall(r"%([\w.\-]+)", operands)),
                                 operands.strip(), attributes, root=bool(root)))
  return computations, entry


def called(attributes: str, key: str) -> list[str]:
  """The computations an instruction names under `key` (`calls=%f`, `branch_computations={%a, %b}`)."""
  match = re.search(r"\b" + key + r"=(?:\{([^}]*)\}|(%?[\w.\-]+))", attributes)
  names = "" if match is None else match.group(1) or match.group(2)
  return [n.strip().lstrip("%") for n in names.split(",") if n.strip()]
