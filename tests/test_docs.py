"""The docs that are generated from code are current: docs/configuration.md (docs/make_config_reference.py)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reference():
  spec = importlib.util.spec_from_file_location("make_config_reference", REPO / "docs" / "make_config_reference.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_configuration_reference_is_current(reference):
  assert (REPO / "docs" / "configuration.md").read_text() == reference.generate(), (
      "docs/configuration.md is stale: run `python docs/make_config_reference.py`")


def test_every_config_field_is_in_the_reference_with_its_default(reference):
  from agent_r1_jax.trainer import config as config_lib
  text = (REPO / "docs" / "configuration.md").read_text()
  flat = reference.flatten(config_lib.base_config("grpo", "tiny"))
  assert len(flat) > 100
  for field, value in flat.items():
    assert f"| `{field}` |" in text, field
  assert "| `rollout.max_turns` | int | `3` |" in text  # the tiny preset's value, not the paper's 5


def test_a_field_without_a_description_fails_the_generator(reference, monkeypatch):
  notes = dict(reference.FIELD_NOTES)
  del notes["rollout.top_k"]  # no comment beside it in config.py
  monkeypatch.setattr(reference, "FIELD_NOTES", notes)
  with pytest.raises(SystemExit, match="rollout.top_k"):
    reference.generate()
  monkeypatch.setattr(reference, "FIELD_NOTES", dict(reference.FIELD_NOTES, **{"rollout.gone": "x"}))
  with pytest.raises(SystemExit, match="rollout.gone"):
    reference.generate()


def test_comments_are_read_by_the_tokenizer_not_by_text_search(reference):
  source = ('  # Above, first line.\n  # Above, second line.\n  c.a.b = "x # not a comment"  # trailing\n\n'
            '  c.a.c = 1\n  # ---- section ----\n  c.d = 2  # d\n')
  assert reference.source_descriptions(source) == {
      "a.b": "Above, first line. Above, second line. trailing", "d": "d"}


def test_the_reference_does_not_depend_on_where_the_checkout_lives(reference, monkeypatch, tmp_path):
  """Presets point into the shared-data folder by absolute path; the reference writes it relative."""
  here = reference.generate()
  monkeypatch.setenv("AGENT_R1_SHARED_DATA", str(tmp_path / "elsewhere" / "data"))
  assert reference.generate() == here
  assert "`'../shared/data/smollm2/" in here
