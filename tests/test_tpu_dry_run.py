"""The dry run compiled by XLA:TPU for a named TPU slice (`--config.dry_run_topology`, libtpu, no TPU needed).

The compile-for-a-topology tests skip when libtpu is not installed; the chip table, the roofline, the parsing of
the compiler's out-of-memory message and the verdict's arithmetic are checked everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from agent_r1_jax.models import make_mesh
from agent_r1_jax.learner import build
from agent_r1_jax.sizing import dry_run, memory, roofline, tpu
from agent_r1_jax.trainer import config as config_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
GIB = 1 << 30
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason='libtpu is not installed (pip install -e ".[tpu]")')
GRPO_PROGRAMS = ["sampling_weights", "prefill", "extend", "decode", "logprobs", "ref_logprobs", "actor_update"]
# The tiny preset's (the slot engine's): its calls over every slot, and gathered to half the slots per chip.
SLOT_GRPO_PROGRAMS = ["sampling_weights", "slot_extend", "decode_chunk", "slot_extend_gathered",
                      "decode_chunk_gathered", "logprobs", "ref_logprobs", "actor_update"]

# The tiny GRPO preset at shapes every per-chip shard of which is whole TPU tiles on a 4-chip fsdp mesh (last dim
# a multiple of 128, the one before a multiple of 8; 1-D arrays whole 1024s), so XLA:TPU's layout pads nothing
# and the argument bytes it reports can be computed from the shapes (a [2, 32] float32 bias would take 1 KiB):
# hidden 1024 (256 per chip), 8 query and 8 KV heads of 128, MLP 1024, one layer; 8 prompts x 4 samples = 32 rows
# (8 per chip), a 128 + 128 context.
ALIGNED = {"model.hidden_size": 1024, "model.intermediate_size": 1024, "model.num_hidden_layers": 1,
           "model.num_attention_heads": 8, "model.num_key_value_heads": 8, "rollout.n_samples": 4,
           "rollout.max_prompt_length": 128, "rollout.max_response_length": 128, "rollout.max_context_length": 256,
           "trainer.batch_size": 8, "mesh.fsdp": -1}


def _config(topology: str, **overrides) -> config_lib.config_dict.ConfigDict:
  c = config_lib.base_config("grpo", "tiny")
  c.rollout.engine = "lockstep"  # the sampler's programs (the tiny preset streams; slot tests override this)
  c.dry_run = True
  c.dry_run_topology = topology
  for dotted, value in {**ALIGNED, **overrides}.items():
    section, _, field = dotted.rpartition(".")
    (c[section] if section else c)[field] = value
  return c


# --------------------------------------------------------------------------------------------------
# Pure pieces: no compile.


def test_roofline_is_the_longer_of_compute_and_memory_time_per_device():
  v5e = roofline.CHIPS["v5e"]
  # 197e12 FLOP at 197 TFLOP/s: 1 s; 409.5e9 bytes at 819 GB/s: 0.5 s.
  assert roofline.estimate_seconds(197e12, 409.5e9, v5e) == pytest.approx(1.0)
  assert roofline.estimate_seconds(19.7e12, 1638e9, v5e) == pytest.approx(2.0)
  assert roofline.estimate_seconds(197e12, 0.0, v5e, iterations=3) == pytest.approx(3.0)
  # A TPU7x chip (2307 TFLOP/s, 7380 GB/s) is two devices: each gets half of both.
  v7x = roofline.CHIPS["v7x"]
  assert roofline.estimate_seconds(2307e12, 0.0, v7x) == pytest.approx(2.0)
  assert roofline.estimate_seconds(0.0, 7380e9, v7x) == pytest.approx(2.0)


def test_the_chip_table_holds_the_published_figures():
  published = {"v4": (32, 1200e9, 275e12), "v5e": (16, 819e9, 197e12), "v5p": (95, 2765e9, 459e12),
               "v6e": (32, 1638e9, 918e12), "v7x": (192, 7380e9, 2307e12)}
  for name, (gib, bandwidth, flops) in published.items():
    chip = roofline.CHIPS[name]
    assert (chip.hbm_bytes, chip.hbm_bandwidth, chip.peak_flops) == (gib * GIB, bandwidth, flops), name
    assert chip.compiler_hbm_bytes <= chip.hbm_bytes // chip.devices_per_chip + GIB, name
  assert roofline.CHIPS["v5e"].compiler_hbm_bytes == 15.75 * GIB


@pytest.mark.parametrize("message, sizes", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (64.00G) "
     "exceeds available HBM (15.75G).", [64 * GIB, 15.75 * GIB]),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 23.18G "
     "of 15.75G hbm. Exceeded hbm capacity by 7.43G.", [round(23.18 * GIB), 15.75 * GIB, round(7.43 * GIB)]),
    ("needs 512.00M, then 2.00T and 100B on hbm0 of v5e", [512 << 20, 2 << 40, 100]),
])
def test_the_compilers_sizes_are_read_from_its_message(message, sizes):
  assert tpu.parse_sizes(message) == sizes


def _row(name: str, total: int, **kw) -> dry_run.ProgramMemory:
  return dry_run.ProgramMemory(name=name, arguments=total, outputs=0, temporaries=0, aliased=0,
                               resident=kw.pop("resident", 0.0), compile_seconds=0.0, **kw)


def test_the_verdict_turns_on_the_largest_peak_against_the_budget():
  rows = [_row("logprobs", 3 * GIB), _row("actor_update", 5 * GIB, resident=GIB)]  # peaks 3 and 6 GiB
  assert dry_run.DryRunReport(0, {}, rows, budget_bytes=6 * GIB).fits
  below = dry_run.DryRunReport(0, {}, rows, budget_bytes=6 * GIB - 1)
  assert not below.fits and [p.fits(below.budget_bytes) for p in rows] == [True, False]
  assert below.verdict().startswith("verdict: does NOT fit in 6.00 GiB") and "actor_update 6.00 GiB" in below.verdict()
  refused = _row("decode", 0, required=20 * GIB, error="RESOURCE_EXHAUSTED: ...")
  refused.arguments = None
  report = dry_run.DryRunReport(0, {}, rows + [refused], budget_bytes=100 * GIB)
  assert not report.fits and "decode 20.00 GiB (refused by the compiler)" in report.verdict()
  assert report.to_json()["programs"][2]["arguments"] is None and report.to_json()["programs"][2]["peak"] == 20 * GIB


def _shape_bytes(tree) -> int:
  """prod(shard shape) x itemsize summed over a tree's leaves: the resident figure before tile padding."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _unaligned_state(devices) -> dict:
  """Arrays on an fsdp mesh of 4 devices whose shards are not whole (8, 128)-word tiles, and one that is: a float32
  [32, 100] split in 4 ([8, 100] per device), a bfloat16 [16, 64] (a head_dim-64 bias), a float32 [64, 8, 128] split."""
  mesh = make_mesh(1, -1, 1, devices=devices)
  split, whole = NamedSharding(mesh, PartitionSpec("fsdp")), NamedSharding(mesh, PartitionSpec())
  return {"w": jax.ShapeDtypeStruct((32, 100), jnp.float32, sharding=split),
          "bias": jax.ShapeDtypeStruct((16, 64), jnp.bfloat16, sharding=whole),
          "aligned": jax.ShapeDtypeStruct((64, 8, 128), jnp.float32, sharding=split)}


