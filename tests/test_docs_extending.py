"""docs/extending.md runs as written: each section's ```python blocks in one fresh namespace, then checks.

The registries the examples add to (tools, advantage estimators, scorers) are process-global; every test
restores them in place afterwards, so the examples' names do not leak into other tests.
"""

from __future__ import annotations

import contextlib
import io
import operator
import pathlib
import re
import sys
import tempfile

import numpy as np
import pytest

from agent_r1_jax.envs import BaseToolEnv
from agent_r1_jax.rewards import registry as reward_registry
from agent_r1_jax.rl import advantages as adv_module
from agent_r1_jax.tools import registry as tool_registry

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "extending.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def _sections() -> dict[str, list[str]]:
  """`## ` heading -> its python blocks, in order."""
  out: dict[str, list[str]] = {}
  for chunk in re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
    heading, _, body = chunk.partition("\n")
    out[heading.strip()] = _BLOCK.findall(body)
  return out


SECTIONS = _sections()


def _section(prefix: str) -> list[str]:
  matches = [name for name in SECTIONS if name.startswith(prefix)]
  assert len(matches) == 1, f"expected one section starting with {prefix!r}, got {list(SECTIONS)}"
  blocks = SECTIONS[matches[0]]
  assert blocks, f"section {matches[0]!r} has no python blocks"
  return blocks


@pytest.fixture
def run_section(tmp_path, monkeypatch):
  """Runs a section's blocks in one namespace (temp files under tmp_path); returns (namespace, stdout)."""
  registries = (tool_registry._REGISTRY, adv_module.ADVANTAGE_ESTIMATORS, reward_registry._FACTORIES)
  saved = [dict(r) for r in registries]
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  monkeypatch.setattr(sys, "path", list(sys.path))
  monkeypatch.chdir(tmp_path)
  modules_before = set(sys.modules)
  envs = []

  def run(prefix: str):
    namespace: dict = {"__name__": f"docs_extending_{prefix.rstrip('.')}"}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      for i, block in enumerate(_section(prefix)):
        exec(compile(block, f"{DOC.name}[{prefix} block {i}]", "exec"), namespace)  # pylint: disable=exec-used
    envs.extend(v for v in namespace.values() if isinstance(v, BaseToolEnv))
    return namespace, stdout.getvalue()

  yield run
  for env in envs:
    env.close()
  for registry, snapshot in zip(registries, saved):
    registry.clear()
    registry.update(snapshot)
  for name in set(sys.modules) - modules_before:
    if name in ("my_extensions", "my_grpo"):
      del sys.modules[name]


def test_doc_has_the_five_extension_points_and_the_cli_section():
  headings = list(SECTIONS)
  for prefix in ("1.", "2.", "3.", "4.", "5.", "6."):
    assert sum(h.startswith(prefix) for h in headings) == 1, headings


def test_tool_section(run_section):
  ns, out = run_section("1.")
  from agent_r1_jax.tools import registered_tools
  assert "calculator" in registered_tools()
  calc = ns["calc"]
  assert calc.name == "calculator"
  # The tool against plain Python arithmetic, through the schema-checked batch path.
  rng = np.random.default_rng(0)
  ops = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
  calls = [{"a": float(a), "b": float(b), "op": op}
           for a, b, op in zip(rng.integers(-50, 50, 12), rng.integers(1, 20, 12), rng.choice(list(ops), 12))]
  for call, result in zip(calls, calc.call_batch(calls)):
    assert result.success
    assert float(result.content) == pytest.approx(ops[call["op"]](call["a"], call["b"]), rel=1e-11)

  obs = ns["result"].observation
  assert obs == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                 "<|im_start|>assistant\n")
  assert ns["result"].successes == [True] and ns["result"].active
  env = ns["env"]
  zero = env.step(ns["zero"])
  assert "<tool_response>\nError: division by zero\n</tool_response>" in zero.observation
  assert not zero.observation.startswith("<|im_end|>")  # the turn already closed itself
  assert zero.successes == [False] and zero.active
  bad_op = env.step(ns["bad_op"])
  assert 'Error: invalid arguments for tool "calculator"' in bad_op.observation and bad_op.successes == [False]
  not_json = env.step(ns["not_json"])
  assert "Error: the tool call is not valid JSON" in not_json.observation and not_json.active
  assert tuple(ns["final"]) == ("", [], False)
  # batch_step == step row by row
  texts = [ns["turn"], ns["zero"], ns["bad_op"], "<answer>42</answer><|im_end|>"]
  assert env.batch_step(texts) == [env.step(t) for t in texts]
  assert "ToolResult(content='42', success=True)" in out
  assert "is a required property" in out


