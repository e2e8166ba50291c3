"""The trainer's rollout through the slot engine (`rollout.engine="slots"`, every preset's default): the same episodes
as the lockstep driver's where both are deterministic, a training step that logs the engine's figures, the slot
counts of a step and of an evaluation, and the config's errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.sizing import rollout_sizing
from agent_r1_jax.trainer import loop
from agent_r1_jax.trainer.metrics import read_metrics
from test_trainer import micro_config

_FIELDS = ("prompt_ids", "response_ids", "response_mask", "action_mask", "group_ids", "num_turns", "num_tool_calls",
           "num_tool_errors", "stop_reason")


@pytest.mark.slow
def test_greedy_slot_engine_rollout_equals_the_lockstep_rollout_of_the_same_step(tmp_path):
  """Greedy decoding makes both engines deterministic, so the trainer's step-0 rollout must come out the same
  whichever engine it runs, here through one slot (the tiny preset's mesh is one device) for 16 rows: prompts,
  ground truths, group ids and limits reach the slot engine as they reach the driver. (This untrained model
  answers in one turn; multi-turn episodes with tool calls and errors are compared in test_slot_engine.py.)"""
  overrides = {"trainer.batch_size": 8, "rollout.temperature": 0.0, "rollout.max_turns": 3}
  lockstep = loop.RLTrainer(micro_config("grpo", **overrides, **{"rollout.engine": "lockstep"}),
                            tmp_path / "lockstep")
  slots = loop.RLTrainer(micro_config("grpo", **overrides, **{"rollout.engine": "slots",
                                                               "rollout.slots_per_device": 1,
                                                               "rollout.decode_chunk": 3}), tmp_path / "slots")
  # The paged cache (XLA path on CPU), 4 slots sharing a pool of 2 full-length episodes.
  paged = loop.RLTrainer(micro_config("grpo", **overrides, **{"rollout.engine": "slots", "rollout.slots_per_device": 4,
                                                               "model.kv_cache": "paged", "model.kv_page_size": 16,
                                                               "rollout.pages_per_device": 0}), tmp_path / "paged")
  rows = -(-paged.rollout_cfg.cache_length // 16)
  paged.c.rollout.pages_per_device = 2 * rows + 1
  key = jax.random.key(3)
  want, want_scores = lockstep.rollout(0, key)
  for trainer, slot_count in ((slots, 1), (paged, 4)):
    got, got_scores = trainer.rollout(0, key)
    assert got.batch_size == 16 and got.stats["slots"] == slot_count
    for name in _FIELDS:
      np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_allclose(got.sampler_logprobs, want.sampler_logprobs, atol=2e-5)
    assert got.ground_truth == want.ground_truth and got.response_text == want.response_text
    assert got_scores == want_scores


def test_paging_config_errors_name_the_field():
  c = config_lib.base_config("grpo", "tiny")
  c.rollout.engine, c.model.kv_cache = "slots", "pages"
  with pytest.raises(ValueError, match="model.kv_cache must be"):
    rollout_sizing.check_engine(c)
  c.model.kv_cache, c.model.kv_page_size = "paged", 0
  with pytest.raises(ValueError, match="kv_page_size"):
    rollout_sizing.check_engine(c)
  c.model.kv_page_size, c.rollout.pages_per_device = 64, 3
  with pytest.raises(ValueError, match="rollout.pages_per_device=3 cannot hold one episode"):
    rollout_sizing.check_engine(c)
  c.model.kv_cache = "dense"  # the pool's fields are not read
  rollout_sizing.check_engine(c)


def test_training_with_the_slot_engine_logs_occupancy_and_unhidden_tool_time(tmp_path):
  c = micro_config("grpo", **{"rollout.engine": "slots", "rollout.decode_chunk": 4})
  result = loop.train(c, tmp_path)
  assert result.step == 2
  for row in read_metrics(tmp_path):
    assert 0.0 < row["rollout/slot_occupancy"] <= 1.0
    assert row["rollout/time_tools_blocked_s"] >= 0.0
    # slots_per_device = 0 sizes the slots for every row of the step at once: 2 prompts x 2 samples, one device
    assert row["rollout/slots"] == 4


def test_default_slot_count_holds_every_row_of_a_process():
  c = config_lib.base_config("grpo", "tiny")
  c.trainer.batch_size, c.rollout.n_samples = 12, 5  # 60 rows
  c.mesh.fsdp = -1                                     # over every device
  assert rollout_sizing.slots_per_device(c, 8, 1) == 8    # ceil(60 / 8)
  assert rollout_sizing.slots_per_device(c, 8, 2) == 8    # 30 rows on each process's 4 devices
  c.rollout.slots_per_device = 3
  assert rollout_sizing.slots_per_device(c, 8, 2) == 3


def test_the_paper_presets_train_and_evaluate_on_slots_sized_by_one_function():
  """`slot_engine_options` (what the trainer and the evaluation pass `run_slot_episodes`): a step's slots hold its
  rows per device, an evaluation's its batch's rows per device, both at most `rollout.slots_per_device`; with the
  lockstep engine the evaluation gets None (the lockstep driver)."""
  c = config_lib.base_config("grpo", "qwen2.5-3b")  # 128 prompts x 5 samples, 128 evaluation prompts
  assert c.rollout.engine == "slots" and c.rollout.max_rows_per_device == 0
  c.mesh.fsdp = -1
  options = dict(decode_chunk=c.rollout.decode_chunk, tool_workers=c.rollout.tool_workers, paging=None)  # CPU: dense
  assert rollout_sizing.slot_engine_options(c, 8, 1) == dict(slots_per_device=80, **options)  # 640 rows / 8
  assert rollout_sizing.slot_engine_options(c, 32, 8) == dict(slots_per_device=20, **options)
  assert rollout_sizing.evaluation_slot_options(c, 8, 1, 128) == dict(slots_per_device=16, **options)
  assert rollout_sizing.evaluation_slot_options(c, 32, 8, 128)["slots_per_device"] == 4
  assert rollout_sizing.evaluation_slot_options(c, 8, 1, 5)["slots_per_device"] == 1  # ceil(5 / 8)
  c.rollout.slots_per_device = 10
  assert rollout_sizing.slot_engine_options(c, 8, 1)["slots_per_device"] == 10
  assert rollout_sizing.evaluation_slot_options(c, 8, 1, 128)["slots_per_device"] == 10
  assert rollout_sizing.evaluation_slot_options(c, 8, 1, 40)["slots_per_device"] == 5
  c.rollout.engine = "lockstep"
  assert rollout_sizing.evaluation_slot_options(c, 8, 1, 128) is None
  for preset in ("qwen2.5-0.5b", "qwen2.5-1.5b", "tiny", "tiny-mixed"):
    assert config_lib.base_config("ppo", preset).rollout.engine == "slots", preset


@pytest.mark.parametrize("overrides,message", [
    ({"rollout.engine": "stream"}, "rollout.engine must be one of"),
    ({"rollout.engine": "slots", "rollout.max_rows_per_device": 5}, "max_rows_per_device=0 or"),
    ({"rollout.decode_chunk": 0}, "rollout.decode_chunk must be an integer >= 1"),
    ({"rollout.tool_workers": 0}, "rollout.tool_workers must be an integer >= 1"),
    ({"rollout.slots_per_device": -1}, "rollout.slots_per_device must be an integer >= 0"),
])
def test_bad_engine_settings_are_one_error_naming_the_field(overrides, message):
  c = config_lib.base_config("grpo", "tiny")
  c.update_from_flattened_dict(overrides)
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c)
