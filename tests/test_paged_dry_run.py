"""The dry run's sizing of the paged slot engine (`sizing.paged_sizing`, `sizing.rpa_cost`): the kernel's reads and
FLOPs by hand, the worst case's episode, pages and episodes per chip, and (libtpu) the paged decode and extend
compiled for a v5e slice with the Ragged Paged Attention kernel at tiny shapes."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from agent_r1_jax.models import make_mesh
from agent_r1_jax.sizing import dry_run, paged_sizing, rpa_cost, tpu
from agent_r1_jax.trainer import config as config_lib

GIB, MIB = 1 << 30, 1 << 20
REPO = pathlib.Path(__file__).resolve().parents[1]
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason='libtpu is not installed (pip install -e ".[tpu]")')


# --------------------------------------------------------------------------------------------------
# Pure arithmetic.


def test_the_kernels_reads_and_flops_are_counted_by_hand():
  """Pages of 256 positions, 8 per row: the kernel copies blocks of min(8, 1024 / 256) = 4 pages (1024 positions),
  every page of a block even past the row's end. Decode rows at kv_len 1, 1024, 1025 and 2048 read 1, 1, 2 and 2
  blocks: 24 pages of 256 x (2 x 2 KV heads) x 128 x 2 bytes. The 4 queries make one query block (qb = 4), read and
  written once: 2 x 4 x 4 heads x 128 x 2 bytes. The scalar prefetch: kv_lens 4, page table 4 x 8, cu_q_lens 5, 3
  words. FLOPs: each of the 6 key blocks against the whole query block, 4 x qb x H x 1024 x 128."""
  shape = rpa_cost.KernelShape(heads=4, kv_heads=2, head_width=128, page_size=256, pages_per_row=8, kv_itemsize=2,
                               q_itemsize=2)
  assert (shape.pages_per_block, shape.block_positions, shape.page_bytes) == (4, 1024, 256 * 4 * 128 * 2)
  cost = rpa_cost.call_cost(shape, [1, 1, 1, 1], [1, 1024, 1025, 2048])
  page = 256 * 4 * 128 * 2
  assert cost.pages == 24
  assert cost.bytes == 24 * page + 2 * 4 * 4 * 128 * 2 + 4 * (4 + 32 + 5 + 3)
  assert cost.flops == 6 * 4 * 4 * 4 * 1024 * 128


def test_an_append_is_read_once_per_query_block_it_spans():
  """Two rows appending 40 and 8 tokens: queries [0, 40) and [40, 48) in blocks of 32: the first row is visited
  by blocks 0 and 1, the second by block 1, so the first row's 2 key blocks are read twice and the second's 1
  once: 5 blocks of 4 pages. Two query blocks of 32 are read and written."""
  shape = rpa_cost.KernelShape(heads=4, kv_heads=2, head_width=128, page_size=256, pages_per_row=8, kv_itemsize=2,
                               q_itemsize=2)
  cost = rpa_cost.call_cost(shape, [40, 8], [2000, 100])
  assert cost.pages == 5 * 4
  assert cost.bytes == 20 * shape.page_bytes + 2 * 2 * 32 * 4 * 128 * 2 + 4 * (2 + 16 + 3 + 3)
  assert cost.flops == 5 * 4 * 32 * 4 * 1024 * 128
  with pytest.raises(ValueError, match="positive"):
    rpa_cost.call_cost(shape, [1, 0], [5, 5])


def test_narrow_heads_are_read_as_the_pages_store_them():
  """Qwen2.5-0.5B's two 64-wide KV heads are stored packed in one 128-lane head: a page of 64 positions is
  64 x 2 x 128 x 2 bytes, exactly the model's keys and values (2 x 2 heads x 64), and all 14 query heads read it at
  width 128. Three 64-wide heads do not pack in pairs: each is zero-padded to 128, twice the model's bytes."""
  packed = rpa_cost.KernelShape.of(heads=14, kv_heads=2, head_dim=64, tensor=1, page_size=64, pages_per_row=128,
                                   kv_itemsize=2, q_itemsize=2)
  assert (packed.heads, packed.kv_heads, packed.head_width, packed.page_bytes) == (14, 1, 128, 64 * 2 * 128 * 2)
  logical = paged_sizing.attended(packed, 24, 1, 1000, heads=(2, 64))
  assert logical == 24 * 1000 * 2 * 2 * 64 * 2 == paged_sizing.attended(packed, 24, 1, 1000)
  padded = rpa_cost.KernelShape.of(heads=12, kv_heads=3, head_dim=64, tensor=1, page_size=64, pages_per_row=128,
                                   kv_itemsize=2, q_itemsize=2)
  assert (padded.kv_heads, padded.head_width) == (3, 128)
  assert paged_sizing.attended(padded, 1, 1, 10) == 2 * paged_sizing.attended(padded, 1, 1, 10, heads=(3, 64))


