"""Hugging Face checkpoint import/export for the NNX Qwen2 models (Qwen2/2.5 and the Llama family).

A Llama checkpoint (`model_type: "llama"`) has the same tensors as a Qwen2 one minus the q/k/v biases; the
model built from its config has no bias parameters, so the same name table serves both.

Import builds the model abstractly (`nnx.eval_shape`, no memory), then creates every parameter with
`jax.make_array_from_callback` on its rule-derived sharding: each device's shard is read from the
memory-mapped safetensors file as a slice, so a mesh-placed model is never materialised on one device.
Layouts differ from PyTorch's `nn.Linear` (`[out, in]`): q/k/v become `[D, heads, hd]`, o becomes
`[H, hd, D]`, MLP and LM head are transposed; the conversion is done per slice.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from agent_r1_jax.models.config import ConfigError, Qwen2Config
from agent_r1_jax.models.qwen2 import (Qwen2ForCausalLM, abstract_model, value_head_bias,
                                       value_head_kernel)
from agent_r1_jax.models.safetensors_io import SafetensorsFile, SafetensorsFormatError, write_safetensors
from agent_r1_jax.models.sharding import LOGICAL_RULES, LogicalRules, logical_to_spec, variable_names

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class CheckpointError(ValueError):
  """A checkpoint directory/file/tensor that cannot be loaded; the message names what and why."""


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How an NNX parameter relates to its HF tensor W: param = reshape(W^T if transpose else W)."""

  hf_name: str
  transpose: bool


def _layout(path: tuple) -> _Layout | None:
  """HF tensor for an NNX state path; None for parameters that HF checkpoints do not hold."""
  keys = tuple(str(p) for p in path)
  if keys == ("model", "embed"):
    return _Layout("model.embed_tokens.weight", False)
  if keys == ("model", "norm", "weight"):
    return _Layout("model.norm.weight", False)
  if keys == ("lm_head",):
    return _Layout("lm_head.weight", True)
  if keys[:2] == ("model", "layers"):
    prefix = f"model.layers.{keys[2]}."
    rest = keys[3:]
    table = {
        ("input_norm", "weight"): ("input_layernorm.weight", False),
        ("post_attn_norm", "weight"): ("post_attention_layernorm.weight", False),
        ("attn", "q_kernel"): ("self_attn.q_proj.weight", True),
        ("attn", "k_kernel"): ("self_attn.k_proj.weight", True),
        ("attn", "v_kernel"): ("self_attn.v_proj.weight", True),
        ("attn", "q_bias"): ("self_attn.q_proj.bias", False),
        ("attn", "k_bias"): ("self_attn.k_proj.bias", False),
        ("attn", "v_bias"): ("self_attn.v_proj.bias", False),
        ("attn", "o_kernel"): ("self_attn.o_proj.weight", True),
        ("mlp", "gate_kernel"): ("mlp.gate_proj.weight", True),
        ("mlp", "up_kernel"): ("mlp.up_proj.weight", True),
        ("mlp", "down_kernel"): ("mlp.down_proj.weight", True),
    }
    if rest in table:
      name, transpose = table[rest]
      return _Layout(prefix + name, transpose)
  if keys in (("value_kernel",), ("value_bias",)):
    return None
  raise KeyError(f"no Hugging Face name for parameter {'/'.join(keys)}")


def _param_groups(shape: tuple[int, ...], layout: _Layout) -> list[list[int]]:
  """Param dims grouped by the (transposed) HF dim they are a reshape of."""
  n = len(shape)
  if layout.hf_name.endswith(".bias"):  # [N, hd] <- [N * hd]
    return [list(range(n))]
  if layout.hf_name.endswith("o_proj.weight"):  # [H, hd, D] <- ([D, H * hd])^T
    return [[0, 1], [2]]
  if layout.transpose:  # [D, N, hd] <- ([N * hd, D])^T, [in, out] <- ([out, in])^T
    return [[0], list(range(1, n))]
  return [[i] for i in range(n)]


def _hf_shape(shape: tuple[int, ...], layout: _Layout) -> tuple[int, ...]:
  """Shape of the HF tensor W for a parameter of `shape`."""
  merged = tuple(math.prod(shape[d] for d in dims) for dims in _param_groups(shape, layout))
  return merged[::-1] if layout.transpose else merged


def _read_slice(src: np.ndarray, shape: tuple[int, ...], layout: _Layout,
                index: tuple[slice, ...], dtype) -> np.ndarray:
  """Param[index] computed from the memory-mapped HF tensor, reading only the rows/cols needed."""
  index = tuple(slice(*s.indices(n)) for s, n in zip(index, shape))
  groups = _param_groups(shape, layout)
  src_slices, local = [], []
  for dims in groups:
    lead = index[dims[0]]
    inner = math.prod(shape[d] for d in dims[1:])
    src_slices.append(slice(lead.start * inner, lead.stop * inner))
    local.append(slice(None))
    local.extend(index[d] for d in dims[1:])
  if layout.transpose:
    part = np.asarray(src[tuple(reversed(src_slices))]).T
  else:
    part = np.asarray(src[tuple(src_slices)])
  sizes = []
  for dims in groups:
    lead = index[dims[0]]
    sizes.append(lead.stop - lead.start)
    sizes.extend(shape[d] for d in dims[1:])
  return part.reshape(sizes)[tuple(local)].astype(dtype)


