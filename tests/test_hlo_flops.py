"""The loop-expanded matmul FLOP count of compiled programs: hand-computed loops on XLA:CPU, and a learner update
compiled by the TPU compiler (libtpu) against the analytic count of `sizing.flops`, with attention dense and in
blocks."""

from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent_r1_jax.models import Qwen2Config, make_mesh
from agent_r1_jax.learner import build
from agent_r1_jax.sizing import dry_run, flops, hlo_flops
from agent_r1_jax.trainer import config as config_lib


def test_a_scan_counts_its_body_once_per_trip_and_a_dynamic_loop_once():
  m, k, trips = 8, 32, 7

  def scanned(x, ws):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

  def dynamic(x, w, n):
    return jax.lax.while_loop(lambda c: c[1] < n, lambda c: (c[0] @ w, c[1] + 1), (x, 0))[0]

  x, ws = np.ones((m, k), np.float32), np.ones((trips, k, k), np.float32)
  text = jax.jit(scanned).lower(x, ws).compile().as_text()
  assert hlo_flops.matmul_flops(text) == trips * 2 * m * k * k
  text = jax.jit(dynamic).lower(x, ws[0], 3).compile().as_text()
  assert hlo_flops.matmul_flops(text) == 2 * m * k * k  # per iteration: the bound is data


def test_a_loop_whose_counter_steps_by_two_from_three_counts_its_real_trips():
  """`counter = 3; while counter < 16: counter += 2` runs 7 times (3, 5, ..., 15): compiled by XLA:CPU, and as
  hand-written HLO in the form of the TPU compiler's windowed matmuls (no trip-count annotation; their bound
  alone would count them twice)."""
  m, k = 8, 32

  def stepped(x, w):
    return jax.lax.while_loop(lambda c: c[1] < 16, lambda c: (jnp.tanh(c[0] @ w), c[1] + 2), (x, 3))[0]

  x, w = np.ones((m, k), np.float32), np.ones((k, k), np.float32)
  text = jax.jit(stepped).lower(x, w).compile().as_text()
  assert hlo_flops.matmul_flops(text) == 7 * 2 * m * k * k

  hand = """HloModule stepped

%body (p: (f32[8,32], f32[32,32], u32[])) -> (f32[8,32], f32[32,32], u32[]) {
  %p = (f32[8,32], f32[32,32], u32[]) parameter(0)
  %x = f32[8,32] get-tuple-element(%p), index=0
  %w = f32[32,32] get-tuple-element(%p), index=1
  %i = u32[] get-tuple-element(%p), index=2
  %dot.1 = f32[8,32] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %two = u32[] constant(2)
  %next = u32[] add(%i, %two)
  ROOT %out = (f32[8,32], f32[32,32], u32[]) tuple(%dot.1, %w, %next)
}

%cond (q: (f32[8,32], f32[32,32], u32[])) -> pred[] {
  %q = (f32[8,32], f32[32,32], u32[]) parameter(0)
  %bound = u32[] constant(16)
  %j = u32[] get-tuple-element(%q), index=2
  ROOT %lt = pred[] compare(%j, %bound), direction=LT
}

ENTRY %main (a: f32[8,32], b: f32[32,32]) -> f32[8,32] {
  %a = f32[8,32] parameter(0)
  %b = f32[32,32] parameter(1)
  %three = u32[] constant(3)
  %init = (f32[8,32], f32[32,32], u32[]) tuple(%a, %b, %three)
  %loop = (f32[8,32], f32[32,32], u32[]) while(%init), condition=%cond, body=%body
  ROOT %res = f32[8,32] get-tuple-element(%loop), index=0
}
"""
  assert hlo_flops.matmul_flops(hand) == 7 * 2 * m * k * k


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
  compiled = hlo_flops.matmul_flops(lowered.compile().as_text()) / 2
  expected = flops.update_flops(arch, rows=1, prompt_length=64, response_length=64,
                                remat=True, attention_chunk=attention_chunk, logits_chunk=logits_chunk)
  assert abs(compiled / expected - 1) < 0.05, (compiled, expected)
