"""The final read (`warmup.final_read`) and the reading probe: the read span, the teacher-forced check's
alignment, the sets it plays, and its JAX predictions against transformers' PyTorch model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent_r1_jax.data.sft import SFTExample
from agent_r1_jax.experiments import reading_probe
from agent_r1_jax.warmup import final_read as rp
from agent_r1_jax.models import load_hf_checkpoint
from reference_models import random_hf_checkpoint


def _item(prompt, response, mask, value, relation="birth_year"):
  return rp.ProbeItem(SFTExample(np.asarray(prompt, np.int32), np.asarray(response, np.int32),
                                 np.asarray(mask, np.int32)), tuple(value), relation)


def test_the_read_is_the_values_first_occurrence_in_the_final_turn():
  """Response: turn 1 writes 7 8 (an earlier action), the observation says 7 8, the final turn writes 5 7 8 9 7 8:
  the read is the final turn's first 7 8, at response positions 9-10."""
  response = [1, 7, 8, 2, 3, 7, 8, 4, 5, 7, 8, 9, 7, 8]
  mask = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
  assert rp.final_turn(np.asarray(mask)) == (8, 14)
  assert rp.read_span(np.asarray(response), np.asarray(mask), [7, 8]) == (9, 11)
  with pytest.raises(ValueError, match="does not contain"):
    rp.read_span(np.asarray(response), np.asarray(mask), [3, 7])  # only in the observation
  with pytest.raises(ValueError, match="no action token"):
    rp.final_turn(np.zeros(4, np.int32))


def test_a_read_is_right_only_if_every_value_token_is_predicted_at_the_position_before_it():
  """Prompt of 3 tokens, response [4 5 6 7] all action, value [5 6] at response 1-2, i.e. sequence positions
  4-5, predicted at positions 3 and 4."""
  item = _item([10, 11, 12], [4, 5, 6, 7], [1, 1, 1, 1], [5, 6])
  sequence = np.asarray([10, 11, 12, 4, 5, 6, 7])
  perfect = np.concatenate([sequence[1:], [0]])  # position t predicts token t + 1
  assert rp.read_is_right(perfect, item)
  for wrong_at in (3, 4):
    predicted = perfect.copy()
    predicted[wrong_at] = 99
    assert not rp.read_is_right(predicted, item)
  elsewhere = perfect.copy()
  elsewhere[[0, 1, 2, 5]] = 99  # outside the read: the prompt, and the token after the value
  assert rp.read_is_right(elsewhere, item)
  assert not rp.read_is_right(np.concatenate([sequence, [0]])[:-1], item)  # unshifted: off by one


def test_probe_counts_per_relation_over_batches():
  """A predictor that reads everything but the relation 'birthplace': counts from a plain tally of the items."""
  rng = np.random.default_rng(0)
  relations = ["birth_year", "birthplace", "founder"] * 7
  items = []
  for k, relation in enumerate(relations):
    value = rng.integers(50, 60, size=1 + k % 3).tolist()
    response = [1, 2, 3] + value + [4]
    items.append(_item(rng.integers(5, 9, size=2 + k % 4).tolist(), response, [1] * len(response), value, relation))
  by_sequence = {}
  for it in items:
    sequence = np.concatenate([it.example.prompt_ids, it.example.response_ids])
    predicted = np.concatenate([sequence[1:], [0]])
    if it.relation == "birthplace":
      predicted[len(it.example.prompt_ids) - 1 + 3 + len(it.value_ids) - 1] = 0  # the value's last token
    by_sequence[sequence.tobytes()] = predicted
  calls = []

  def predict(sequences):
    calls.append(len(sequences))
    return [by_sequence[np.asarray(s).tobytes()] for s in sequences]

  counts = rp.probe(predict, items, batch_size=4)
  expected = {r: [0 if r == "birthplace" else relations.count(r), relations.count(r)] for r in set(relations)}
  assert counts == expected
  assert calls == [4, 4, 4, 4, 4, 1]


def test_model_predictions_match_transformers_on_right_padded_batches(tmp_path):
  reference = random_hf_checkpoint(tmp_path / "ref", vocab=97, hidden=64, layers=2, seed=3)
  model = load_hf_checkpoint(tmp_path / "ref")
  predict = rp.model_predictor(model, length_multiple=16)
  rng = np.random.default_rng(1)
  sequences = [rng.integers(0, 97, size=n).astype(np.int32) for n in (5, 17, 30)]  # padded to 32 together
  for sequence, predicted in zip(sequences, predict(sequences)):
    with torch.no_grad():
      expected = reference(torch.tensor(sequence[None], dtype=torch.long)).logits[0].argmax(-1).numpy()
    assert predicted.shape == (len(sequence),)
    np.testing.assert_array_equal(predicted, expected)


def test_probe_sets_read_each_questions_answer_inside_the_final_turn():
  """On a small world: every set plays grounded expert episodes, every read span decodes to the question's
  answer inside the final assistant turn, and a perfect predictor reads all of them."""
  from agent_r1_jax.trainer.config import base_config  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer.task import build_task  # pylint: disable=import-outside-toplevel

  c = base_config("grpo", "tiny")
  c.data.synthetic.update(dict(num_train=50, num_validation=10, num_test=10))
  task = build_task(c)
  tok = task.tokenizer
  sets = reading_probe.probe_sets(c, task, num_questions=10)
  assert set(sets) == {"task", "one_hop", "multi_hop"}
  for name, items in sets.items():
    assert 7 <= len(items) <= 10, name  # episodes whose retrieval missed a value are dropped
    for item in items:
      ex = item.example
      start, end = rp.read_span(ex.response_ids, ex.action_mask, item.value_ids)
      turn_start, turn_end = rp.final_turn(ex.action_mask)
      assert turn_start <= start < end <= turn_end
      final = tok.decode(ex.response_ids[turn_start:turn_end].tolist())
      value = tok.decode(list(item.value_ids)).strip()
      assert f"<answer>{value}</answer>" in final and tok.decode(ex.response_ids[start:end].tolist()).strip() == value
    perfect = rp.probe(lambda seqs: [np.concatenate([s[1:], [0]]) for s in seqs], items)
    assert all(right == n for right, n in perfect.values())
  assert {item.relation for item in sets["one_hop"]} - {"birth_year", "birthplace", "founder"}
