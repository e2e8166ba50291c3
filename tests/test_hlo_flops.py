"""The loop-expanded matmul FLOP count of compiled programs.

Trip counts: loops compiled by XLA:CPU with `known_trip_count` stripped from their text, so the counter must prove
each count itself, against the trips the compiled program really runs (its final counter, read by executing it)
and XLA's own annotation; every form is asserted present in the stripped text, so no case passes vacuously.
Hand-written HLO for the forms XLA:CPU does not print (a constant on the compare's left, a step and a bound inside
fusions, `true_computation=`, a counter that would overflow). Controls: a counter that answers 1 where no
annotation is left fails every case. Without loops, XLA's cost analysis is the reference; an unknown count through
to the report's table and JSON; and a learner update compiled by the TPU compiler (libtpu) against the analytic
count of `sizing.flops`, with attention dense and in blocks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent_r1_jax.models import Qwen2Config, make_mesh
from agent_r1_jax.learner import build
from agent_r1_jax.sizing import dry_run, flops, hlo_flops, hlo_loops, roofline
from agent_r1_jax.sizing import report as report_lib
from agent_r1_jax.trainer import config as config_lib

M, K = 8, 32
DOT = 2 * M * K * K  # one [M, K] x [K, K] matmul
ANNOTATION = re.compile(r'"known_trip_count":\{"n":"(-?\d+)"\}')


def _strip(text: str) -> str:
  """`text` without XLA's trip counts: every while's backend_config dropped (it holds only loop annotations)."""
  stripped = re.sub(r"(= \([^\n]*\) while\([^\n]*?), backend_config=\{[^\n]*\}", r"\1", text)
  assert "known_trip_count" not in stripped and stripped.count(" while(") == text.count(" while(")
  return stripped


@dataclasses.dataclass(frozen=True)
class Loop:
  """`while test(i): h = tanh(h @ w); i = advance(i)` from `start`, compiled by XLA:CPU; `forms` must appear in
  its stripped text; `trips` None where the bound is data (the count must then be flagged unknown)."""
  name: str
  test: Callable
  advance: Callable
  start: int
  forms: tuple[str, ...]
  trips: int | None
  options: dict | None = None

  def compile(self, counted: bool = False):
    """XLA:CPU's program for the loop. `counted`: it also counts the trips it runs in a second counter, which
    XLA:CPU folds into the test (`10 > i` becomes `10 - ran > 0`) and leaves unannotated."""
    def f(x, w, n):
      def body(c):
        h, i, ran = c
        return jnp.tanh(h @ w), self.advance(i), ran + 1 if counted else ran
      return jax.lax.while_loop(lambda c: self.test(c[1], n), body, (x, jnp.int32(self.start), jnp.int32(0)))
    return jax.jit(f).lower(*_ARGS).compile(compiler_options=self.options)


_ARGS = np.ones((M, K), np.float32), np.ones((K, K), np.float32), jnp.int32(3)
LOOPS = [
    Loop("up_lt", lambda i, n: i < 7, lambda i: i + 1, 0, ("direction=LT",), 7),
    Loop("up_le", lambda i, n: i <= 9, lambda i: i + 1, 0, ("direction=LE",), 10),
    Loop("down_gt", lambda i, n: i > 0, lambda i: i - 1, 10, ("direction=GT", "constant(-1)"), 10),
    Loop("down_ge", lambda i, n: i >= 0, lambda i: i - 1, 10, ("direction=GE", "constant(-1)"), 11),
    # The start a copy of a constant, the step an add fusion (XLA:CPU's `wrapped_add`).
    Loop("from_4_to_10", lambda i, n: i < 10, lambda i: i + 1, 4,
         ("copy(%constant", "s32[] fusion(", "add(%param"), 6),
    Loop("by_2_from_3", lambda i, n: i < 16, lambda i: i + 2, 3, ("direction=LT", "constant(2)"), 7),
    Loop("by_3", lambda i, n: i < 10, lambda i: i + 3, 0, ("direction=LT", "constant(3)"), 4),
    Loop("ne", lambda i, n: i != 12, lambda i: i + 3, 0, ("direction=NE",), 4),
    # XLA:CPU deletes a loop that never runs unless its while-loop simplifier is off; it then annotates -2 trips
    # (and returns 10 for i, the start plus -2 steps; the second counter says 0).
    Loop("zero_trips", lambda i, n: i < 10, lambda i: i + 1, 12, ("constant(12)", "direction=LT"), 0,
         options={"xla_disable_hlo_passes": "simplify-while-loops"}),
    Loop("data_bound", lambda i, n: i < n, lambda i: i + 1, 0, ("direction=LT",), None),
    Loop("stop_flag", lambda i, n: (i < 10) & (i * i != n * n), lambda i: i + 1, 0, ("direction=LT",), None),
]


def _check(loop: Loop, text: str) -> None:
  """The stripped program's count: `loop.trips` matmuls, or unknown and one trip of it where its bound is data."""
  count = hlo_flops.count(_strip(text))
  if loop.trips is None:
    assert count.exact is None and count.per_trip == DOT and count.unproven, count
  else:
    assert count.exact == loop.trips * DOT, (count, loop.trips)


