"""Evaluation CLI and the Table 3 baselines on the synthetic world.

A scripted sampler (a test double of the sampling contract that writes fixed turns per method) drives the
real rollout driver, `NousToolEnv`, BM25 search and scorer, so the expected numbers are computed by hand; a
random tiny model checkpointed in the trainer's orbax layout exercises policy loading and the CLI path.
"""

from __future__ import annotations

import dataclasses
import html.parser
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.data.prompts import INSTRUCTION
from agent_r1_jax.evaluation import datasets as datasets_lib
from agent_r1_jax.evaluation import methods as methods_lib
from agent_r1_jax.evaluation import policy as policy_lib
from agent_r1_jax.evaluation import report, runner
from agent_r1_jax.models import Qwen2ForCausalLM
from agent_r1_jax.rewards.multihopqa import exact_match
from agent_r1_jax.rollout import evaluation
from agent_r1_jax.sampling import SamplingParams, Segment, StopReason
from agent_r1_jax.sizing import rollout_sizing
from agent_r1_jax.tools import format_hits
from agent_r1_jax.learner import build
from agent_r1_jax.trainer import task as task_lib
from agent_r1_jax.trainer.checkpointing import Checkpointer, IncompatibleCheckpointError
from agent_r1_jax.trainer.config import base_config

N_TEST = 6


def _config():
  c = base_config("grpo", "tiny")
  c.data.synthetic.num_train, c.data.synthetic.num_validation, c.data.synthetic.num_test = 40, 10, N_TEST
  c.model.hidden_size, c.model.intermediate_size, c.model.num_hidden_layers = 32, 64, 1
  c.model.num_attention_heads, c.model.num_key_value_heads = 2, 1
  c.rollout.max_observation_tokens = None  # observations are appended whole, so they decode to the env's text
  # The full Qwen2.5 agent prompt (tool block + instruction): the scripted policies tell methods apart by it.
  c.data.tools_in_prompt, c.data.instruction = True, INSTRUCTION
  c.rollout.max_prompt_length, c.rollout.max_context_length = 256, 640
  c.trainer.eval_batch_size = 4
  return c


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  with pytest.MonkeyPatch.context() as mp:  # the same cache folder conftest's autouse fixture points to
    mp.setenv("AGENT_R1_CACHE", str(tmp_path_factory.getbasetemp() / "agent_r1_cache"))
    c = _config()
    yield c, task_lib.build_task(c)


# ---------------------------------------------------------------------------------------------------------
# Segments from the action mask.


def _spans_reference(response_mask, action_mask):
  """Plain loop: walk the real tokens, start a new span whenever the mask value changes."""
  spans = []
  for j in range(int(sum(response_mask))):
    kind = "action" if action_mask[j] else "observation"
    if spans and spans[-1][0] == kind:
      spans[-1][2] = j + 1
    else:
      spans.append([kind, j, j + 1])
  return [tuple(s) for s in spans]


def test_response_spans_match_a_plain_loop():
  rng = np.random.default_rng(0)
  for _ in range(200):
    r = int(rng.integers(1, 24))
    length = int(rng.integers(0, r + 1))
    response_mask = (np.arange(r) < length).astype(np.int32)
    action_mask = (rng.random(r) < 0.6).astype(np.int32) * response_mask
    assert evaluation.response_spans(response_mask, action_mask) == _spans_reference(response_mask, action_mask)


# ---------------------------------------------------------------------------------------------------------
# Scripted policy through the real driver, env and scorer.


