"""The warm-up's read check (`warmup.read_gate`): the loop's stopping rule, the measurement against a model's own
greedy tokens, the config's errors, and a micro warm-up that trains an extra round and records both checks."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.data.sft import SFTExample
from agent_r1_jax.models import load_hf_checkpoint
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.warmup import final_read, read_gate
from agent_r1_jax.trainer import loop
from reference_models import random_hf_checkpoint
from test_trainer import micro_config


def _run(accuracies, *, min_accuracy, max_rounds):
  """The gate over a scripted accuracy sequence; params count the rounds trained."""
  rounds_trained = []

  def check(params, rounds):
    assert params == rounds  # every measurement sees the parameters of the rounds so far
    return read_gate.ReadCheck(rounds=rounds, right=int(round(accuracies[rounds] * 100)), total=100)

  def train_round(params, index):
    rounds_trained.append(index)
    return params + 1

  params, checks = read_gate.train_until_reading(0, check=check, train_round=train_round,
                                                 min_accuracy=min_accuracy, max_rounds=max_rounds)
  return params, [c.accuracy for c in checks], rounds_trained


def test_extra_rounds_run_while_the_read_fails_and_stop_at_the_cap():
  assert _run([0.9], min_accuracy=0.8, max_rounds=2) == (0, [0.9], [])  # reads already: nothing trained
  assert _run([0.5, 0.7, 0.85, 0.95], min_accuracy=0.8, max_rounds=5) == (2, [0.5, 0.7, 0.85], [1, 2])
  assert _run([0.5, 0.6, 0.7, 0.9], min_accuracy=0.8, max_rounds=2) == (2, [0.5, 0.6, 0.7], [1, 2])
  assert _run([0.8], min_accuracy=0.8, max_rounds=2)[2] == []  # the threshold itself passes
  assert _run([0.5, 0.9], min_accuracy=0.8, max_rounds=0) == (0, [0.5], [])  # 0 rounds: measured, not trained


def test_measure_counts_the_reads_the_model_reproduces(tmp_path):
  """Two episodes whose final turn writes the model's own greedy continuation; in the second the value's last
  token is changed, so the model's argmax misses it: 1 of 2 right."""
  random_hf_checkpoint(tmp_path / "ref", vocab=97, hidden=64, layers=2, seed=5)
  model = load_hf_checkpoint(tmp_path / "ref")
  predict = final_read.model_predictor(model, length_multiple=16)
  prompt = np.asarray([3, 14, 15, 92, 65], np.int32)
  greedy = []
  for _ in range(4):
    greedy.append(int(predict([np.concatenate([prompt, np.asarray(greedy, np.int32)])])[0][-1]))
  value = greedy[1:3]
  wrong = greedy[:2] + [(greedy[2] + 1) % 97] + greedy[3:]
  items = [final_read.ProbeItem(SFTExample(prompt, np.asarray(response, np.int32), np.ones(4, np.int32)),
                                tuple(response[1:3]), relation)
           for response, relation in ((greedy, "birth_year"), (wrong, "founder"))]
  assert tuple(items[0].value_ids) == tuple(value)
  graphdef, params = nnx.split(model)
  check = read_gate.measure(graphdef, params, items, rounds=3)
  assert (check.rounds, check.right, check.total, check.accuracy) == (3, 1, 2, 0.5)
  assert check.by_relation == {"birth_year": (1, 1), "founder": (0, 1)}
  assert check.relation_summary() == "founder 0/1, birth_year 1/1"
  with pytest.raises(ValueError, match="no validation episodes"):
    read_gate.measure(graphdef, params, [], rounds=0)


@pytest.mark.parametrize("field, value, message", [
    ("sft.min_read_accuracy", 1.5, "sft.min_read_accuracy must be"),
    ("sft.extra_rounds", -1, "sft.extra_rounds"),
    ("sft.read_check_questions", 0, "sft.read_check_questions"),
    ("sft.extra_lr", 0.0, "sft.extra_lr"),
    ("sft.extra_stage", "copy:10:4", "sft.extra_stage"),
])
def test_bad_read_check_settings_are_refused_with_one_message(field, value, message, tmp_path):
  c = micro_config("grpo", **{"sft.enabled": True, "sft.min_read_accuracy": 0.8, "data.prepared_dir": str(tmp_path),
                              field: value})
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c)


def test_zero_extra_rounds_is_accepted_as_a_report_only_check(tmp_path):
  c = micro_config("grpo", **{"sft.enabled": True, "sft.min_read_accuracy": 0.8, "data.prepared_dir": str(tmp_path),
                              "sft.extra_rounds": 0})
  config_lib.validate(c)
  assert read_gate.applies(c)


def test_real_data_warms_up_without_the_check_the_preset_asks_for(tmp_path):
  """The tiny preset's bar (0.9) must not break a real-data config (e.g. `evaluate` with the tiny model): the
  check reads the synthetic expert's thought, so on `data.source='multihopqa'` it is off, even with the extra
  round's own fields invalid, while the same settings on the synthetic task are checked and refused."""
  settings = {"sft.enabled": True, "sft.min_read_accuracy": 0.8, "data.prepared_dir": str(tmp_path),
              "sft.extra_rounds": -1}
  real = micro_config("grpo", **settings, **{"data.source": "multihopqa"})
  config_lib.validate(real)
  assert not read_gate.applies(real)
  synthetic = micro_config("grpo", **settings)
  with pytest.raises(ValueError, match="sft.extra_rounds"):
    config_lib.validate(synthetic)
  assert read_gate.applies(synthetic)


def test_a_failing_check_trains_extra_rounds_and_records_every_check(tmp_path):
  """A 1-step warm-up of the micro model reads nothing, so with the bar at 1.0 it trains both extra rounds (2 steps
  each, logged after the planned step) and records three checks over the validation questions."""
  c = micro_config("grpo", **{"sft.enabled": True, "sft.stages": "all:1:2", "sft.reading_worlds": 0,
                              "sft.rag_questions": 0, "sft.multi_hop_worlds": 0, "sft.min_read_accuracy": 1.0,
                              "sft.extra_stage": "all:2:2", "sft.extra_rounds": 2})
  trainer = loop.RLTrainer(c, tmp_path)
  steps = []
  trainer.warmup(lambda step, metrics: steps.append(step))
  assert steps == [0, 1, 2, 3, 4]
  checks = trainer.meta["sft_read_checks"]
  assert [check["rounds"] for check in checks] == [0, 1, 2]
  assert all(1 <= check["total"] <= c.data.synthetic.num_validation and check["accuracy"] < 1 for check in checks)