@pytest.mark.parametrize("loop", LOOPS, ids=lambda loop: loop.name)
def test_a_stripped_compiled_loop_counts_its_exact_trips_or_is_flagged_unknown(loop):
  """As written, against XLA's annotation; with a second counter (unannotated), against the trips it ran."""
  text = loop.compile().as_text()
  for form in loop.forms:
    assert form in _strip(text), (form, _strip(text))
  if loop.trips is not None and loop.trips > 0:
    assert [int(n) for n in ANNOTATION.findall(text)] == [loop.trips]
    assert hlo_flops.count(text).exact == loop.trips * DOT
  _check(loop, text)
  counted = loop.compile(counted=True)
  if loop.trips is not None:
    assert int(counted(*_ARGS)[2]) == loop.trips
  _check(loop, counted.as_text())


@pytest.mark.parametrize("loop", LOOPS, ids=lambda loop: loop.name)
@pytest.mark.parametrize("counted", [False, True])
def test_control_a_counter_answering_one_where_no_annotation_is_left_fails_every_case(loop, counted, monkeypatch):
  real = hlo_loops.trip_count
  monkeypatch.setattr(hlo_loops, "trip_count", lambda inst, caller, comps: (
      real(inst, caller, comps) if "known_trip_count" in inst.attributes else 1))
  with pytest.raises(AssertionError):
    _check(loop, loop.compile(counted).as_text())


def test_without_loops_the_count_equals_xlas_cost_analysis():
  """A dot and a convolution with padding, a stride and a dilated kernel (only taps on real input count) and no
  elementwise work: XLA's own `HloCostAnalysis` is the reference."""
  def f(x, w, image, kernel):
    return x @ w, jax.lax.conv_general_dilated(image, kernel, window_strides=(2, 1), padding=((1, 2), (3, 0)),
                                               rhs_dilation=(1, 2))

  compiled = jax.jit(f).lower(np.ones((8, 32), np.float32), np.ones((32, 16), np.float32),
                              np.ones((2, 3, 9, 7), np.float32), np.ones((4, 3, 3, 2), np.float32)).compile()
  assert " convolution(" in compiled.as_text() and " while(" not in compiled.as_text()
  assert hlo_flops.count(compiled.as_text()).exact == compiled.cost_analysis()["flops"] > 2 * 8 * 32 * 16


def test_scans_and_fori_loops_nested_count_the_product_of_their_trips():
  """`lax.scan` over 5 steps inside `fori_loop(4, 10)` (6 trips, which jax rewrites to count from 0)."""
  def f(x, ws):
    inner = lambda h: jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), h, ws)[0]  # noqa: E731
    return jax.lax.fori_loop(4, 10, lambda i, h: inner(h) * i, x)

  text = jax.jit(f).lower(np.ones((M, K), np.float32), np.ones((5, K, K), np.float32)).compile().as_text()
  assert sorted(int(n) for n in ANNOTATION.findall(text)) == [5, 6]
  assert hlo_flops.count(_strip(text)).exact == 30 * DOT