def test_resident_state_on_the_cpu_is_each_devices_shards():
  """XLA:CPU does not tile: 4 of the 8 host devices hold 32 x 100 x 4 / 4 + 16 x 64 x 2 + 16 x 8 x 128 x 4 bytes
  each, a quarter of the split arrays (their whole size would be 12,800 + 2,048 + 262,144)."""
  state = _unaligned_state(np.asarray(jax.devices()[:4]))
  assert memory.resident_bytes(state) == _shape_bytes(state) == 3200 + 2048 + 65536
  assert memory.resident_bytes({}) == 0


def test_the_dry_run_fields_need_a_dry_run():
  c = config_lib.base_config("grpo", "tiny")
  c.dry_run_report = "/tmp/report.json"
  with pytest.raises(ValueError, match=r"dry_run_report='/tmp/report.json' is read by the dry run only"):
    config_lib.validate(c)


def test_without_libtpu_a_topology_is_one_error_naming_the_install(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
  with pytest.raises(ValueError, match=r'pip install -e "\.\[tpu\]"'):
    tpu.topology_devices("v5e:2x2")


# A pytest run of this file where libtpu looks absent (`find_spec` says so), recording each test's outcome; with
# "unmarked" the skipif markers are dropped first, as if the tests had been written without them.
_RUN_WITHOUT_LIBTPU = """
import importlib.util, json, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "libtpu" else real(name, *a, **k)
import pytest

class Record:
  outcomes = {}
  def pytest_collection_modifyitems(self, items):
    for item in items if sys.argv[1] == "unmarked" else ():
      item.own_markers = [m for m in item.own_markers if m.name != "skipif"]
  def pytest_runtest_logreport(self, report):
    if report.when == "call" or report.outcome != "passed":
      self.outcomes.setdefault(report.nodeid.split("::")[-1], report.outcome)

pytest.main(sys.argv[2:], plugins=[Record()])
print(json.dumps(Record.outcomes))
"""


def test_without_libtpu_the_tpu_tests_skip_and_the_rest_pass():
  """Where libtpu is not installed every test here passes or skips. The control: the skipped tests without their
  marker fail in that same run (each asks libtpu for a slice), so it is the markers that keep them from failing.
  The slow tests are left out: unmarked, the CLI one would compile in its own process, where libtpu is present."""
  me = f"tests/test_tpu_dry_run.py::{test_without_libtpu_the_tpu_tests_skip_and_the_rest_pass.__name__}"

  def outcomes(mode: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", _RUN_WITHOUT_LIBTPU, mode, "-q", "-p", "no:cacheprovider", "-m",
                          "not slow", "tests/test_tpu_dry_run.py", "--deselect", me],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])

  marked = outcomes("marked")
  skipped = {name for name, outcome in marked.items() if outcome == "skipped"}
  assert "failed" not in marked.values() and skipped and "passed" in marked.values(), marked
  unmarked = outcomes("unmarked")
  assert {name for name, outcome in unmarked.items() if outcome == "failed"} == skipped, unmarked