def _rollout(**fields) -> config_lib.config_dict.ConfigDict:
  c = config_lib.base_config("grpo", "tiny")
  for name, value in fields.items():
    c.rollout[name] = value
  return c


def test_the_worst_case_episode_spends_every_turns_budget():
  """Prompt 100, turns of 50, observations of 30, 4 turns, response limit 200: decode 100-149, observe at 150,
  decode 180-229, observe at 230, decode 260-299 (the response is full at 200 tokens: 50 + 30 + 50 + 30 + 40)."""
  c = _rollout(max_prompt_length=100, max_new_tokens_per_turn=50, max_turns=4, max_response_length=200,
               max_context_length=400)
  episode = paged_sizing.full_budget_episode(c, observation=30)
  expected = np.concatenate([np.arange(100, 150), np.arange(180, 230), np.arange(260, 300)])
  np.testing.assert_array_equal(episode.decode_contexts, expected)
  assert episode.extends == ((0, 100), (150, 30), (230, 30)) and episode.final_context == 300
  # The context limit binds first: 100 + 50 + 30 + 20.
  short = paged_sizing.full_budget_episode(_rollout(max_prompt_length=100, max_new_tokens_per_turn=50, max_turns=4,
                                                    max_response_length=200, max_context_length=200), observation=30)
  assert short.final_context == 200 and len(short.decode_contexts) == 70


def test_pages_and_episodes_per_chip_by_hand():
  """15.75 GiB allowed, 5.5 GiB of everything else: 10.25 GiB of 1.5 MiB pages is 6997 pages (6997.33); 6996 of them
  (the null page aside) hold 54 episodes of 8192 tokens (128 pages), 218 of 2048 (32 pages), 111 of 4000 (63
  pages); 10.25 GiB of 96 MiB dense rows is 109 rows. The compiled pool of 20 x 128 + 1 pages holds 20 at 8192."""
  plan = paged_sizing.PoolPlan(slots_per_device=20, page_size=64, pages_per_device=20 * 128 + 1,
                               page_bytes=int(1.5 * MIB), dense_row_bytes=96 * MIB, non_pool_bytes=5.5 * GIB,
                               budget_bytes=15.75 * GIB, full_context=8192, mean_context=2048)
  assert plan.fit_pages == 6997
  assert (plan.episodes(8192), plan.episodes(2048), plan.episodes(4000)) == (54, 218, 111)
  assert plan.dense_episodes == 109
  assert plan.episodes(8192, plan.pages_per_device) == 20
  report = plan.to_json()
  assert (report["fit_pages"], report["episodes_full"], report["episodes_mean"], report["dense_episodes"]) == (
      6997, 54, 218, 109)
  assert "6997 pages per chip fit" in "\n".join(plan.lines())


# --------------------------------------------------------------------------------------------------
# Compiled by XLA:TPU.