def test_env_section(run_section):
  ns, out = run_section("2.")
  assert ns["result"].observation == "\n<|im_start|>user\nObservation: 42<|im_end|>\n<|im_start|>assistant\n"
  assert ns["result"].successes == [True] and ns["result"].active
  env = ns["env"]
  malformed = env.step("Thought: ...\nAction: add[a=40, b=2]<|im_end|>")
  assert "Error: the action input is not valid JSON" in malformed.observation
  assert malformed.successes == [False] and malformed.active
  unknown = env.step('Action: multiply[{"a": 6, "b": 7}]<|im_end|>')
  assert 'Error: unknown tool "multiply"' in unknown.observation and unknown.successes == [False]
  schema = env.step('Action: add[{"a": 40}]<|im_end|>')
  assert "'b' is a required property" in schema.observation
  assert tuple(env.step("Thought: I know it.\nFinal Answer: 42<|im_end|>")) == ("", [], False)
  # An unclosed turn gets the <|im_end|> it lacks; JSON holding ']' parses (greedy to the line's last ']').
  list_arg = env.step('Action: add[{"a": 1, "b": 2, "note": "[x]"}]')
  assert list_arg.observation.startswith("<|im_end|>\n<|im_start|>user\nObservation: 3<|im_end|>")
  texts = ['Action: add[{"a": 1, "b": 2}]<|im_end|>', "Final Answer: 3<|im_end|>", 'Action: add[[1]]']
  assert env.batch_step(texts) == [env.step(t) for t in texts]
  assert out.strip().endswith("True")


def _median_baseline_reference(rewards, mask, group_ids):
  """Plain numpy loop: A_{i,t} = (s_i - median of s over i's group) * m_{i,t}, baseline 0 for a group of one."""
  scores = np.array([sum(rewards[i, t] for t in range(mask.shape[1]) if mask[i, t]) for i in range(len(mask))])
  out = np.zeros(mask.shape, np.float64)
  for i in range(len(mask)):
    members = [scores[j] for j in range(len(mask)) if group_ids[j] == group_ids[i]]
    baseline = float(np.median(members)) if len(members) > 1 else 0.0
    for t in range(mask.shape[1]):
      if mask[i, t]:
        out[i, t] = scores[i] - baseline
  return out


def test_estimator_section(run_section):
  ns, out = run_section("3.")
  from agent_r1_jax import rl
  est = rl.get_estimator("median_baseline")
  assert est.needs_group_ids and not est.needs_values
  mask, rewards, groups = ns["action_mask"], ns["token_level_rewards"], ns["group_ids"]
  adv = np.asarray(ns["advantages"])
  assert adv.shape == mask.shape == (5, 6)
  np.testing.assert_allclose(adv, _median_baseline_reference(rewards, mask, groups), atol=1e-6)
  assert np.all(adv[mask == 0] == 0.0)
  np.testing.assert_allclose(adv[:, 0], [0.75, -0.25, 0.0, 0.75, -0.75], atol=1e-6)
  np.testing.assert_allclose(np.asarray(ns["advantages_jit"]), adv, atol=1e-6)

  # A second, random case (even and odd groups, a group of one, rewards off the mask that must be ignored).
  rng = np.random.default_rng(1)
  b, t = 9, 7
  mask2 = (rng.random((b, t)) < 0.6).astype(np.int32)
  mask2[:, 0] = 1
  rewards2 = rng.normal(size=(b, t)).astype(np.float32)
  groups2 = np.array([4, 4, 4, 4, 11, 11, 11, 2, 9], np.int32)
  adv2, ret2 = rl.compute_advantages("median_baseline", rewards2, mask2, group_ids=groups2)
  np.testing.assert_allclose(np.asarray(adv2), _median_baseline_reference(rewards2, mask2, groups2), atol=1e-5)
  assert np.all(np.asarray(adv2)[mask2 == 0] == 0.0)
  np.testing.assert_array_equal(np.asarray(ret2), np.asarray(adv2))

  assert "needs `group_ids`" in out
  assert "median_baseline 5 False" in out
  assert "algorithm.adv_estimator must be one of" in out and "'mean_baseline'" in out