def test_a_decode_loop_is_unknown_in_total_and_exact_per_trip_with_inner_loops_expanded():
  """A data-dependent loop around a 3-step scan: per trip 3 matmuls plus the one outside; the total unknown. Inside
  a scan of 4 trips the same loop has no per-trip figure (its one trip per outer trip is no trip of it)."""
  def decode(x, ws, n):
    step = lambda c: (jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), c[0], ws)[0], c[1] + 1)  # noqa: E731
    return jax.lax.while_loop(lambda c: c[1] < n, step, (x @ ws[0], 0))[0]

  args = np.ones((M, K), np.float32), np.ones((3, K, K), np.float32), jnp.int32(2)
  count = hlo_flops.count(_strip(jax.jit(decode).lower(*args).compile().as_text()))
  assert count.exact is None and count.per_trip == 4 * DOT and len(count.unproven) == 1 and not count.nested

  nested = lambda x, ws, n: jax.lax.scan(lambda h, _: (decode(h, ws, n), None), x, None, length=4)[0]  # noqa: E731
  count = hlo_flops.count(_strip(jax.jit(nested).lower(*args).compile().as_text()))
  assert count.exact is None and count.per_trip is None and count.nested


def test_a_data_dependent_loop_without_matmuls_leaves_the_count_exact():
  """Its trips multiply nothing: `x @ w` once, then a loop of scalar adds whose bound is data."""
  def f(x, w, n):
    return x @ w, jax.lax.while_loop(lambda i: i < n, lambda i: i + 1, 0)

  text = jax.jit(f).lower(np.ones((M, K), np.float32), np.ones((K, K), np.float32), jnp.int32(3)).compile().as_text()
  assert " while(" in text and hlo_flops.count(_strip(text)).exact == DOT


@pytest.mark.parametrize("direction", ["LT", "LE", "GT", "GE", "EQ", "NE"])
def test_the_closed_form_first_failure_equals_a_plain_loop(direction):
  """`_first_failure` against stepping k until the compare fails (None: it still holds after 100 steps; with
  |a| <= 12 and |b| >= 1 a finite count is at most 13)."""
  holds = {"LT": lambda f: f < 0, "LE": lambda f: f <= 0, "GT": lambda f: f > 0, "GE": lambda f: f >= 0,
           "EQ": lambda f: f == 0, "NE": lambda f: f != 0}[direction]
  for a in range(-12, 13):
    for b in range(-4, 5):
      k = next((k for k in range(100) if not holds(a + b * k)), None)
      assert hlo_loops._first_failure(direction, a, b) == k, (direction, a, b)


_HAND = """HloModule hand

%add_step (s: s64[]) -> s64[] {
  %s = s64[] parameter(0)
  %step = s64[] constant(STEP)
  ROOT %sum = s64[] add(%s, %step)
}

%bound_test (t: s64[]) -> pred[] {
  %t = s64[] parameter(0)
  %bound = s64[] constant(BOUND)
  %wide = s64[] broadcast(%bound), dimensions={}
  ROOT %test = pred[] compare(%wide, %t), direction=DIRECTION
}

%body (p: (f32[8,32], f32[32,32], s64[])) -> (f32[8,32], f32[32,32], s64[]) {
  %p = (f32[8,32]{1,0}, f32[32,32]{1,0}, s64[]) parameter(0)
  %x = f32[8,32]{1,0} get-tuple-element(%p), index=0
  %w = f32[32,32]{1,0} get-tuple-element(%p), index=1
  %i = s64[] get-tuple-element(%p), index=2
  %dot.1 = f32[8,32]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %next = s64[] fusion(%i), kind=kLoop, calls=%add_step
  ROOT %out = (f32[8,32]{1,0}, f32[32,32]{1,0}, s64[]) tuple(%dot.1, %w, %next)
}

%cond (q: (f32[8,32], f32[32,32], s64[])) -> pred[] {
  %q = (f32[8,32]{1,0}, f32[32,32]{1,0}, s64[]) parameter(0)
  %j = s64[] get-tuple-element(%q), index=2
  ROOT %fused = pred[] fusion(%j), kind=kLoop, calls=%bound_test
}

ENTRY %main (a: f32[8,32], b: f32[32,32]) -> f32[8,32] {
  %a = f32[8,32]{1,0} parameter(0)
  %b = f32[32,32]{1,0} parameter(1)
  %first = s32[] constant(START)
  %copied = s32[] copy(%first)
  %start = s64[] convert(%copied)
  %init = (f32[8,32]{1,0}, f32[32,32]{1,0}, s64[]) tuple(%a, %b, %start)
  %loop = (f32[8,32]{1,0}, f32[32,32]{1,0}, s64[]) while(%init), condition=%cond, body=%body
  ROOT %res = f32[8,32]{1,0} get-tuple-element(%loop), index=0
}
"""


