"""A real pretrained Llama-family model: SmolLM2-135M-Instruct from the shared GGUF, against transformers.

The GGUF (Q4_1) is converted once per module into a temp directory with `models.convert_gguf`; our model
(`load_hf_checkpoint`, float32) and transformers' PyTorch `LlamaForCausalLM` then read the same dense
checkpoint, so any difference is the implementations', not the quantisation's. Skipped (with the reason)
when the shared data is absent. The last tests use random tiny `transformers.LlamaConfig` models and
need no shared data.
"""

from __future__ import annotations

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from agent_r1_jax.models import (ConfigError, Qwen2Config, count_params, load_hf_checkpoint,
                                 save_hf_checkpoint)
from agent_r1_jax.models import convert_gguf as convert_lib
from agent_r1_jax.sampling import Sampler, SamplingParams
import padding
from reference_models import random_hf_checkpoint

GGUF = pathlib.Path("smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
IM_START, IM_END = 1, 2

# Real chat prompts of different lengths (rendered with the tokenizer's chat template: 25 to ~60 tokens).
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the ocean."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Name three primary colors."},
     {"role": "assistant", "content": "Red, blue and yellow."},
     {"role": "user", "content": "Which of them is usually called the warmest, and why?"}],
    [{"role": "user", "content": "Explain in one sentence why the sky is blue during the day."}],
]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
  """PyTorch on one thread here: on a shared 2-core machine its second (spinning) thread made the
  reference's generate ~5x slower in wall and CPU time alike."""
  before = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(before)


@pytest.fixture(scope="module")
def gguf_file(shared_data: pathlib.Path) -> pathlib.Path:
  path = shared_data / GGUF
  if not path.is_file():
    pytest.skip(f"SmolLM2 GGUF not found at {path}")
  return path