def test_reward_section(run_section):
  ns, out = run_section("4.")
  from agent_r1_jax.rewards import get_scorer, known_data_sources
  from agent_r1_jax.rewards.multihopqa import compute_score
  assert "numeric_qa" in known_data_sources()
  score = get_scorer("numeric_qa", style="partial_credit")  # the trainer passes reward_style to every factory
  gold = ["3.142857"]
  close, too_far, in_words = (score(ns[k], gold) for k in ("close", "too_far", "in_words"))
  # |3.1429 - 3.142857| = 4.3e-5 <= 0.01 * 3.142857; |3 - 3.142857| = 0.143 > 0.0314; "about three" is no number
  assert (close["score"], close["em"], close["format"], close["format_tool"]) == (1.0, 1.0, 1.0, 1.0)
  assert (too_far["score"], too_far["em"], too_far["format"]) == (0.0, 0.0, 1.0)
  assert (in_words["score"], in_words["format"], in_words["format_tool"]) == (-1.0, 0.0, 0.0)
  assert close["answer"] == "3.1429" and in_words["answer"] == "about three"
  assert score(ns["close"], "3.15")["score"] == 1.0    # |3.1429 - 3.15| = 0.0071 <= 0.0315
  assert score(ns["close"], ["2", "100"])["score"] == 0.0
  # The format gate agrees with the built-in multi-hop QA reward on the same turns.
  assert compute_score(ns["close"], ["3.1429"])["format"] == close["format"] == 1.0
  from agent_r1_jax.rollout.evaluation import RECORD_METRICS
  for result in (close, too_far, in_words):
    assert set(RECORD_METRICS) <= set(result)
  assert "already registered for data_source 'hotpotqa'" in out
  with pytest.raises(ValueError, match="already registered"):
    reward_registry.register_scorer("numeric_qa", lambda **_: None)
  assert out.splitlines()[:3] == ["1.0 1.0 3.1429", "0.0 1.0 3", "-1.0 0.0 about three"]


def test_data_section(run_section, tmp_path):
  ns, out = run_section("5.")
  train = sorted(ns["load_split"](ns["work"] / "prepared", "multihopqa", "train"), key=lambda ex: ex["id"])
  assert [ex["id"] for ex in train] == ["q1", "q2"]
  assert train[1]["answers"] == ["Lima", "Lima, Peru"] and train[1]["data_source"] == "hotpotqa"
  dev = list(ns["load_split"](ns["work"] / "prepared", "multihopqa", "validation_hotpotqa"))
  assert dev[0]["answers"] == ["Nile", "the Nile"]
  assert "q3: empty question" in out
  assert "['train', 'validation_hotpotqa']" in out.splitlines()
  assert str(ns["work"]).startswith(str(tmp_path))

  own = ns["train"]
  assert len(own) == 2
  assert own[0] == {"id": "num-0", "data_source": "numeric_qa", "question": "What is 22 divided by 7?",
                    "answers": ["3.142857"], "supporting_titles": [], "contexts": [], "type": ""}
  assert ns["list_splits"](ns["data_dir"], "multihopqa") == ["train", "validation_numeric"]
  prompt = ns["prompt"]
  assert prompt.endswith("<|im_start|>assistant\n")
  assert "<|im_start|>user\nQuestion: What is 22 divided by 7?\nUse the calculator for arithmetic." in prompt
  assert '"name": "calculator"' in prompt and "<tools>" in prompt
  assert "['num-0', 'num-1']" in out


def test_cli_section(run_section):
  ns, out = run_section("6.")
  from agent_r1_jax import rl
  assert ns["config"].algorithm.adv_estimator == "max_baseline"
  assert out.strip().splitlines()[-1] == "max_baseline"
  mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], np.int32)
  rewards = np.array([[0, 1, 0], [0.5, 0, 0], [0, 0, 2]], np.float32)
  adv, _ = rl.compute_advantages("max_baseline", rewards, mask, group_ids=np.array([0, 0, 1]))
  np.testing.assert_allclose(np.asarray(adv), [[0, 0, 0], [-0.5, 0, 0], [0, 0, 0]])
