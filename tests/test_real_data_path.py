"""The real-data path end to end: real Qwen2.5 tokenizer, real HotpotQA questions, BM25 over their paragraphs.

A random tiny Qwen2 with the full Qwen2.5 vocabulary (151,936 rows, hidden size 16) is saved as a Hugging Face
directory with the real tokenizer files; HotpotQA dev rows are prepared with `prepare_multihopqa` (TFDS
ArrayRecord + a corpus of their context paragraphs); two GRPO steps run through `RLTrainer` from `--config`
style overrides; then the evaluation runs every method on the trained workdir and writes its outputs, and the
CLI answers bad input with one message. Skipped (with the reason) when ../shared/data is absent.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from flax import nnx

from agent_r1_jax.data.prepare_multihopqa import prepare
from agent_r1_jax.evaluation import policy as policy_lib
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM, save_hf_checkpoint
from agent_r1_jax.learner import build
from agent_r1_jax.trainer import loop, task as task_lib
from agent_r1_jax.trainer.checkpointing import IncompatibleCheckpointError
from agent_r1_jax.trainer.config import base_config
from agent_r1_jax.trainer.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parent.parent
QWEN_VOCAB = 151936
NUM_ROWS = 12
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json", "generation_config.json")


def _tiny_qwen(path: pathlib.Path, tokenizer_dir: pathlib.Path, vocab_size: int = QWEN_VOCAB) -> pathlib.Path:
  arch = Qwen2Config.tiny(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1)
  save_hf_checkpoint(Qwen2ForCausalLM(arch, rngs=nnx.Rngs(0)), path)
  for name in TOKENIZER_FILES:
    if (tokenizer_dir / name).is_file():
      shutil.copy(tokenizer_dir / name, path / name)
  return path


@pytest.fixture(scope="module")
def real_setup(shared_data, qwen_tokenizer_dir, tmp_path_factory):
  root = tmp_path_factory.mktemp("real")
  source = shared_data / "hotpotqa" / "rpt_hotpot_dev_distractor_300a.jsonl"
  if not source.is_file():
    pytest.skip(f"HotpotQA distractor dev file not found at {source}")
  rows = source.read_text(encoding="utf-8").splitlines()[:NUM_ROWS]
  (root / "hotpot.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
  report = prepare(hotpotqa_train=str(root / "hotpot.jsonl"), hotpotqa_dev=str(root / "hotpot.jsonl"),
                   output_dir=root / "data", train_size=NUM_ROWS, corpus_output=root / "corpus.jsonl")
  assert report.split_sizes == {"train": NUM_ROWS, "validation_hotpotqa": NUM_ROWS}
  model_dir = _tiny_qwen(root / "model", qwen_tokenizer_dir)
  c = base_config("grpo", "tiny")
  # What `--config.data.source=multihopqa --config.data.prepared_dir=... --config.model.path=...` sets.
  c.data.source, c.data.prepared_dir, c.data.val_sources = "multihopqa", str(root / "data"), ("hotpotqa",)
  c.model.path, c.tool.corpus_path, c.tool.top_k = str(model_dir), str(root / "corpus.jsonl"), 2
  c.env.max_tool_response_length = 300
  c.rollout.update(dict(max_prompt_length=256, max_response_length=48, max_context_length=304, max_turns=2,
                        max_new_tokens_per_turn=8, max_observation_tokens=32, n_samples=2))
  # Evaluation batches of 2 rows match the training rollout (1 prompt x 2 samples): one set of sampler programs.
  c.trainer.update(dict(batch_size=1, total_steps=2, eval_every=2, save_every=1, eval_num_examples=2,
                        eval_batch_size=2, progress_bar=False, export_hf=False))
  c.actor.update(dict(micro_batch_size_per_device=1, num_mini_batches=1, lr=1e-3))
  c.sft.enabled = False
  return root, c


def test_two_grpo_steps_then_every_method_end_to_end(real_setup, monkeypatch):
  root, c = real_setup
  workdir = root / "run"
  evaluated = []
  evaluate_method = loop.RLTrainer.evaluate

  def counting_evaluate(self, sources, *, max_examples):
    evaluated.append(sources is self.task.test)
    return evaluate_method(self, sources, max_examples=max_examples)

  monkeypatch.setattr(loop.RLTrainer, "evaluate", counting_evaluate)
  result = loop.RLTrainer(c, workdir).run()
  assert result.step == 2 and not result.preempted
  # Real data sets evaluate periodically on the held-out split itself, so the last step's pass is the summary's
  # "after RL" (one pass before RL, one at step 2; no third identical greedy pass).
  assert evaluated == [True, True]
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2]
  after_rl = json.loads((workdir / "summary.json").read_text())["after_rl"]["hotpotqa"]
  assert after_rl["em"] == rows[-1]["eval/hotpotqa/em"] and after_rl["f1"] == rows[-1]["eval/hotpotqa/f1"]
  for row in rows:
    assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
  assert policy_lib.checkpoint_steps(workdir) == [0, 1, 2]

  from agent_r1_jax.evaluation import pipeline  # pylint: disable=import-outside-toplevel
  paths = pipeline.run(workdir=str(workdir), hf_checkpoint=None, base_hf_checkpoint=None, step=None,
                       methods=["agent", "base_tool_call", "naive_rag", "no_retrieval"], datasets=["hotpotqa"],
                       out_dir=str(root / "eval"), num_examples=2, batch_size=2, samples_per_dataset=2, seed=0)
  results = json.loads(paths["results"].read_text())
  assert results["policy"].endswith("step 2") and results["base_policy"] == c.model.path
  for method in ("agent", "base_tool_call", "naive_rag", "no_retrieval"):
    s = results["methods"][method]["hotpotqa"]
    assert s["num_examples"] == 2 and 0.0 <= s["em"] <= 1.0
  assert "| Naive RAG |" in paths["table"].read_text()
  records = [json.loads(line) for line in paths["records"].read_text().splitlines()]
  assert len(records) == 8
  questions = {json.loads(r)["question"] for r in (root / "hotpot.jsonl").read_text().splitlines()[:2]}
  for r in records:
    assert r["question"] in questions
    assert "".join(t for _, t in r["segments"]) == r["response"]
    if r["method"] == "naive_rag":  # the passages are real HotpotQA paragraphs, retrieved by BM25
      assert 'Doc 1 (Title: "' in r["prompt"] and "<tools>" not in r["prompt"]
  assert paths["html"].read_text().count('<article class="episode"') == 8


def test_bad_input_gives_one_clear_error(real_setup, qwen_tokenizer_dir, tmp_path):
  root, c = real_setup
  # A checkpoint whose vocabulary does not cover the task's tokenizer.
  small = _tiny_qwen(tmp_path / "small", qwen_tokenizer_dir, vocab_size=1000)
  tokenizer = task_lib._load_tokenizer(str(small))  # pylint: disable=protected-access
  mesh = build.build_mesh(c)
  with pytest.raises(IncompatibleCheckpointError, match=r"vocab_size=1000 but the task's tokenizer has 15\d{4}"):
    policy_lib.hf_policy(small, c, tokenizer, mesh, policy_lib.SamplerCache(c, tokenizer, mesh))
  # A dataset that was not prepared, through the CLI: exit status 2 and one line on stderr.
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "-m", "agent_r1_jax.evaluate", f"--hf_checkpoint={c.model.path}",
         "--config=configs/grpo_multihopqa.py:tiny", "--config.data.source=multihopqa",
         f"--config.data.prepared_dir={c.data.prepared_dir}", f"--config.tool.corpus_path={c.tool.corpus_path}",
         "--datasets=hotpotqa,musique", f"--out_dir={tmp_path / 'eval'}"]
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "dataset 'musique' is not prepared" in errors[0] and "--musique_dev" in errors[0]
  assert "Traceback" not in proc.stderr
