"""Random tiny `transformers` checkpoints: the independent PyTorch reference the model, sampler and checkpoint
tests compare our Flax models against."""

from __future__ import annotations

import pathlib

import torch
import transformers


def random_hf_checkpoint(path: pathlib.Path, *, architecture: str = "qwen2", vocab: int = 96, hidden: int = 64,
                         intermediate: int = 96, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                         tie: bool = False, rms_norm_eps: float = 1e-5, max_positions: int = 256,
                         norm_spread: float = 0.2, std: float = 0.08, seed: int = 0):
  """A `transformers` Qwen2 (q/k/v biases) or Llama (no biases) whose every weight is random, saved to `path`.

  Norm scales are `1 + norm_spread * N(0, 1)` and every other weight, biases included, `std * N(0, 1)`, so no
  term of the forward pass is an identity a bug could hide behind. Returns the model in eval mode.
  """
  torch.manual_seed(seed)
  shape = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tie,
               rope_theta=10000.0, rms_norm_eps=rms_norm_eps, max_position_embeddings=max_positions)
  if architecture == "qwen2":
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape)).eval()
  elif architecture == "llama":
    config = transformers.LlamaConfig(**shape, attention_bias=False, mlp_bias=False)
    model = transformers.LlamaForCausalLM(config).eval()
  else:
    raise ValueError(f"architecture must be 'qwen2' or 'llama', got {architecture!r}")
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + norm_spread * torch.randn_like(p))
      else:
        p.normal_(0.0, std)
  model.save_pretrained(path)
  return model