def _hand(start: int, step: int, direction: str, bound: int, counter: str = "s64", first: str = "s32") -> str:
  """`_HAND` with its counter of type `counter`, converted from a constant of type `first`."""
  text = _HAND.replace("START", str(start)).replace("STEP", str(step)).replace("DIRECTION", direction)
  return text.replace("BOUND", str(bound)).replace("s32[]", f"{first}[]").replace("s64[]", f"{counter}[]")


@pytest.mark.parametrize("start,step,direction,bound,trips", [
    (3, 2, "GT", 16, 7),     # 16 > i: 3, 5, ..., 15 (the TPU's windowed matmuls: no annotation, step 2)
    (10, -1, "LT", 0, 10),   # 0 < i: 10 down to 1
    (10, -1, "LE", 0, 11),   # 0 <= i: 10 down to 0
    (0, 1, "GE", 9, 10),     # 9 >= i
    (12, 1, "GT", 10, 0),    # 10 > 12: never
    (4, 1, "GT", 10, 6),
])
def test_hand_written_loops_with_the_constant_on_the_left_and_step_and_bound_in_fusions(start, step, direction,
                                                                                       bound, trips):
  """The start a converted copy of a constant, the step's constant inside a fusion, the bound a broadcast inside
  the condition's fusion and on the compare's left: trips against a plain loop."""
  holds = {"GT": lambda i: bound > i, "LT": lambda i: bound < i, "LE": lambda i: bound <= i,
           "GE": lambda i: bound >= i}[direction]
  i, ran = start, 0
  while holds(i):
    i, ran = i + step, ran + 1
  assert ran == trips
  assert hlo_flops.count(_hand(start, step, direction, bound)).exact == trips * DOT


@pytest.mark.parametrize("start,step,direction,bound,counter,first", [
    (0, 3, "NE", 10, "s64", "s64"),   # 10 != i: 0, 3, 6, 9, 12, ... never equal
    (0, 0, "GT", 10, "s64", "s64"),   # a step of 0: forever
    (100, 10, "GT", 127, "s8", "s8"),  # 127 > i in s8: 100, 110, 120, then 130 wraps to -126
    (10, 2**32 - 1, "LE", 0, "u32", "u32"),  # 0 <= i in u32 holds for every i: 10, 9, ..., 0, 2^32 - 1, ...
    (300, 10, "GT", 127, "s8", "s32"),  # the start converted to s8 is 44 (9 trips), not 300 (none)
])
def test_a_loop_that_never_stops_or_whose_counter_wraps_is_unknown(start, step, direction, bound, counter, first):
  """Unknown, counted for one trip and named; with XLA's annotation put back, its count."""
  text = _hand(start, step, direction, bound, counter, first)
  count = hlo_flops.count(text)
  assert count.exact is None and count.unproven == ("loop",) and count.flops == DOT
  assert hlo_flops.count(text.replace(
      "body=%body", 'body=%body, backend_config={"known_trip_count":{"n":"2"}}')).exact == 2 * DOT