@needs_libtpu
def test_the_paged_decode_and_extend_compile_for_v5e_with_the_kernel_and_count_its_pages(monkeypatch):
  """The tiny GRPO preset on v5e:2x2 with a paged cache (one layer, 8 KV heads of 128, bfloat16; 4 slots per chip,
  pages of 64 tokens, a 128 + 128 context: 4 pages per row, one kernel block of 4 pages): decode and extend lower
  with Ragged Paged Attention; the dry run's kernel bytes per decode step are, by hand, 4 rows x one block of 4
  pages x (64 x 16 x 128 x 2 bytes) plus the query block in and out (2 x 4 x 8 heads x 128 x 2 bytes) and the
  scalar prefetch (4 words per row + 4 x 4 table entries + 5 + 3): every worst-case context (128-175) fits one
  block. A pool twice as large adds its pages to the arguments (as laid out: the same bytes per page) and nothing
  to the compiler's bytes per step: the in-place write of the new keys and values does not count the pool."""
  c = config_lib.base_config("grpo", "tiny")
  c.dry_run, c.dry_run_topology = True, "v5e:2x2"
  settings = {"model.hidden_size": 1024, "model.intermediate_size": 1024, "model.num_hidden_layers": 1,
              "model.num_attention_heads": 8, "model.num_key_value_heads": 8, "model.compute_dtype": "bfloat16",
              "rollout.cache_dtype": "bfloat16", "rollout.engine": "slots", "model.kv_cache": "paged",
              "rollout.slots_per_device": 4, "rollout.max_prompt_length": 128, "rollout.max_response_length": 128,
              "rollout.max_context_length": 256, "rollout.pages_per_device": 1024, "trainer.batch_size": 8,
              "rollout.n_samples": 4, "mesh.fsdp": -1}
  for dotted, value in settings.items():
    section, _, field = dotted.partition(".")
    c[section][field] = value
  mesh = make_mesh(1, -1, 1, devices=tpu.topology_devices("v5e:2x2"))
  arch = dry_run._architecture(c)
  texts = {}
  real = dry_run._measure

  def spy(name, lowered, *args):
    texts[name] = lowered.as_text()
    return real(name, lowered, *args)

  monkeypatch.setattr(dry_run, "_measure", spy)
  extend, decode = dry_run.size_programs(c, arch, mesh, programs=("slot_extend", "decode_chunk"))[0]
  assert (extend.name, decode.name) == ("slot_extend", "decode_chunk") and not extend.error and not decode.error
  for name in ("slot_extend", "decode_chunk"):
    assert "ragged_paged_attention_kernel" in texts[name] and "tpu_custom_call" in texts[name], name
  page = 64 * 16 * 128 * 2
  assert decode.kernel_bytes == pytest.approx(4 * 4 * page + 2 * 4 * 8 * 128 * 2 + 4 * (4 + 16 + 5 + 3), rel=1e-12)
  assert decode.kernel_flops == pytest.approx(4 * 4 * 4 * 8 * 256 * 128, rel=1e-12)
  assert extend.kernel_bytes > 0 and decode.must_read and decode.must_read_padded == decode.must_read  # hd = 128
  (bigger,) = dry_run.size_programs(c, arch, mesh, programs=("decode_chunk",), pages_per_device=2048)[0]
  assert bigger.arguments - decode.arguments == 1024 * page  # one layer
  assert bigger.bytes_accessed == decode.bytes_accessed
  # The page as the pool's own layout gives it, beside the program's.
  assert paged_sizing.pool_bytes(arch, mesh, pages_per_device=2, page_size=64, layout="combined",
                                 cache_dtype=jnp.bfloat16, backend="ragged_paged") == 2 * page


def test_the_docs_table_estimates_a_paged_step_as_the_report_does():
  """docs/make_dry_run_table.py recomputes each recorded report's step from its programs; for a paged one that
  includes the kernel's bytes and FLOPs, as `DryRunReport.step_seconds` did when the report was written."""
  spec = importlib.util.spec_from_file_location("make_dry_run_table", REPO / "docs" / "make_dry_run_table.py")
  table = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(table)
  for path in sorted((REPO / "docs" / "tpu_dry_run").glob("*_paged*.json")):
    report = json.loads(path.read_text())
    assert any(p.get("kernel_bytes") for p in report["programs"]), path.name
    assert table._step_seconds(report) == pytest.approx(report["estimated_step_seconds"]["total"]), path.name
    assert table._paged_row(path).count("|") == 10