class ScriptedSampler:
  """Writes `script(prompt_text)[t]` as row b's t-th turn, honouring budgets and stop tokens."""

  def __init__(self, tokenizer, script, max_cache_length, stop_ids):
    self.tokenizer, self.script = tokenizer, script
    self.max_cache_length, self.stop_token_ids = max_cache_length, list(stop_ids)
    self.pad = int(tokenizer.pad_token_id)

  def prefill(self, params, ids, mask):
    del params
    texts = self.tokenizer.batch_decode([row[m.astype(bool)].tolist() for row, m in zip(ids, mask)],
                                        skip_special_tokens=False)
    return {"turns": [self.script(t) for t in texts], "turn": np.zeros(len(texts), int),
            "lengths": mask.sum(axis=1).astype(np.int64)}

  def decode(self, params, state, budgets, sampling, rng):
    del params, sampling, rng
    rows = []
    for b, budget in enumerate(budgets):
      if budget <= 0:
        rows.append(([], StopReason.NONE))
        continue
      turns = state["turns"][b]
      text = turns[min(state["turn"][b], len(turns) - 1)]
      state["turn"][b] += 1
      ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
      cut = ids[:budget]
      reason = StopReason.STOP_TOKEN if len(cut) == len(ids) and ids[-1] in self.stop_token_ids else StopReason.LENGTH
      rows.append((cut, reason))
    width = max(1, max(len(r[0]) for r in rows))
    tokens = np.full((len(rows), width), self.pad, np.int32)
    for b, (ids, _) in enumerate(rows):
      tokens[b, :len(ids)] = ids
    lengths = np.asarray([len(r[0]) for r in rows], np.int32)
    state["lengths"] = state["lengths"] + lengths
    seg = Segment(tokens=tokens, logprobs=np.zeros(tokens.shape, np.float32), lengths=lengths,
                  stop_reasons=np.asarray([int(r[1]) for r in rows], np.int32))
    return _State(state), seg

  def continue_(self, params, state, tokens, budgets, sampling, rng):
    state = dict(state.d)
    state["lengths"] = state["lengths"] + np.asarray([len(t) for t in tokens])
    return self.decode(params, state, budgets, sampling, rng)


class _State:
  def __init__(self, d):
    self.d = d

  @property
  def lengths(self):
    return self.d["lengths"]


def _prefill_wrapper(sampler):
  """The driver passes the prefill state back to decode: keep a dict state in both."""
  orig_decode = sampler.decode

  def decode(params, state, budgets, sampling, rng):
    return orig_decode(params, state.d if isinstance(state, _State) else state, budgets, sampling, rng)

  sampler.decode = decode
  orig_prefill = sampler.prefill
  sampler.prefill = lambda params, ids, mask: _State(orig_prefill(params, ids, mask))
  return sampler


def _question(prompt: str) -> str:
  return re.search(r"Question: (.*)\n", prompt).group(1)


def _scripted_policy(task, c, name, script):
  tok = task.tokenizer
  stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>", "<|endoftext|>")]
  make = lambda rcfg: _prefill_wrapper(ScriptedSampler(tok, script, rcfg.cache_length, stops))  # noqa: E731
  return policy_lib.Policy(name=name, graphdef=None, params=None, arch=None, make_sampler=make)


def _call(query):
  return ('<think>look it up</think>\n<tool_call>\n{"name": "search", "arguments": {"query": '
          + json.dumps(query) + "}}\n</tool_call>")


