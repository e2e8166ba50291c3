"""Qwen2 / Qwen2.5 and Llama-family architecture hyper-parameters, read from a Hugging Face `config.json`.

The two families differ, for what this implementation computes, only in the q/k/v projection biases:
Qwen2 has them (`attention_bias=True`), Llama has none (`attention_bias=False`, e.g. SmolLM2). Both are
described by `Qwen2Config` (the public name is kept); `model_type` "qwen2" and "llama" are read, and export
writes "qwen2" / `Qwen2ForCausalLM` with biases, "llama" / `LlamaForCausalLM` without.

Only what changes the computation is kept. Reading is strict: an architecture this implementation does
not compute exactly (another model type, RoPE scaling, sliding-window attention, a non-SiLU MLP, Llama's
MLP or output-projection biases) raises `ConfigError` naming the field, instead of silently producing
different logits.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any


class ConfigError(ValueError):
  """A config.json that does not describe a Qwen2- or Llama-family model this code computes exactly."""


_QWEN2_ARCHS = {"Qwen2ForCausalLM", "Qwen2Model", "Qwen2ForTokenClassification",
                "Qwen2ForSequenceClassification"}
_LLAMA_ARCHS = {"LlamaForCausalLM", "LlamaModel", "LlamaForTokenClassification",
                "LlamaForSequenceClassification"}


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
  """Shapes and constants of a Qwen2 decoder, or of a Llama decoder (the same without q/k/v biases).

  Attributes:
    vocab_size: V, rows of the token embedding (and columns of the LM head).
    hidden_size: D, the residual stream width.
    intermediate_size: F, the SwiGLU hidden width.
    num_hidden_layers: L, decoder blocks.
    num_attention_heads: H, query heads.
    num_key_value_heads: K, key/value heads (H % K == 0; each K-head serves H/K query heads).
    head_dim: per-head width (D / H for every released Qwen2/2.5 model).
    rms_norm_eps: epsilon inside RMSNorm, x * rsqrt(mean(x^2) + eps).
    rope_theta: RoPE base; inverse frequencies theta^(-2i/head_dim).
    max_position_embeddings: longest context the checkpoint was trained for (informational).
    tie_word_embeddings: LM head reuses the embedding matrix (logits = h @ E^T).
    bos_token_id / eos_token_id: copied through to the exported config.
    attention_bias: q/k/v projections add a bias (q = x W_q + b_q, ...): True for Qwen2/2.5; False for
      the Llama family, whose model then holds no bias parameters at all. Also decides the exported
      `model_type` ("qwen2" / "llama").
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1_000_000.0
  max_position_embeddings: int = 32768
  tie_word_embeddings: bool = False
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  attention_bias: bool = True

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"Qwen2Config.{name} must be a positive integer, got {value!r}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ConfigError(
          f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
          f"num_key_value_heads ({self.num_key_value_heads})")
    if self.head_dim % 2:
      raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")

  @property
  def num_query_groups(self) -> int:
    """Query heads per key/value head (H / K)."""
    return self.num_attention_heads // self.num_key_value_heads

  @property
  def model_type(self) -> str:
    """The HF `model_type` this config exports as: "qwen2" with q/k/v biases, "llama" without."""
    return "qwen2" if self.attention_bias else "llama"

  def num_params(self) -> int:
    """Exact parameter count (embedding counted once when tied; q/k/v biases only when present)."""
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q = self.num_attention_heads * self.head_dim
    kv = self.num_key_value_heads * self.head_dim
    bias = (q + 2 * kv) if self.attention_bias else 0
    attn = d * q + 2 * d * kv + q * d + bias
    block = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_word_embeddings else d * v
    return v * d + self.num_hidden_layers * block + d + head

  # -- Hugging Face config.json ----------------------------------------------------------------

  @classmethod
  def from_hf_dict(cls, cfg: dict[str, Any], *, source: str = "config.json") -> Qwen2Config:
    """Builds a config from a parsed HF `config.json` (transformers 4.x or 5.x layout).

    `model_type` "qwen2" (q/k/v biases, always) or "llama" (`attention_bias` and `mlp_bias` must be false:
    Llama's attention bias also adds an output-projection bias, which this model does not have).
    """
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    supported = {"qwen2": _QWEN2_ARCHS, "llama": _LLAMA_ARCHS}.get(model_type)
    if supported is None or (archs and not set(archs) & supported):
      raise ConfigError(
          f"{source}: unsupported architecture (model_type={model_type!r}, architectures={archs}); "
          "expected model_type 'qwen2' with architectures ['Qwen2ForCausalLM'] (Qwen2 / Qwen2.5) or "
          "'llama' with ['LlamaForCausalLM'] (Llama family without biases, e.g. SmolLM2)")
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in cfg]
    if missing:
      raise ConfigError(f"{source}: missing required field(s) {missing}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
      raise ConfigError(f"{source}: hidden_act={act!r} is not supported; expected 'silu'")
    if cfg.get("use_sliding_window", False):
      raise ConfigError(f"{source}: use_sliding_window=true is not supported; expected false")
    if model_type == "llama":
      for name in ("attention_bias", "mlp_bias"):
        if cfg.get(name, False):
          raise ConfigError(f"{source}: {name}=true is not supported for model_type 'llama'; expected "
                            "false (only Qwen2's q/k/v biases are implemented)")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
      raise ConfigError(f"{source}: RoPE scaling {rope_type!r} is not supported; expected 'default'")
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    heads = int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or int(cfg["hidden_size"]) // heads
    eos = cfg.get("eos_token_id")
    return cls(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        attention_bias=model_type == "qwen2",
    )

  @classmethod
  def from_pretrained_dir(cls, path: str | pathlib.Path) -> Qwen2Config:
    """Reads `<path>/config.json`."""
    file = pathlib.Path(path) / "config.json"
    if not file.is_file():
      raise ConfigError(f"{file}: not found; expected a Hugging Face model directory with config.json")
    try:
      cfg = json.loads(file.read_text())
    except json.JSONDecodeError as e:
      raise ConfigError(f"{file}: malformed JSON ({e})") from None
    if not isinstance(cfg, dict):
      raise ConfigError(f"{file}: expected a JSON object, got {type(cfg).__name__}")
    return cls.from_hf_dict(cfg, source=str(file))

  def to_hf_dict(self) -> dict[str, Any]:
    """The `config.json` content transformers reads back to the same model: `Qwen2ForCausalLM` with
    q/k/v biases, `LlamaForCausalLM` (attention_bias = mlp_bias = false) without."""
    eos = list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id
    out = {
        "architectures": ["Qwen2ForCausalLM" if self.attention_bias else "LlamaForCausalLM"],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_hidden_layers,
        "num_attention_heads": self.num_attention_heads,
        "num_key_value_heads": self.num_key_value_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
        "max_position_embeddings": self.max_position_embeddings,
        "tie_word_embeddings": self.tie_word_embeddings,
        "attention_dropout": 0.0,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": eos,
        "dtype": "float32",
    }
    if self.attention_bias:
      out["use_sliding_window"] = False
    else:
      out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    return out

  # -- presets ---------------------------------------------------------------------------------

  @classmethod
  def tiny(cls, *, vocab_size: int = 128, hidden_size: int = 64, intermediate_size: int = 96,
           num_hidden_layers: int = 2, num_attention_heads: int = 4, num_key_value_heads: int = 2,
           tie_word_embeddings: bool = True, rope_theta: float = 10000.0,
           attention_bias: bool = True) -> Qwen2Config:
    """A small random-init shape for tests and notebooks (Llama-style without biases when
    `attention_bias=False`)."""
    return cls(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
               num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
               num_key_value_heads=num_key_value_heads,
               head_dim=hidden_size // num_attention_heads, rope_theta=rope_theta,
               tie_word_embeddings=tie_word_embeddings, max_position_embeddings=4096,
               attention_bias=attention_bias)


def _qwen25(hidden, inter, layers, heads, kv, tie, vocab=151936, instruct=False) -> Qwen2Config:
  return Qwen2Config(
      vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
      num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads,
      rms_norm_eps=1e-6, rope_theta=1_000_000.0, max_position_embeddings=32768,
      tie_word_embeddings=tie, bos_token_id=151643, eos_token_id=151645 if instruct else 151643)


def qwen2_5_0_5b(instruct: bool = True) -> Qwen2Config:
  """Qwen2.5-0.5B(-Instruct): 24 x 896, 14 heads / 2 KV heads, tied embeddings (494M params)."""
  return _qwen25(896, 4864, 24, 14, 2, True, instruct=instruct)


def qwen2_5_1_5b(instruct: bool = True) -> Qwen2Config:
  """Qwen2.5-1.5B(-Instruct): 28 x 1536, 12 heads / 2 KV heads, tied embeddings (1.54B params)."""
  return _qwen25(1536, 8960, 28, 12, 2, True, instruct=instruct)


def qwen2_5_3b(instruct: bool = True) -> Qwen2Config:
  """Qwen2.5-3B(-Instruct): 36 x 2048, 16 heads / 2 KV heads, tied embeddings (3.09B params)."""
  return _qwen25(2048, 11008, 36, 16, 2, True, instruct=instruct)


def qwen2_5_7b(instruct: bool = True) -> Qwen2Config:
  """Qwen2.5-7B(-Instruct): 28 x 3584, 28 heads / 4 KV heads, untied, vocab 152064 (7.62B params)."""
  return _qwen25(3584, 18944, 28, 28, 4, False, vocab=152064, instruct=instruct)


PRESETS = {
    "qwen2.5-0.5b": qwen2_5_0_5b,
    "qwen2.5-1.5b": qwen2_5_1_5b,
    "qwen2.5-3b": qwen2_5_3b,
    "qwen2.5-7b": qwen2_5_7b,
}

# Presets are also reachable as `Qwen2Config.qwen2_5_0_5b()` etc.
Qwen2Config.qwen2_5_0_5b = staticmethod(qwen2_5_0_5b)
Qwen2Config.qwen2_5_1_5b = staticmethod(qwen2_5_1_5b)
Qwen2Config.qwen2_5_3b = staticmethod(qwen2_5_3b)
Qwen2Config.qwen2_5_7b = staticmethod(qwen2_5_7b)