# --------------------------------------------------------------------------------------------------
# Compiled by XLA:TPU.


@needs_libtpu
def test_resident_state_on_a_tpu_is_laid_out_in_tiles():
  """Per v5e chip, by hand in (8, 128)-word tiles: the [8, 100] float32 shard pads its last dimension to 128 lanes,
  8 x 128 x 4 bytes; the bfloat16 [16, 64] (16 rows fill a tile's 8 words) pads 64 to 128, 16 x 128 x 2; the
  [16, 8, 128] shard is whole tiles, 16 x 8 x 128 x 4. The control: prod(shape) x itemsize, the figure before,
  is 2,944 bytes short."""
  state = _unaligned_state(tpu.topology_devices("v5e:2x2"))
  tiled = 8 * 128 * 4 + 16 * 128 * 2 + 16 * 8 * 128 * 4
  assert memory.resident_bytes(state) == tiled
  assert _shape_bytes(state) == tiled - 2944


@needs_libtpu
def test_the_resident_actor_is_what_a_program_taking_it_holds():
  """A Qwen2.5-0.5B-like layer (hidden 896, 14 heads and 2 KV heads of 64; 224 of the hidden dimension per chip),
  where no layout avoids padding (q kernel [224, 14, 64] per chip: every dimension short of its tiles): the
  actor's resident bytes equal what XLA:TPU takes as the arguments of the sampling weights program, whose only
  argument is the actor, and exceed prod(shape) x itemsize (the control)."""
  mesh = make_mesh(1, -1, 1, devices=tpu.topology_devices("v5e:2x2"))
  c = _config("v5e:2x2", **{"model.hidden_size": 896, "model.num_attention_heads": 14,
                            "model.num_key_value_heads": 2})
  arch = dry_run._architecture(c)
  (program,), held = dry_run.size_programs(c, arch, mesh, programs=("sampling_weights",))
  assert program.name == "sampling_weights" and program.arguments == held["actor"] == held["ref"]
  _, actor = build.abstract_params(c, arch, mesh, head="lm")
  assert held["actor"] > _shape_bytes(actor)