def test_scripted_methods_give_hand_computed_metrics_and_an_honest_page(setup, tmp_path):
  c, task = setup
  c = c.copy_and_resolve_references()
  c.rollout.engine = "lockstep"  # the scripted sampler keeps the lockstep sampler's contract, not the slots'
  examples = list(task.test[task_lib.SYNTHETIC_SOURCE])
  gold = {ex["question"]: ex["answers"][0] for ex in examples}
  index = {ex["question"]: i for i, ex in enumerate(examples)}

  def trained(prompt):
    q = _question(prompt)
    if "<tools>" in prompt:  # agent: search, then answer correctly
      return [_call(q), f"<think>found it</think>\n<answer>{gold[q]}</answer><|im_end|>"]
    if "Passages:" in prompt:  # naive_rag: right on even-indexed questions
      answer = gold[q] if index[q] % 2 == 0 else "nobody"
      return [f"<think>read</think>\n<answer>{answer}</answer><|im_end|>"]
    return [f"<answer>{gold[q] if index[q] == 0 else 'nobody'}</answer><|im_end|>"]  # no_retrieval

  def base(prompt):  # a malformed call, then a wrong answer
    return ["<tool_call>\n{not json}\n</tool_call>", "<answer>nobody</answer><|im_end|>"]

  policy = _scripted_policy(task, c, "trained", trained)
  base_policy = _scripted_policy(task, c, "base", base)
  result = runner.evaluate_methods(task, c, policy, base_policy,
                                   ["agent", "base_tool_call", "naive_rag", "no_retrieval"],
                                   {task_lib.SYNTHETIC_SOURCE: examples}, num_examples=None, batch_size=4)
  s = {m: per[task_lib.SYNTHETIC_SOURCE] for m, per in result.summaries.items()}
  n = len(examples)
  assert s["agent"]["em"] == 1.0 and s["agent"]["tool_calls"] == 1.0 and s["agent"]["turns"] == 2.0
  assert s["agent"]["tool_error_rate"] == 0.0
  assert s["base_tool_call"]["em"] == 0.0 and s["base_tool_call"]["tool_error_rate"] == 1.0
  assert s["naive_rag"]["em"] == pytest.approx(len(range(0, n, 2)) / n)
  assert s["naive_rag"]["turns"] == 1.0 and s["naive_rag"]["tool_calls"] == 0.0
  assert s["no_retrieval"]["em"] == pytest.approx(1 / n)
  assert s["agent"]["em"] > s["naive_rag"]["em"] > s["no_retrieval"]["em"]

  # Prompts: naive_rag carries exactly the search tool's passages for the question, and no tool schemas.
  search = task.env.tool_map["search"]
  for r in result.records["naive_rag"][task_lib.SYNTHETIC_SOURCE]:
    hits = search.retriever.search([r.question], search.top_k)[0]
    assert task.env.truncate(format_hits(hits)) in r.prompt
    assert "<tools>" not in r.prompt
  for r in result.records["no_retrieval"][task_lib.SYNTHETIC_SOURCE]:
    assert "<tools>" not in r.prompt and "Doc 1" not in r.prompt

  # Each record's EM is the official normalised exact match of its answer tag (independent scorer).
  for m, per in result.records.items():
    for r in per[task_lib.SYNTHETIC_SOURCE]:
      answers = re.findall(r"<answer>(.*?)</answer>", r.response)
      expected = float(bool(answers) and max(exact_match(answers[-1], g) for g in r.answers))
      assert r.scores["em"] == expected, (m, r.response)
      assert "".join(t for _, t in r.segments) == r.response

  paths = report.write_outputs(tmp_path, result.summaries, result.records, policy="trained", base_policy="base",
                               settings={}, samples_per_dataset=n)
  # The table and JSON hold the hand-computed EMs; the average over one dataset is that dataset's EM.
  table = paths["table"].read_text()
  assert "| Naive RAG | " + f"{s['naive_rag']['em']:.4f} | {s['naive_rag']['em']:.4f} |" in table
  saved = json.loads(paths["results"].read_text())
  assert saved["methods"]["agent"][task_lib.SYNTHETIC_SOURCE]["em"] == 1.0
  assert saved["average_em"]["no_retrieval"] == pytest.approx(1 / n)
  assert len(paths["records"].read_text().splitlines()) == 4 * n

  # The page: observations are exactly what the env returns for the scripted call, each marked as
  # environment text; actions are exactly the scripted turns.
  page = _parse_page(paths["html"].read_text())
  agent_eps = [e for e in page if e["method"] == "agent"]
  assert len(agent_eps) == n
  for ep in agent_eps:
    q = ep["question"]
    observation, _, active = task.env.step(_call(q))
    assert active
    assert ep["observations"] == [observation]
    assert ep["actions"] == [_call(q), f"<think>found it</think>\n<answer>{gold[q]}</answer><|im_end|>"]
    assert all(src == "environment" for src in ep["observation_sources"])
  for ep in page:
    for text in ep["actions"]:
      assert "<tool_response>" not in text
  base_eps = [e for e in page if e["method"] == "base_tool_call"]
  assert all(len(e["observations"]) == 1 and "<tool_response>" in e["observations"][0] for e in base_eps)
  assert all(not e["observations"] for e in page if e["method"] in ("naive_rag", "no_retrieval"))


class _PageParser(html.parser.HTMLParser):
  """Collects, per <article class="episode">, the text of its action and observation <pre> blocks."""

  def __init__(self):
    super().__init__()
    self.episodes, self._stack, self._ep, self._block, self._in_pre, self._in_q = [], [], None, None, False, False

  def handle_starttag(self, tag, attrs):
    if tag in ("meta", "br", "hr", "img", "input", "link"):  # void elements have no end tag
      return
    a = dict(attrs)
    cls = a.get("class", "")
    self._stack.append((tag, cls))
    if tag == "article" and cls == "episode":
      self._ep = {"method": a["data-method"], "question": "", "actions": [], "observations": [],
                  "observation_sources": []}
    elif tag == "div" and cls in ("action", "observation"):
      self._block = cls
      if cls == "observation":
        self._ep["observation_sources"].append(a.get("data-source"))
    elif tag == "pre" and self._block:
      self._in_pre = True
      self._ep[self._block + "s"].append("")
    elif tag == "p" and cls == "question":
      self._in_q = True

  def handle_endtag(self, tag):
    tag_open, cls = self._stack.pop()
    assert tag_open == tag, (tag_open, tag)
    if tag == "pre":
      self._in_pre = False
    elif tag == "div" and cls in ("action", "observation"):
      self._block = None
    elif tag == "article" and cls == "episode":
      self.episodes.append(self._ep)
    elif tag == "p":
      self._in_q = False

  def handle_data(self, data):
    if self._in_pre:
      self._ep[self._block + "s"][-1] += data
    elif self._in_q and self._stack[-1][0] == "p":
      self._ep["question"] += data