@pytest.fixture(scope="module")
def smollm2_dir(gguf_file, tmp_path_factory) -> pathlib.Path:
  """The converted float32 HF checkpoint (one conversion per module)."""
  out = tmp_path_factory.mktemp("smollm2") / "hf"
  start = time.perf_counter()
  convert_lib.convert_gguf(gguf_file, out)
  print(f"\nconvert_gguf: {time.perf_counter() - start:.1f} s")
  return out


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
  return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def torch_model(smollm2_dir):
  return transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ours(smollm2_dir):
  return load_hf_checkpoint(smollm2_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
  rows = []
  for conv in CONVERSATIONS:
    text = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
  return rows


def left_pad(rows: list[list[int]], pad: int = IM_END) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded ids `[B, T]` (`<|im_end|>` by default) and their 0/1 mask."""
  return padding.left_pad(rows, pad=pad)


def torch_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.float().numpy()


@nnx.jit
def _forward(model, ids, mask):
  return model(ids, mask)


def our_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  return np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))


# -- the conversion ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_conversion_writes_a_llama_checkpoint_and_chat_tokenizer(gguf_file, smollm2_dir, tokenizer,
                                                                  monkeypatch):
  cfg = json.loads((smollm2_dir / "config.json").read_text())
  assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
  assert "quantization_config" not in cfg
  config = Qwen2Config.from_pretrained_dir(smollm2_dir)
  assert not config.attention_bias and config.tie_word_embeddings
  assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
          config.num_key_value_heads, config.vocab_size) == (30, 576, 9, 3, 49152)
  assert config.num_params() == 134_515_008  # SmolLM2-135M, embedding tied
  # The tokenizer keeps the GGUF's ChatML template; its markers are ids 1 and 2.
  assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
  assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [IM_START, IM_END]
  assert tokenizer.eos_token_id == IM_END
  # A second call finds the marker and does nothing; without it the directory counts as unfinished.
  weights = smollm2_dir / "model.safetensors"
  before = weights.stat().st_mtime_ns

  def no_conversion():
    raise AssertionError("a finished conversion was redone")

  monkeypatch.setattr(convert_lib, "_require_dependencies", no_conversion)
  assert convert_lib.convert_gguf(gguf_file, smollm2_dir) == smollm2_dir
  assert weights.stat().st_mtime_ns == before
  assert convert_lib.is_converted(smollm2_dir, gguf_file)
  assert not convert_lib.is_converted(smollm2_dir, gguf_file, dtype="bfloat16")
  marker = json.loads((smollm2_dir / convert_lib.MARKER).read_text())
  assert marker["gguf"] == gguf_file.name and marker["dtype"] == "float32"


@pytest.mark.slow
def test_logits_match_transformers_on_left_padded_chat_prompts(ours, torch_model, prompts):
  ids, mask = left_pad(prompts)
  assert len(set(mask.sum(1))) == len(prompts) and ids.shape[1] < 100  # all lengths differ
  start = time.perf_counter()
  mine = our_logits(ours, ids, mask)
  ours_s = time.perf_counter() - start
  start = time.perf_counter()
  ref = torch_logits(torch_model, ids, mask)
  torch_s = time.perf_counter() - start
  real = mask.astype(bool)
  diff = float(np.max(np.abs(mine[real] - ref[real])))
  print(f"\nSmolLM2 logits {ids.shape}: max |ours - transformers| = {diff:.2e} "
        f"(ours {ours_s:.2f} s incl. compile, transformers {torch_s:.2f} s)")
  assert diff < 1e-3
  # Same next-token choice at every real position.
  np.testing.assert_array_equal(mine[real].argmax(-1), ref[real].argmax(-1))


@pytest.mark.slow
def test_greedy_generation_matches_transformers_generate(ours, torch_model, prompts):
  new = 32
  refs = []
  for p in prompts:  # one unpadded row at a time, as a user would call generate
    with torch.no_grad():
      out = torch_model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=new, do_sample=False, eos_token_id=IM_END,
                                 pad_token_id=IM_END)
    refs.append(out[0, len(p):].tolist())
  graphdef, params = nnx.split(ours)
  sampler = Sampler(graphdef, max_cache_length=160, stop_token_ids=[IM_END], pad_id=IM_END)
  state = sampler.prefill(params, *left_pad(prompts))
  _, seg = sampler.decode(params, state, np.full(len(prompts), new), SamplingParams(greedy=True),
                          jax.random.key(0))
  for row, ref in enumerate(refs):
    assert seg.tokens[row, :seg.lengths[row]].tolist() == ref, row
  assert sum(len(r) for r in refs) > 2 * new  # real continuations, not immediate stops


@pytest.mark.slow
def test_export_loads_in_transformers_with_the_same_logits(ours, torch_model, prompts, tmp_path):
  save_hf_checkpoint(ours, tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
  assert isinstance(reloaded, transformers.LlamaForCausalLM)
  # float32 in, float32 out: every tensor comes back bit for bit (the tied head included).
  expected = torch_model.state_dict()
  for name, tensor in reloaded.state_dict().items():
    assert torch.equal(tensor, expected[name]), name
  # One short prompt through both (a 135M forward costs seconds on a shared 2-core CPU).
  shortest = min(prompts, key=len)
  ids, mask = np.asarray([shortest], np.int32), np.ones((1, len(shortest)), np.int32)
  np.testing.assert_allclose(torch_logits(reloaded, ids, mask), torch_logits(torch_model, ids, mask),
                             atol=1e-5, rtol=0)


# -- conversion errors (no shared data needed) ---------------------------------------------------------


def test_convert_gguf_bad_input(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError, match="nope.gguf: GGUF file not found"):
    convert_lib.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")
  fake = tmp_path / "fake.gguf"
  fake.write_bytes(b"GGUF")
  with pytest.raises(ValueError, match="dtype must be one of"):
    convert_lib.convert_gguf(fake, tmp_path / "out", dtype="float16")
  real_find_spec = convert_lib.importlib.util.find_spec
  monkeypatch.setattr(convert_lib.importlib.util, "find_spec",
                      lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
  with pytest.raises(ImportError, match=r"needs gguf .*pip install"):
    convert_lib.convert_gguf(fake, tmp_path / "out")
  assert not (tmp_path / "out" / convert_lib.MARKER).exists()


# -- Llama config import/export on random tiny models (no shared data needed) --------------------------


def make_tiny_llama(path: pathlib.Path, *, tie: bool, seed: int = 0) -> transformers.LlamaForCausalLM:
  return random_hf_checkpoint(path, architecture="llama", tie=tie, seed=seed)


@pytest.mark.parametrize("tie", [True, False])
def test_tiny_llama_import_export_round_trip(tmp_path, tie):
  hf = make_tiny_llama(tmp_path / "in", tie=tie)
  model = load_hf_checkpoint(tmp_path / "in")
  config = model.config
  assert not config.attention_bias and config.model_type == "llama"
  names = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]
  assert not [n for n in names if "bias" in n]  # no bias parameters at all, not zero ones
  n_torch = sum(p.numel() for p in hf.parameters())  # tied weights are counted once
  assert count_params(model) == config.num_params() == n_torch
  ids, mask = left_pad([[5, 17, 42, 9, 33, 71, 8, 12, 60], [11, 4, 90], [23, 7, 55, 61, 2, 19]], pad=0)
  real = mask.astype(bool)
  ref = torch_logits(hf, ids, mask)
  np.testing.assert_allclose(our_logits(model, ids, mask)[real], ref[real], atol=1e-4, rtol=0)
  save_hf_checkpoint(model, tmp_path / "out")
  cfg = json.loads((tmp_path / "out" / "config.json").read_text())
  assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
  assert cfg["attention_bias"] is False and cfg["mlp_bias"] is False
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
  assert isinstance(reloaded, transformers.LlamaForCausalLM)
  assert Qwen2Config.from_pretrained_dir(tmp_path / "out") == config
  np.testing.assert_allclose(torch_logits(reloaded, ids, mask)[real], ref[real], atol=1e-5, rtol=0)


def test_qwen2_config_still_exports_as_qwen2():
  config = Qwen2Config.tiny()
  cfg = config.to_hf_dict()
  assert config.attention_bias and cfg["model_type"] == "qwen2"
  assert cfg["architectures"] == ["Qwen2ForCausalLM"] and "attention_bias" not in cfg
  assert Qwen2Config.from_hf_dict(cfg) == config
  llama = Qwen2Config.tiny(attention_bias=False)
  assert Qwen2Config.from_hf_dict(llama.to_hf_dict()) == llama
  q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
  assert config.num_params() - llama.num_params() == config.num_hidden_layers * (q + 2 * kv)


@pytest.mark.parametrize("field,value,match", [
    ("mlp_bias", True, "mlp_bias=true is not supported for model_type 'llama'"),
    ("attention_bias", True, "attention_bias=true is not supported for model_type 'llama'"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "RoPE scaling 'llama3' is not supported"),
    ("hidden_act", "gelu", "hidden_act='gelu' is not supported"),
])
def test_unsupported_llama_configs_are_refused(field, value, match):
  cfg = Qwen2Config.tiny(attention_bias=False).to_hf_dict()
  cfg.pop("rope_parameters")
  cfg[field] = value
  with pytest.raises(ConfigError, match=match):
    Qwen2Config.from_hf_dict(cfg)
  cfg = dict(cfg, architectures=["Qwen2ForCausalLM"])
  cfg.pop(field)
  with pytest.raises(ConfigError, match="unsupported architecture"):  # model_type and class disagree
    Qwen2Config.from_hf_dict(cfg)