@needs_libtpu
@pytest.mark.parametrize("name", ["v5litepod-8", "v5e:3x3"])
def test_a_topology_libtpu_rejects_is_one_error_with_examples(name):
  with pytest.raises(ValueError) as info:
    dry_run.dry_run(_config(name), verbose=False)
  message = str(info.value)
  assert f"dry_run_topology={name!r}" in message and "--config.dry_run_topology=v5e:2x4" in message
  for example in tpu.EXAMPLES:
    assert example in message


@needs_libtpu
def test_a_mesh_that_does_not_span_the_slice_names_fsdp_minus_one():
  """The tiny preset's mesh is one device; on a 4-chip slice the error names the fix, and the micro-batch
  that then divides its 40-row mini-batch (5 rows per device x 4 devices; the configured 8 x 4 does not)."""
  c = config_lib.base_config("grpo", "tiny")
  c.dry_run, c.dry_run_topology = True, "v5e:2x2"
  with pytest.raises(ValueError, match=r"--config\.mesh\.fsdp=-1 .*micro_batch_size_per_device=5$"):
    dry_run.dry_run(c, verbose=False)


@needs_libtpu
@pytest.mark.slow
def test_the_cli_compiles_every_grpo_program_for_v5e_and_reports_the_compilers_figures(tmp_path):
  """One CLI dry run of the tiny GRPO preset for v5e:2x2 (its mesh filling the 4 chips, 5 rows per device so
  micro-batches divide the 40-row mini-batch; the preset's slot engine, 10 slots per chip): every program compiled
  by XLA:TPU, the JSON report complete,
  the budget the compiler's 15.75 GiB, each roofline time the longer of FLOPs at 197 TFLOP/s and bytes at
  819 GB/s."""
  report_path = tmp_path / "report.json"
  out = subprocess.run(
      [sys.executable, "-m", "agent_r1_jax.train", "--config=configs/grpo_multihopqa.py", "--config.dry_run=True",
       "--config.dry_run_topology=v5e:2x2", f"--config.dry_run_report={report_path}", "--config.mesh.fsdp=-1",
       "--config.actor.micro_batch_size_per_device=5"],
      cwd=REPO, capture_output=True, text=True, timeout=900, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  assert "mesh: data=1 fsdp=4 tensor=1 on v5e:2x2: 4 'TPU v5 lite' devices on 4 chips" in out.stdout, out.stdout
  report = json.loads(report_path.read_text())
  assert report["topology"] == "v5e:2x2" and report["chip"]["name"] == "v5e"
  assert report["chip_hbm_bytes"] == 15.75 * GIB and report["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert report["fits"] is True and report["num_params"] > 0
  assert [p["name"] for p in report["programs"]] == SLOT_GRPO_PROGRAMS
  for p in report["programs"]:
    for field in ("arguments", "outputs", "temporaries", "aliased", "total", "peak", "flops", "bytes_accessed"):
      assert isinstance(p[field], int), (p["name"], field)
    assert p["total"] == p["arguments"] + p["outputs"] - p["aliased"] + p["temporaries"]
    assert p["peak"] == p["total"] + p["resident"] and p["fits"] is (p["peak"] <= 15.75 * GIB) and p["fits"]
    assert p["bytes_accessed"] > 0 and p["compile_seconds"] > 0 and "error" not in p
    assert p["flops"] > 0 or p["name"] == "sampling_weights"  # a cast and a gather: no FLOPs
    assert p["estimated_seconds_per_iteration"] == pytest.approx(  # the loop-expanded count, as the step's, and a
        max((p["iteration_flops"] + p.get("kernel_flops", 0.0)) / 197e12,  # paged program's kernel beside it
            (p["bytes_accessed"] + p.get("kernel_bytes", 0.0)) / 819e9))
    # Every loop's trips proven; a decode program's count is one trip of its data-dependent loop.
    assert p["iteration_flops_exact"] is True and p["iteration_flops"] >= 0 and p["iteration"] == (
        "decode step" if p["name"].startswith("decode") else "call" if "extend" in p["name"] or p["name"] ==
        "sampling_weights" else "micro-batch")
    assert any(line.split()[:1] == [p["name"]] and line.split()[-2] == "yes" for line in out.stdout.splitlines())
  assert report["estimated_step_seconds"]["total"] > 0
  assert "verdict: fits in 15.75 GiB per device (XLA:TPU's limit for one v5e device of v5e:2x2)" in out.stdout


@needs_libtpu
@pytest.mark.slow
def test_the_grpo_programs_compile_for_v4_megacore_and_the_update_takes_the_bytes_its_shapes_give():
  """v4:2x2x1 as libtpu's "megacore" chip config: one device per chip, 4 devices, the budget what XLA:TPU
  allows one v4 device (30.75 GiB of the chip's 32). At `ALIGNED` shapes the actor update's per-chip argument
  bytes equal what the shapes and shardings give by hand (`_actor_update_argument_bytes`)."""
  report = dry_run.dry_run(_config("v4:2x2x1"), verbose=False)
  assert report.chip.name == "v4" and report.budget_bytes == 30.75 * GIB and report.mesh["fsdp"] == 4
  assert [p.name for p in report.programs] == GRPO_PROGRAMS
  assert report.fits and all(p.error is None and p.arguments > 0 for p in report.programs)
  assert all(p.flops > 0 for p in report.programs if p.name != "sampling_weights")  # a cast and a gather: no FLOPs
  assert report.programs[-1].arguments == _actor_update_argument_bytes()


def _actor_update_argument_bytes() -> int:
  """Per-chip bytes of the actor update's arguments at `ALIGNED` on 4 chips (fsdp = 4), by hand.

  Sharding rules: the hidden ("embed") dimension of every matrix is split over fsdp, biases and norms are
  replicated. V = 4096 (the dry run's from-scratch vocabulary, tied LM head), H = 1024, I = 1024, 8 heads and 8 KV
  heads of 128, one layer:
    split over 4:  embed V*H + q, k, v, o kernels 4*H*1024 + gate, up, down 3*H*I    = 11,534,336 floats
    replicated:    q, k, v biases 3*1024 + two layer norms 2*H + the final norm H     = 6,144 floats
  AdamW's state is two parameter-shaped moments plus two int32 step counts (its own and the lr schedule's),
  each a scalar that XLA:TPU gives its smallest buffer, 512 bytes. The mini-batch (32 rows, 8 per chip) enters
  with the fields the actor loss reads: input_ids and attention_mask [8, 256] int32, response_ids [8, 128]
  int32, loss_mask, old_logprobs, advantages and ref_logprobs [8, 128] float32 (the compiled program drops
  advantage_mask and returns, which only the critic reads).
  """
  v, h, i = 4096, 1024, 1024
  split, replicated = v * h + 4 * h * 1024 + 3 * h * i, 3 * 1024 + 2 * h + h
  params = (split // 4 + replicated) * 4
  optimizer = 2 * params + 2 * 512
  rows = 32 // 4
  batch = 2 * rows * 256 * 4 + rows * 128 * 4 + 4 * rows * 128 * 4
  return params + optimizer + batch


@needs_libtpu
def test_a_program_too_large_for_the_chip_is_a_does_not_fit_row_with_the_compilers_figure():
  """640 rows of a 64 + 65,536-token context: the float32 KV cache alone is, per chip of v5e:2x2 (rows split
  over 4), at least 4 layers x (K, V) x 640 / 4 rows x 65,600 slots x 2 KV heads x 32 dims x 4 bytes =
  20.0 GiB, over the chip's 16. Decode and prefill compile to rows quoting the compiler, not to an exception."""
  c = config_lib.base_config("grpo", "tiny")
  c.dry_run, c.dry_run_topology, c.mesh.fsdp = True, "v5e:2x2", -1
  c.rollout.engine = "lockstep"  # the sampler's prefill and decode over the step's 640 rows
  c.trainer.batch_size, c.actor.micro_batch_size_per_device = 128, 8
  c.rollout.max_response_length, c.rollout.max_context_length = 65536, 65536 + 64
  kv_bytes = 4 * 2 * (640 // 4) * (64 + 65536) * 2 * 32 * 4
  assert kv_bytes > 20 * GIB
  devices = tpu.topology_devices(c.dry_run_topology)
  mesh = build.build_mesh(c, devices=devices)
  rows, _ = dry_run.size_programs(c, dry_run._architecture(c), mesh, programs=("prefill", "decode"))
  decode = rows[-1]
  assert decode.name == "decode" and decode.error.startswith("RESOURCE_EXHAUSTED: Ran out of memory")
  assert decode.required >= kv_bytes > roofline.CHIPS["v5e"].hbm_bytes
  report = dry_run.DryRunReport(0, dict(mesh.shape), rows, budget_bytes=15.75 * GIB, topology="v5e:2x2",
                                chip=roofline.CHIPS["v5e"])
  assert not report.fits and not decode.fits(report.budget_bytes)
  row = next(p for p in report.to_json()["programs"] if p["name"] == "decode")
  assert row["fits"] is False and row["peak"] >= kv_bytes and row["arguments"] is None and row["error"]
  assert "decode" in report.verdict() and "refused by the compiler" in report.verdict()


@needs_libtpu
def test_the_slot_engines_decode_holds_its_slots_not_the_steps_rows():
  """`rollout.engine=slots` compiles the slot engine's decode chunk in place of the sampler's decode, and its
  per-chip arguments grow by a row's KV cache and logits (plus small per-row vectors) per slot: 2 slots per chip
  take 6 rows' worth less than 8, which is what the lockstep decode of the step's 8 rows per chip takes."""
  mesh = make_mesh(1, -1, 1, devices=tpu.topology_devices("v5e:2x2"))

  def decode_arguments(engine: str, slots_per_device: int) -> int:
    c = _config("v5e:2x2", **{"rollout.engine": engine, "rollout.slots_per_device": slots_per_device,
                              "model.kv_cache": "dense"})  # the paged cache: tests/test_paged_dry_run.py
    name = "decode_chunk" if engine == "slots" else "decode"
    (program,), _ = dry_run.size_programs(c, dry_run._architecture(c), mesh, programs=(name,))
    assert program.name == name and program.error is None and program.must_read
    return program.arguments

  few, many, lockstep = decode_arguments("slots", 2), decode_arguments("slots", 8), decode_arguments("lockstep", 0)
  # One row per chip: keys and values of the one layer, 256 slots x 8 KV heads x 128 (float32), and 4096 logits.
  row = 2 * 256 * 8 * 128 * 4 + 4096 * 4
  assert 6 * row <= many - few <= 6 * (row + 4096)
  assert abs(many - lockstep) <= 8 * 4096  # the same cache and logits; only the small per-row vectors differ


@needs_libtpu
def test_the_slot_engines_gathered_calls_compute_half_the_rows():
  """With 8 slots per chip, the decode chunk compacted to half of them (4 rows gathered per chip) takes the slots'
  arguments plus the gather's index, and a decode step costs half the FLOPs of one over every slot."""
  mesh = make_mesh(1, -1, 1, devices=tpu.topology_devices("v5e:2x2"))
  c = _config("v5e:2x2", **{"rollout.engine": "slots", "rollout.slots_per_device": 8, "model.kv_cache": "dense"})
  full, gathered = dry_run.size_programs(c, dry_run._architecture(c), mesh,
                                         programs=("decode_chunk", "decode_chunk_gathered"))[0]
  assert full.error is None and gathered.error is None
  assert 0 <= gathered.arguments - full.arguments <= 1024
  assert gathered.iteration_flops == pytest.approx(full.iteration_flops / 2, rel=0.05)