def _open_checkpoint(path: pathlib.Path) -> Callable[[str], tuple[SafetensorsFile, str] | None]:
  """Returns lookup(name) -> (file, name) over model.safetensors or a sharded index."""
  single = path / "model.safetensors"
  index = path / "model.safetensors.index.json"
  files: dict[str, SafetensorsFile] = {}

  def open_file(fname: str) -> SafetensorsFile:
    if fname not in files:
      fpath = path / fname
      if not fpath.is_file():
        raise CheckpointError(f"{fpath}: listed in {index.name} but not found")
      try:
        files[fname] = SafetensorsFile(fpath)
      except SafetensorsFormatError as e:
        raise CheckpointError(str(e)) from None
    return files[fname]

  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise CheckpointError(f"{index}: malformed index, expected a JSON object with 'weight_map' "
                            f"({e!r})") from None
    names = dict(weight_map)
  elif single.is_file():
    names = {n: single.name for n in open_file(single.name).names()}
  else:
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json found; "
                          "expected a Hugging Face checkpoint directory (save_pretrained output)")

  def lookup(name: str):
    if name not in names:
      return None
    f = open_file(names[name])
    if name not in f.names():
      raise CheckpointError(f"{f.path}: tensor {name!r} is listed in the index but missing from "
                            "the file")
    return f, name

  lookup.names = names  # type: ignore[attr-defined]
  return lookup


def load_hf_checkpoint(path: str | pathlib.Path, *, dtype: str | jnp.dtype = "float32",
                       compute_dtype: str | jnp.dtype | None = None, mesh: Mesh | None = None,
                       head: str = "lm", remat: bool = False, scan_layers: bool = False,
                       attention_chunk_size: int = 0, seed: int = 0,
                       rules: LogicalRules = LOGICAL_RULES):
  """Loads an HF Qwen2 or Llama checkpoint directory into a `Qwen2ForCausalLM` (or `Qwen2ValueModel`).

  Args:
    path: directory with `config.json` and `model.safetensors` or `model.safetensors.index.json`.
    dtype: parameter dtype ("float32" / "bfloat16" / a jnp dtype).
    compute_dtype: activation dtype (default: `dtype`).
    mesh: place every parameter on its rule-derived `NamedSharding` over this mesh, shard by shard.
    head: "lm" for the policy, "value" for the critic (backbone loaded, head from `seed`).
    remat: rematerialise each decoder block in the backward pass.
    scan_layers: run the blocks of a call without a cache as one `lax.scan` (see `models.qwen2`).
    attention_chunk_size: attention of longer calls in blocks of this many queries and keys (0: dense).
    seed: PRNG seed of parameters the checkpoint does not hold (the value head).
    rules: logical-axis rules used with `mesh`.

  Raises:
    CheckpointError / ConfigError (both ValueError): missing or malformed files, an unsupported
      architecture, a missing, unexpected or wrong-shaped tensor; the message names the file/tensor.
  """
  path = pathlib.Path(path)
  if not path.is_dir():
    raise CheckpointError(f"{path}: checkpoint directory not found")
  config = Qwen2Config.from_pretrained_dir(path)
  param_dtype = _dtype(dtype)
  compute_dtype = param_dtype if compute_dtype is None else _dtype(compute_dtype)
  lookup = _open_checkpoint(path)
  abstract = abstract_model(config, head=head, param_dtype=param_dtype,
                            compute_dtype=compute_dtype, remat=remat, scan_layers=scan_layers,
                            attention_chunk_size=attention_chunk_size)
  graphdef, abs_state = nnx.split(abstract)
  fresh = None
  used: set[str] = set()
  values = {}
  for var_path, var in nnx.to_flat_state(abs_state):
    shape, target_dtype = tuple(var.shape), var.dtype
    sharding = (None if mesh is None else
                NamedSharding(mesh, logical_to_spec(shape, variable_names(var), mesh, rules)))
    layout = _layout(var_path)
    if layout is None:  # value head: not in HF checkpoints
      if fresh is None:
        fresh = nnx.state(_fresh_value_head(config, seed, param_dtype, compute_dtype))
      value = _flat(fresh)[var_path]
      values[var_path] = value if sharding is None else jax.device_put(value, sharding)
      continue
    found = lookup(layout.hf_name)
    if found is None:
      where = path / "model.safetensors"
      raise CheckpointError(f"{where}: tensor {layout.hf_name!r} is missing (expected shape "
                            f"{list(_hf_shape(shape, layout))} for {_describe(config)})")
    file, name = found
    used.add(name)
    expected = _hf_shape(shape, layout)
    if file.shape(name) != expected:
      raise CheckpointError(f"{file.path}: tensor {name!r} has shape {list(file.shape(name))}, "
                            f"expected {list(expected)} from config.json ({_describe(config)})")
    src = file.array(name)
    if sharding is None:
      full = tuple(slice(None) for _ in shape)
      values[var_path] = jnp.asarray(_read_slice(src, shape, layout, full, target_dtype))
    else:
      values[var_path] = jax.make_array_from_callback(
          shape, sharding,
          lambda idx, src=src, shape=shape, layout=layout, dt=target_dtype:
          _read_slice(src, shape, layout, idx, dt))
  ignorable = {"lm_head.weight"} if (config.tie_word_embeddings or head == "value") else set()
  extra = [n for n in lookup.names if n not in used and n not in ignorable  # type: ignore[attr-defined]
           and not n.endswith("rotary_emb.inv_freq")
           and not (head == "value" and n.startswith(("score.", "v_head.")))]
  if extra:
    raise CheckpointError(f"{path}: unexpected tensors {sorted(extra)[:5]} for a {config.model_type} "
                          f"model ({_describe(config)}); is config.json from the same model?")
  state = nnx.from_flat_state([(p, var.replace(values[p]))
                               for p, var in nnx.to_flat_state(abs_state)])
  return nnx.merge(graphdef, state)