@pytest.mark.parametrize("changes", [
    [("ROOT %sum = s64[] add(%s, %step)", "%twice = s64[] multiply(%s, %step)\n  %one = s64[] constant(1)\n"
      "  ROOT %sum = s64[] add(%twice, %one)")],  # 2 i + 1: 1, 3, 7, ..., 63: 6 trips, not affine in the trip
    [("ROOT %test", "%narrow = s8[] convert(%t)\n  %back = s64[] convert(%narrow)\n  ROOT %test"),
     ("compare(%wide, %t)", "compare(%wide, %back)")],  # compared as s8: 1, 3, ..., 127, then -127
    [("%first = s32[] constant(1)", "%first = s32[] parameter(2)")],  # the start is data
], ids=["doubling", "narrowed_to_s8", "data_start"])
def test_a_counter_that_is_not_affine_narrowed_or_started_from_data_is_unknown(changes):
  """`100 > i` from 1 by 2 has 50 trips (control); each change leaves no proof: unknown, never 50."""
  text = _hand(1, 2, "GT", 100)
  assert hlo_flops.count(text).exact == 50 * DOT
  for old, new in changes:
    assert text.count(old) == 1
    text = text.replace(old, new)
  assert hlo_flops.count(text).exact is None


_CONDITIONAL = """HloModule branches

%small (s: f32[8,32]) -> f32[8,32] {
  %s = f32[8,32]{1,0} parameter(0)
  ROOT %n = f32[8,32]{1,0} negate(%s)
}

%large (l: f32[8,32]) -> f32[8,32] {
  %l = f32[8,32]{1,0} parameter(0)
  %w = f32[32,32]{1,0} constant({...})
  ROOT %d = f32[8,32]{1,0} dot(%l, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (p: pred[], x: f32[8,32]) -> f32[8,32] {
  %p = pred[] parameter(0)
  %x = f32[8,32]{1,0} parameter(1)
  ROOT %c = f32[8,32]{1,0} conditional(%p, %x, %x), BRANCHES
}
"""


@pytest.mark.parametrize("branches", ["true_computation=%small, false_computation=%large",
                                      "true_computation=%large, false_computation=%small",
                                      "branch_computations={%small, %large}"])
def test_a_conditional_adds_its_costliest_branch_however_it_is_printed(branches):
  assert hlo_flops.count(_CONDITIONAL.replace("BRANCHES", branches)).exact == DOT


def test_a_compiled_conditional_adds_its_costliest_branch():
  def f(p, x, w):
    return jax.lax.cond(p, lambda x: x @ w @ w, lambda x: jnp.tanh(x), x)

  text = jax.jit(f).lower(True, np.ones((M, K), np.float32), np.ones((K, K), np.float32)).compile().as_text()
  assert " conditional(" in text and hlo_flops.count(text).exact == 2 * DOT


def _program(name: str, text: str, per_trip: bool = False) -> report_lib.ProgramMemory:
  """A report row whose loop-expanded FLOPs come from `text` as the dry run takes them."""
  count = hlo_flops.count(text)
  iteration = count.per_trip if per_trip else count.exact
  return report_lib.ProgramMemory(name=name, arguments=1, outputs=1, temporaries=1, aliased=0, resident=0.0,
                                  compile_seconds=1.0, flops=DOT, bytes_accessed=1e6, iteration_flops=iteration,
                                  flops_unknown=count.why_unknown(per_trip), iterations_per_step=10)