def _parse_page(text):
  parser = _PageParser()
  parser.feed(text)
  parser.close()
  for ep in parser.episodes:
    ep["question"] = ep["question"].strip()
  return parser.episodes


# ---------------------------------------------------------------------------------------------------------
# Real tiny model: a workdir checkpoint in the trainer's layout, loaded and evaluated through the CLI code.


def _write_workdir(c, task, workdir, steps):
  """config.json + orbax checkpoints with the trainer's state keys; returns the actor state per step."""
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(c.to_json_best_effort(indent=2))
  arch = build.model_config(c, len(task.tokenizer))
  saved = {}
  ck = Checkpointer(workdir / "checkpoints")
  for step in steps:
    graphdef, params = nnx.split(Qwen2ForCausalLM(arch, rngs=nnx.Rngs(step)))
    state = {"actor": params, "actor_opt": {"mu": jax.tree.map(jnp.zeros_like, params)},
             "rng": jax.random.key_data(jax.random.key(0))}
    ck.save(step, state, {"step": step, "fingerprint": build.fingerprint(c, arch)}, force=True)
    ck.wait()
    saved[step] = params
  ck.close()
  return graphdef, saved


def test_slot_engine_evaluation_keys_examples_by_index_and_greedy_equals_lockstep(setup, monkeypatch):
  """A random tiny model (weights tripled, so questions get different responses) over the 6 test questions.
  Greedy: the slot engine's records equal the lockstep driver's. Sampled (temperature 1): the slot engine's records
  are the same with 1 slot and windows of 2 examples (3 rollouts) as with 4 slots and one window, which holds only
  if each example is keyed by its index, not by its place in a rollout."""
  c, task = setup
  tok = task.tokenizer
  graphdef, params = nnx.split(Qwen2ForCausalLM(build.model_config(c, len(tok)), rngs=nnx.Rngs(5)))
  params = jax.tree.map(lambda x: 3 * x, params)
  limits = build.rollout_config(c, tok)
  sampler = build.build_sampler(c, graphdef, tok, limits, None)
  examples = list(task.test[task_lib.SYNTHETIC_SOURCE])

  def records(batch_size, sampling, engine="slots"):
    lockstep = c.copy_and_resolve_references()
    lockstep.rollout.engine = engine
    options = rollout_sizing.evaluation_slot_options(lockstep, 1, 1, batch_size)
    assert (options is None) == (engine == "lockstep")
    got = evaluation.evaluate_examples(sampler, params, task.env, tok, task.render, examples, limits, sampling,
                                       jax.random.key(1), batch_size=batch_size, slot_options=options)
    return [dataclasses.asdict(r) for r in got]

  greedy = SamplingParams(greedy=True)
  want = records(4, greedy, "lockstep")
  assert records(4, greedy) == want and len({r["response"] for r in want}) > 1
  sampled = SamplingParams(temperature=1.0)
  wide = records(4, sampled)
  monkeypatch.setattr(evaluation, "SLOT_WINDOW_BATCHES", 2)
  assert records(1, sampled) == wide and wide != want
  assert [r["example_id"] for r in wide] == [str(ex["id"]) for ex in examples]


def test_workdir_policy_restores_the_saved_actor_and_rejects_another_shape(setup, tmp_path):
  c, task = setup
  workdir = tmp_path / "run"
  _, saved = _write_workdir(c, task, workdir, [0, 3])
  mesh = build.build_mesh(c)
  for step in (0, 3, None):
    _, params, got = policy_lib.restore_actor(workdir, c, build.model_config(c, len(task.tokenizer)), mesh, step)
    want = saved[3 if step is None else step]
    assert got == (3 if step is None else step)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  other = _config()
  other.model.hidden_size = 48
  with pytest.raises(IncompatibleCheckpointError, match=r"does not match the model config \(vocab_size=.*"
                                                        r"hidden_size=48"):
    policy_lib.workdir_policy(workdir, other, task.tokenizer, mesh, policy_lib.SamplerCache(other, task.tokenizer,
                                                                                             mesh))
  with pytest.raises(ValueError, match=r"checkpoint step 7 not found .* available steps: \[0, 3\]"):
    policy_lib.restore_actor(workdir, c, build.model_config(c, len(task.tokenizer)), mesh, 7)


