"""`--config.init_from`: RL starts from another run's step-0 policy (or a Hugging Face export) instead of a warm-up.

The source run differs from every target in its seed, so a target that initialised its own weights (or read the
wrong checkpoint) would not match the source's parameters.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_trainer import micro_config

from agent_r1_jax.evaluation import policy as policy_lib
from agent_r1_jax.learner import build
from agent_r1_jax.trainer import loop
from agent_r1_jax.trainer import task as task_lib
from agent_r1_jax.trainer.checkpointing import IncompatibleCheckpointError


def _leaves(tree) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _assert_equal(a, b) -> None:
  la, lb = _leaves(a), _leaves(b)
  assert len(la) == len(lb) and la
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(x, y)


def _differs(a, b) -> bool:
  return any(not np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b)))


def _step0_actor(workdir, c):
  """The actor parameters of `workdir`'s step-0 checkpoint, read as the evaluation reads them."""
  tok = task_lib.build_task(c).tokenizer
  arch = build.model_config(c, vocab_size=len(tok))
  return policy_lib.restore_actor(workdir, c, arch, build.build_mesh(c), step=0)[1]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A GRPO run stopped right after its step-0 checkpoint (`total_steps=0`), seed 5, with its HF export."""
  workdir = tmp_path_factory.mktemp("source")
  c = micro_config("grpo", seed=5, **{"trainer.total_steps": 0, "trainer.export_hf": True})
  result = loop.train(c, workdir)
  assert result.step == 0 and set(result.summary) == {"before_rl", "after_rl"}
  assert result.summary["after_rl"] == result.summary["before_rl"]  # no RL step: the step-0 evaluation, reused
  assert policy_lib.checkpoint_steps(workdir) == [0]
  return workdir, _step0_actor(workdir, c)


def test_a_run_from_a_workdir_starts_from_its_step0_policy_and_keeps_its_own_state(source, tmp_path):
  src_dir, src_actor = source
  c = micro_config("grpo", init_from=str(src_dir), **{"trainer.total_steps": 1})
  fresh = loop.RLTrainer(micro_config("grpo"), tmp_path / "fresh").state["actor"]
  assert _differs(fresh, src_actor)  # the target's own initialisation is not the source's
  result = loop.train(c, tmp_path / "run")
  assert result.step == 1
  _assert_equal(_step0_actor(tmp_path / "run", c), src_actor)
  assert policy_lib.checkpoint_steps(tmp_path / "run") == [0, 1]
  assert policy_lib.checkpoint_steps(src_dir) == [0]  # the source run is read, never written


def test_reference_and_ppo_critic_backbone_start_from_the_source_value_head_fresh(source, tmp_path):
  src_dir, src_actor = source
  trainer = loop.RLTrainer(micro_config("ppo", init_from=str(src_dir)), tmp_path)
  fresh_critic = jax.tree.map(np.asarray, trainer.state["critic"])
  trainer.init_from(str(src_dir))
  _assert_equal(trainer.state["actor"], src_actor)
  _assert_equal(trainer.state["ref"], src_actor)
  _assert_equal(trainer.state["critic"]["model"], src_actor["model"])
  for head in ("value_kernel", "value_bias"):
    _assert_equal(trainer.state["critic"][head], fresh_critic[head])
  # The optimizer restarts: AdamW's moments are zero for every parameter.
  assert all(not np.any(x) for x in _leaves(trainer.state["actor_opt"]) if x.ndim > 0)


def test_a_hugging_face_export_is_a_starting_point_too(source, tmp_path):
  src_dir, src_actor = source
  trainer = loop.RLTrainer(micro_config("grpo", init_from=str(src_dir / "hf_export")), tmp_path)
  trainer.init_from(str(src_dir / "hf_export"))
  _assert_equal(trainer.state["actor"], src_actor)


def test_a_missing_source_is_one_clear_error(tmp_path):
  c = micro_config("grpo", init_from=str(tmp_path / "nowhere"))
  with pytest.raises(ValueError, match=r"init_from=.*nowhere is not a directory"):
    loop.train(c, tmp_path / "run")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match=r"neither a training workdir .* nor a Hugging Face checkpoint"):
    loop.train(micro_config("grpo", init_from=str(tmp_path / "empty")), tmp_path / "run2")


def test_a_source_of_another_architecture_is_one_clear_error(source, tmp_path):
  src_dir, _ = source
  wider = micro_config("grpo", init_from=str(src_dir), **{"model.hidden_size": 48})
  with pytest.raises(IncompatibleCheckpointError,
                     match=r"init_from=.*does not match the model config .*hidden_size=48"):
    loop.train(wider, tmp_path / "run")
  with pytest.raises(IncompatibleCheckpointError,
                     match=r"init_from=.*another architecture .*hidden_size: 32 there, 48"):
    loop.train(micro_config("grpo", init_from=str(src_dir / "hf_export"), **{"model.hidden_size": 48}),
               tmp_path / "run2")


def test_a_hugging_face_source_with_other_math_is_refused_naming_the_field(source, tmp_path):
  """Same shapes, other math (#33, defect 6: only the shape fields were compared, so these ran silently): a RoPE
  base the run does not use, and an RMSNorm epsilon edited into a copy of the export's config.json."""
  import json  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  src_dir, _ = source
  with pytest.raises(IncompatibleCheckpointError, match=r"another architecture .*rope_theta: 10000.0 there, 500000.0"):
    loop.train(micro_config("grpo", init_from=str(src_dir / "hf_export"), **{"model.rope_theta": 500000.0}),
               tmp_path / "run")
  edited = tmp_path / "edited"
  shutil.copytree(src_dir / "hf_export", edited)
  config = json.loads((edited / "config.json").read_text())
  config["rms_norm_eps"] = 1e-5
  (edited / "config.json").write_text(json.dumps(config))
  with pytest.raises(IncompatibleCheckpointError, match=r"rms_norm_eps: 1e-05 there, 1e-06 here"):
    loop.train(micro_config("grpo", init_from=str(edited)), tmp_path / "run2")