def test_an_unknown_count_is_a_question_mark_in_the_table_null_in_the_json_and_no_step_estimate():
  """A program with a data-dependent matmul loop beside one of 7 proven trips, on a v5e: the unknown row is `?`,
  `iteration_flops` null and not exact, the step unestimated and the line says why. Control: the same loop taken
  per trip (the decode step's named mode) is a figure, and the step is then estimated from both."""
  known = [_strip(loop.compile().as_text()) for loop in LOOPS if loop.name in ("by_2_from_3", "data_bound")]
  rows = [_program("actor_update", known[0]), _program("decode", known[1])]
  report = report_lib.DryRunReport(0, {}, rows, budget_bytes=1e9, chip=roofline.CHIPS["v5e"])
  assert _iter_cells(report.table()) == {"actor_update": f"{7 * DOT / 1e9:.3f}", "decode": "?"}
  assert "decode: iter GF unknown: trips of" in report.table()
  programs = report.to_json()["programs"]
  assert programs[0]["iteration_flops"] == 7 * DOT and programs[0]["iteration_flops_exact"] is True
  assert programs[1]["iteration_flops"] is None and programs[1]["iteration_flops_exact"] is False
  assert report.to_json()["estimated_step_seconds"] is None and report.step_seconds() is None
  assert any(line.startswith("  estimated RL step: none, the FLOPs of decode are unknown") for line in report.checks())

  per_trip = report_lib.DryRunReport(0, {}, [rows[0], _program("decode", known[1], per_trip=True)],
                                     budget_bytes=1e9, chip=roofline.CHIPS["v5e"])
  assert per_trip.to_json()["programs"][1]["iteration_flops"] == DOT
  assert per_trip.step_seconds()["decode"] == roofline.estimate_seconds(DOT, 1e6, roofline.CHIPS["v5e"], 10)
  assert _iter_cells(per_trip.table())["decode"] == f"{DOT / 1e9:.3f}" and "unknown" not in "".join(per_trip.checks())


def _iter_cells(table: str) -> dict[str, str]:
  """Each row's `iter GF` cell: the 9 characters that end where the header's `iter GF` ends."""
  head, _, *rows = table.splitlines()
  end = head.index("iter GF") + len("iter GF")
  return {row.split()[0]: row[end - 9:end].strip() for row in rows
          if not row.startswith("  (") and not row.split()[0].endswith(":")}  # not the note, nor a line on a row


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install -e '.[tpu]')")
@pytest.mark.parametrize("attention_chunk,logits_chunk", [(0, 0), (32, 16)])
def test_a_tpu_compiled_update_matches_the_analytic_count(attention_chunk, logits_chunk):
  """A 2-layer update of 64 + 64 tokens per row, one row per chip per micro-batch, compiled for v5e:2x2: dense
  attention without loops, and blocked attention (4 x 4 blocks, each rematerialised) with the LM head in 4
  checkpointed blocks, whose loops cost_analysis would count once."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from agent_r1_jax.sizing import tpu  # pylint: disable=import-outside-toplevel
  mesh = make_mesh(1, -1, 1, devices=tpu.topology_devices("v5e:2x2"))
  c = config_lib.base_config("grpo", "qwen2.5-0.5b")
  c.update_from_flattened_dict({
      "trainer.batch_size": 4, "rollout.n_samples": 2, "actor.num_mini_batches": 1, "rollout.max_prompt_length": 64,
      "rollout.max_response_length": 64, "rollout.max_context_length": 128,
      "model.attention_chunk_size": attention_chunk, "model.logits_chunk_size": logits_chunk})
  arch = Qwen2Config.tiny(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)
  graphdef, actor = build.abstract_params(c, arch, mesh, head="lm")
  learner = build.build_learner(c, graphdef, None, logprob_temperature=1.0)
  batch = dry_run.abstract_batch(c, mesh, 8, with_ref=True, with_values=False)
  opt_state = dry_run.abstract_opt_state(learner.actor_tx, actor, mesh)  # eager: outside the TPU mesh
  with jax.set_mesh(mesh):
    lowered = learner.actor_step.lower(actor, opt_state, batch, num_micro=2)
  text = lowered.compile().as_text()
  compiled = hlo_flops.count(text).exact / 2
  expected = flops.update_flops(arch, rows=1, prompt_length=64, response_length=64,
                                remat=True, attention_chunk=attention_chunk, logits_chunk=logits_chunk)
  assert abs(compiled / expected - 1) < 0.05, (compiled, expected)
  assert hlo_flops.count(_strip(text)).exact == compiled * 2  # the TPU's loops proven without its annotation