def _flat(state: nnx.State) -> dict:
  return {p: v.get_value() for p, v in nnx.to_flat_state(state)}


def _fresh_value_head(config, seed, param_dtype, compute_dtype) -> nnx.Module:
  """The value head exactly as `Qwen2ValueModel(config, rngs=nnx.Rngs(seed))` initialises it."""
  del compute_dtype
  rngs = nnx.Rngs(seed)
  return nnx.Dict(value_kernel=value_head_kernel(rngs, config, param_dtype),
                  value_bias=value_head_bias(param_dtype))


def _describe(config: Qwen2Config) -> str:
  return (f"L={config.num_hidden_layers}, D={config.hidden_size}, H={config.num_attention_heads}, "
          f"K={config.num_key_value_heads}, F={config.intermediate_size}, V={config.vocab_size}")


def _dtype(name) -> jnp.dtype:
  if isinstance(name, str):
    if name not in _DTYPES:
      raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]
  return jnp.dtype(name).type


def save_hf_checkpoint(model: Qwen2ForCausalLM, path: str | pathlib.Path, *,
                       max_shard_bytes: int = 4 << 30) -> None:
  """Writes `config.json` + `model.safetensors` (or shards + index) that transformers loads, as
  `Qwen2ForCausalLM` when the model has q/k/v biases and as `LlamaForCausalLM` when it has none.

  Tensors keep the parameter dtype. Arrays are gathered to the host one at a time. Under multi-host JAX every
  process must call this (the gathers are collective); only process 0 writes files.
  """
  if not isinstance(model, Qwen2ForCausalLM):
    raise TypeError(f"save_hf_checkpoint exports a Qwen2ForCausalLM, got {type(model).__name__}")
  path = pathlib.Path(path)
  config = model.config
  tensors: dict[str, np.ndarray] = {}
  param_dtype = None
  for var_path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    layout = _layout(var_path)
    value = _to_host(var.get_value())
    param_dtype = value.dtype
    hf_shape = _hf_shape(value.shape, layout)
    hf = value.reshape(hf_shape[::-1] if layout.transpose else hf_shape)
    tensors[layout.hf_name] = np.ascontiguousarray(hf.T if layout.transpose else hf)
  if jax.process_index() != 0:
    return
  path.mkdir(parents=True, exist_ok=True)
  hf_config = config.to_hf_dict()
  hf_config["dtype"] = {np.dtype(jnp.bfloat16): "bfloat16",
                        np.dtype(np.float16): "float16"}.get(np.dtype(param_dtype), "float32")
  (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name in sorted(tensors):
    if shards[-1] and size + tensors[name].nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = tensors[name]
    size += tensors[name].nbytes
  meta = {"format": "pt"}
  if len(shards) == 1:
    write_safetensors(path / "model.safetensors", shards[0], meta)
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    write_safetensors(path / fname, shard, meta)
    weight_map.update({n: fname for n in shard})
  total = sum(t.nbytes for t in tensors.values())
  (path / "model.safetensors.index.json").write_text(json.dumps(
      {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")


def _to_host(x: jax.Array) -> np.ndarray:
  if jax.process_count() > 1 and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


__all__ = ["CheckpointError", "ConfigError", "load_hf_checkpoint", "save_hf_checkpoint"]