def test_cli_run_on_a_workdir_writes_every_output(setup, tmp_path):
  from agent_r1_jax.evaluation import pipeline  # pylint: disable=import-outside-toplevel
  c, task = setup
  workdir = tmp_path / "run"
  _write_workdir(c, task, workdir, [0, 2])
  c2 = policy_lib.read_workdir_config(workdir)
  paths = pipeline.run(workdir=str(workdir), hf_checkpoint=None, base_hf_checkpoint=None, step=None,
                       methods=["agent", "base_tool_call", "no_retrieval"], datasets=["synthetic", "one_hop"],
                       out_dir=None, num_examples=2, batch_size=2, samples_per_dataset=1, seed=0, config=c2)
  assert paths["table"].parent == workdir / "eval"
  results = json.loads(paths["results"].read_text())
  assert results["policy"].endswith("step 2") and results["base_policy"].endswith("step 0")
  assert set(results["methods"]) == {"agent", "base_tool_call", "no_retrieval"}
  for per in results["methods"].values():
    assert per[task_lib.SYNTHETIC_SOURCE]["num_examples"] == per["synthetic_one_hop"]["num_examples"] == 2
  records = [json.loads(line) for line in paths["records"].read_text().splitlines()]
  for r in records:  # the segments cover the response exactly, actions first
    assert "".join(t for _, t in r["segments"]) == r["response"]
    assert r["segments"][0][0] == "action"
  assert len(_parse_page(paths["html"].read_text())) == 6  # one sample per method and dataset


# ---------------------------------------------------------------------------------------------------------
# Bad input.


def test_unprepared_dataset_and_unknown_method_raise_one_clear_error(setup, tmp_path):
  c, _ = setup
  with pytest.raises(ValueError, match=r"dataset 'hotpotqa' is not prepared for this task \(available: "
                                       r"\['synthetic_multihop', 'synthetic_one_hop'\]\).*data.source=multihopqa"):
    datasets_lib.select_datasets(c, ["hotpotqa"])
  assert datasets_lib.select_datasets(c, ["synthetic"]) == [task_lib.SYNTHETIC_SOURCE]
  assert datasets_lib.select_datasets(c, None) == [task_lib.SYNTHETIC_SOURCE, "synthetic_one_hop"]
  real = base_config("grpo", "tiny")
  real.data.source, real.data.prepared_dir = "multihopqa", str(tmp_path / "nothing")
  with pytest.raises(ValueError, match=r"dataset 'musique' is not prepared .*--musique_dev=FILE"):
    datasets_lib.select_datasets(real, ["musique"])
  with pytest.raises(ValueError, match=r"unknown method\(s\) \['rag'\]"):
    methods_lib.get_methods(["agent", "rag"])


def test_single_turn_prompt_width_fits_the_longest_prompt_or_says_what_to_lower(setup):
  c, task = setup
  tok = task.tokenizer
  short, long_ = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n", "word " * 100
  n_long = len(tok(long_, add_special_tokens=False)["input_ids"])
  limits = methods_lib.rollout_limits(methods_lib.METHODS["naive_rag"], c, tok, [short, long_])
  assert limits.max_turns == 1 and limits.max_response_length == c.rollout.max_new_tokens_per_turn
  # The long prompt is wider than the training width (256) and the window (640 - 48) holds it: its width is
  # n_long rounded up to a multiple of 64 (a width that ignored the prompt, or did not round, fails here).
  assert c.rollout.max_prompt_length < n_long <= c.rollout.max_context_length - c.rollout.max_new_tokens_per_turn - 64
  assert limits.max_prompt_length == 64 * math.ceil(n_long / 64)
  assert methods_lib.rollout_limits(methods_lib.METHODS["agent"], c, tok, [short]) == build.rollout_config(c, tok)
  small = _config()
  small.rollout.max_context_length = n_long
  with pytest.raises(ValueError, match=r"naive_rag prompt has \d+ tokens.*Lower --config.tool.top_k"):
    methods_lib.rollout_limits(methods_lib.METHODS["naive_rag"], small, tok, [long_])
