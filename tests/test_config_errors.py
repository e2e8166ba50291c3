"""Mistakes in what a user asks for are one line naming the fix, and a run says (and keeps) how its config differs
from its preset: a validation source the prepared data lacks, a config file that is not there, a preset no config
has, and the differences printed at the start and saved in the workdir."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from agent_r1_jax import cli_config
from agent_r1_jax.data import tfds_store
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.trainer import loop, task as task_lib
from test_trainer import micro_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_a_validation_source_the_data_lacks_names_data_val_sources(tmp_path, monkeypatch):
  """HotpotQA prepared alone, the default val_sources (all three sets): the error names the field, the sets the
  data holds and the override that selects them, before anything is loaded."""
  monkeypatch.setattr(tfds_store, "list_splits", lambda root, name: ["train", "validation_hotpotqa"])
  monkeypatch.setattr(tfds_store, "load_split", lambda root, name, split: pytest.fail(f"loaded {split}"))
  c = config_lib.base_config("grpo", "tiny")
  c.data.source, c.data.prepared_dir = "multihopqa", str(tmp_path)
  with pytest.raises(ValueError) as error:
    task_lib.build_task(c)
  message = str(error.value)
  assert "\n" not in message
  assert "data.val_sources names ['2wikimultihopqa', 'musique']" in message and "it has ['hotpotqa']" in message
  assert "--config.data.val_sources=\"('hotpotqa',)\"" in message


def test_the_suggested_override_parses_to_the_sets_the_data_holds():
  """The override the message suggests, given on the command line, is the tuple it names (ml_collections reads
  "a,b" as one string, so the message gives a tuple literal)."""
  from test_wandb_logging import _parse_cli  # pylint: disable=import-outside-toplevel
  assert _parse_cli("--config.data.val_sources=('hotpotqa',)").data.val_sources == ("hotpotqa",)


def test_a_missing_config_file_lists_the_config_files(monkeypatch):
  monkeypatch.chdir(REPO)
  problem = cli_config.config_problem(["train", "--config=configs/grpo_multihop.py"])
  assert problem.startswith("config file configs/grpo_multihop.py not found; the config files in configs/ are: ")
  assert all(f"configs/{algo}_multihopqa.py" in problem for algo in config_lib.ALGORITHMS)


def test_an_unknown_preset_lists_the_presets(monkeypatch):
  monkeypatch.chdir(REPO)
  problem = cli_config.config_problem(["train", "--config=configs/ppo_multihopqa.py:qwen2.5-7b"])
  assert problem.startswith("unknown preset 'qwen2.5-7b'; use one of ")
  assert all(repr(preset) in problem for preset in config_lib.PRESETS)
  assert cli_config.config_problem(["train", "--config=configs/ppo_multihopqa.py:qwen2.5-3b"]) is None


@pytest.mark.parametrize("spec,expected", [("configs/grpo_multihop.py", "error: config file configs/grpo_multihop.py"),
                                           ("configs/grpo_multihopqa.py:big", "error: unknown preset 'big'")])
def test_the_cli_says_it_in_one_line_without_a_traceback(tmp_path, spec, expected):
  out = subprocess.run([sys.executable, "-m", "agent_r1_jax.train", f"--config={spec}", f"--workdir={tmp_path}"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2 and out.stderr.startswith(expected) and out.stderr.count("\n") == 1, out.stderr[-2000:]


def test_a_run_prints_and_keeps_how_its_config_differs_from_the_preset(tmp_path, capsys):
  c = micro_config("grpo", **{"rollout.max_turns": 2})
  loop.RLTrainer(c, tmp_path)
  kept = json.loads((tmp_path / "config_differences.json").read_text())
  preset = config_lib.base_config("grpo", "tiny")
  assert kept["trainer.batch_size"] == {"preset": preset.trainer.batch_size, "run": 2}
  assert kept["model.hidden_size"] == {"preset": preset.model.hidden_size, "run": 32}
  assert "rollout.temperature" not in kept  # the preset's value
  line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("config: grpo at preset tiny"))
  assert f"trainer.batch_size=2 (preset: {preset.trainer.batch_size})" in line
  # The record is the difference itself: the preset with it applied is this run's config.
  rebuilt = config_lib.base_config("grpo", "tiny")
  rebuilt.update_from_flattened_dict({k: v["run"] for k, v in kept.items()})
  assert rebuilt.to_dict() == c.to_dict()
