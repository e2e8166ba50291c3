"""A BERT encoder (E5, BGE) in JAX, so a TPU slice can embed its corpus on its own chips.

The forward pass of Hugging Face's `BertModel` (post-LayerNorm, exact GELU, absolute positions, token
type 0): for token ids x [B, T] and mask m [B, T],

  h_0 = LN(E_word[x] + E_pos[0..T-1] + E_type[0])
  a   = softmax(Q K^T / sqrt(d_head) + (1 - m) * min_float) V      per head, Q, K, V = h W_{q,k,v}^T + b
  h'  = LN(h + a W_o^T + b_o);   h_{l+1} = LN(h' + GELU(h' W_i^T + b_i) W_2^T + b_2)

then the pooling and L2 normalisation of `encoders.ENCODER_SPECS` (CLS for BGE, masked mean for E5).
Weights come from the model directory's `model.safetensors` (or `pytorch_model.bin` through torch).
Batches are padded to `batch_size` rows and to a length bucket (a multiple of 64 up to `max_length`),
so one program per bucket is compiled, and split over the local devices along the batch axis (each host
of a slice encodes its own shards on its own chips). Matmuls run in `compute_dtype` (bfloat16 on TPUs),
LayerNorm, softmax and pooling in float32.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Sequence

import numpy as np

from agent_r1_jax.retrieval.encoders import ENCODER_SPECS, EncoderSpec

_BUCKET = 64


def _load_state(path: pathlib.Path) -> dict[str, np.ndarray]:
  if (path / "model.safetensors").is_file():
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    state = load_file(str(path / "model.safetensors"))
  elif (path / "pytorch_model.bin").is_file():
    import torch  # pylint: disable=import-outside-toplevel
    state = {k: v.float().numpy() for k, v in torch.load(path / "pytorch_model.bin", map_location="cpu").items()}
  else:
    raise FileNotFoundError(f"{path} holds neither model.safetensors nor pytorch_model.bin")
  out = {}
  for name, value in state.items():
    name = name.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                                               "LayerNorm.bias")
    out[name] = np.asarray(value, np.float32)
  return out


def _params(state: dict[str, np.ndarray], num_layers: int) -> dict:
  def dense(prefix):
    return {"w": state[f"{prefix}.weight"].T, "b": state[f"{prefix}.bias"]}

  def norm(prefix):
    return {"scale": state[f"{prefix}.weight"], "bias": state[f"{prefix}.bias"]}

  layers = []
  for i in range(num_layers):
    p = f"encoder.layer.{i}"
    layers.append({"q": dense(f"{p}.attention.self.query"), "k": dense(f"{p}.attention.self.key"),
                   "v": dense(f"{p}.attention.self.value"), "o": dense(f"{p}.attention.output.dense"),
                   "ln1": norm(f"{p}.attention.output.LayerNorm"), "i": dense(f"{p}.intermediate.dense"),
                   "out": dense(f"{p}.output.dense"), "ln2": norm(f"{p}.output.LayerNorm")})
  return {"word": state["embeddings.word_embeddings.weight"], "pos": state["embeddings.position_embeddings.weight"],
          "type": state["embeddings.token_type_embeddings.weight"][0], "ln": norm("embeddings.LayerNorm"),
          "layers": layers}


def bert_embed(params, ids, mask, *, num_heads: int, eps: float, pooling: str, normalize: bool, compute_dtype):
  """Pooled (and normalised) embeddings float32 [B, D] of ids/mask [B, T] (see the module docstring)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  def ln(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * p["scale"] + p["bias"]

  def dense(x, p):
    return jnp.dot(x.astype(compute_dtype), p["w"].astype(compute_dtype),
                   preferred_element_type=jnp.float32) + p["b"]

  b, t = ids.shape
  h = ln(params["word"][ids] + params["pos"][:t] + params["type"], params["ln"])
  d = h.shape[-1]
  dh = d // num_heads
  bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
  for layer in params["layers"]:
    q, k, v = (dense(h, layer[n]).reshape(b, t, num_heads, dh) for n in ("q", "k", "v"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q.astype(compute_dtype), k.astype(compute_dtype),
                        preferred_element_type=jnp.float32) / math.sqrt(dh)
    probs = jax.nn.softmax(scores + bias, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(compute_dtype), v.astype(compute_dtype),
                     preferred_element_type=jnp.float32).reshape(b, t, d)
    h = ln(h + dense(ctx, layer["o"]), layer["ln1"])
    h = ln(h + dense(jax.nn.gelu(dense(h, layer["i"]), approximate=False), layer["out"]), layer["ln2"])
  if pooling == "cls":
    e = h[:, 0]
  else:
    m = mask[:, :, None].astype(jnp.float32)
    e = (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
  if normalize:
    e = e / jnp.maximum(jnp.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
  return e


class JaxBertEncoder:
  """Same interface and outputs as `encoders.HFEncoder` (`dim`, `encode_queries`, `encode_passages`), in JAX.

  Args:
    path: local model directory (config.json, tokenizer files, weights).
    kind: "bge" or "e5" (or `spec`).
    max_length: token limit per text.
    batch_size: rows per compiled call (rounded up to a multiple of the local device count).
    compute_dtype: "float32" or "bfloat16" for the matmuls.
  """

  def __init__(self, path: str | os.PathLike[str], kind: str = "e5", *, spec: EncoderSpec | None = None,
               max_length: int = 256, batch_size: int = 256, compute_dtype: str = "float32"):
    import jax  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
    path = pathlib.Path(path)
    if not path.is_dir():
      raise FileNotFoundError(f"encoder directory not found: {path} (download the model there first)")
    if spec is None and kind not in ENCODER_SPECS:
      raise ValueError(f"encoder kind must be one of {sorted(ENCODER_SPECS)}, got {kind!r}")
    self.spec, self.kind = spec or ENCODER_SPECS[kind], kind
    config = json.loads((path / "config.json").read_text())
    if config.get("position_embedding_type", "absolute") != "absolute" or config.get("hidden_act", "gelu") != "gelu":
      raise ValueError(f"{path}: only BERT with absolute positions and exact GELU is supported")
    self.dim = int(config["hidden_size"])
    self.max_length = min(int(max_length), int(config["max_position_embeddings"]))
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    devices = jax.local_devices()
    self.batch_size = -(-int(batch_size) // len(devices)) * len(devices)
    self._rows = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    replicated = NamedSharding(self._rows.mesh, PartitionSpec())
    self._params = jax.device_put(_params(_load_state(path), int(config["num_hidden_layers"])), replicated)
    embed = lambda p, ids, mask: bert_embed(  # noqa: E731
        p, ids, mask, num_heads=int(config["num_attention_heads"]), eps=float(config.get("layer_norm_eps", 1e-12)),
        pooling=self.spec.pooling, normalize=self.spec.normalize, compute_dtype=jax.numpy.dtype(compute_dtype))
    self._embed = jax.jit(embed, out_shardings=replicated)

  def encode(self, texts: Sequence[str], prefix: str = "") -> np.ndarray:
    """Embeds `prefix + text` for each text: float32 [N, dim]."""
    import jax  # pylint: disable=import-outside-toplevel
    texts = [prefix + str(t) for t in texts]
    out = np.zeros((len(texts), self.dim), np.float32)
    for start in range(0, len(texts), self.batch_size):
      chunk = texts[start:start + self.batch_size]
      enc = self.tokenizer(chunk, truncation=True, max_length=self.max_length)
      longest = max(len(ids) for ids in enc["input_ids"])
      t = min(-(-longest // _BUCKET) * _BUCKET, self.max_length)
      ids = np.full((self.batch_size, t), self.tokenizer.pad_token_id, np.int32)
      mask = np.zeros((self.batch_size, t), np.int32)
      for i, row in enumerate(enc["input_ids"]):
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
      emb = self._embed(self._params, jax.device_put(ids, self._rows), jax.device_put(mask, self._rows))
      out[start:start + len(chunk)] = np.asarray(emb)[:len(chunk)]
    return out

  def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
    return self.encode(texts, self.spec.query_prefix)

  def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
    return self.encode(texts, self.spec.passage_prefix)
