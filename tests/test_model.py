"""Flax Qwen2 vs transformers' PyTorch Qwen2ForCausalLM on random tiny checkpoints (float32)."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import torch
import transformers
from flax import nnx

from agent_r1_jax.models import (CheckpointError, ConfigError, KVCache, Qwen2Config,
                                 Qwen2ForCausalLM, Qwen2ValueModel, abstract_model, count_params,
                                 load_hf_checkpoint, make_mesh, qwen2_5_0_5b, qwen2_5_1_5b,
                                 qwen2_5_3b, qwen2_5_7b, save_hf_checkpoint)
from reference_models import random_hf_checkpoint

VOCAB = 96


def make_hf_checkpoint(path: pathlib.Path, *, tie: bool, heads: int, kv_heads: int, hidden: int = 64,
                       layers: int = 2, seed: int = 0) -> transformers.Qwen2ForCausalLM:
  """A transformers Qwen2 with every weight (biases and norms too) random, saved to `path`."""
  return random_hf_checkpoint(path, vocab=VOCAB, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                              tie=tie, seed=seed)


def batch(seed: int = 0, b: int = 3, t: int = 9):
  """Rows: full, left-padded by 3, right-padded by 2."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(0, VOCAB, (b, t)).astype(np.int32)
  mask = np.ones((b, t), np.int32)
  if b > 1:
    mask[1, :3] = 0
  if b > 2:
    mask[2, t - 2:] = 0
  return ids, mask


def hf_logits(model, ids, mask) -> np.ndarray:
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.numpy()


@nnx.jit
def forward(model, ids, mask):
  return model(ids, mask)


@nnx.jit
def forward_cached(model, ids, mask, cache):
  return model(ids, mask, cache=cache)


def run(model, ids, mask) -> np.ndarray:
  return np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(mask)))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  """(path, hf_model) of an untied 4-head / 2-KV-head checkpoint shared by several tests."""
  path = tmp_path_factory.mktemp("qwen_untied")
  return path, make_hf_checkpoint(path, tie=False, heads=4, kv_heads=2)


@pytest.mark.parametrize("tie,heads,kv_heads,hidden", [
    (True, 4, 2, 64), (False, 4, 1, 64), (True, 4, 4, 64), (False, 6, 3, 48)])
def test_logits_match_transformers(tmp_path, tie, heads, kv_heads, hidden):
  hf = make_hf_checkpoint(tmp_path, tie=tie, heads=heads, kv_heads=kv_heads, hidden=hidden)
  ids, mask = batch()
  ours = run(load_hf_checkpoint(tmp_path), ids, mask)
  assert ours.dtype == np.float32 and ours.shape == (3, 9, VOCAB)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], hf_logits(hf, ids, mask)[real], atol=1e-4, rtol=0)


def test_padding_does_not_change_real_token_logits(ckpt):
  """A row's logits depend only on its real tokens, whatever padding surrounds them."""
  path, _ = ckpt
  model = load_hf_checkpoint(path)
  ids, _ = batch(t=6, b=1)
  alone = run(model, ids, np.ones_like(ids))[0]
  padded = np.concatenate([np.full((1, 3), 5, np.int32), ids, np.full((1, 2), 7, np.int32)], 1)
  mask = np.concatenate([np.zeros((1, 3)), np.ones((1, 6)), np.zeros((1, 2))], 1).astype(np.int32)
  out = run(model, padded, mask)[0, 3:9]
  np.testing.assert_allclose(out, alone, atol=1e-5)


def test_save_round_trip_loads_in_transformers(ckpt, tmp_path):
  path, hf = ckpt
  model = load_hf_checkpoint(path)
  save_hf_checkpoint(model, tmp_path / "out")
  reloaded = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "out").eval()
  ids, mask = batch(seed=1)
  real = mask.astype(bool)
  np.testing.assert_allclose(hf_logits(reloaded, ids, mask)[real], hf_logits(hf, ids, mask)[real],
                             atol=1e-4, rtol=0)
  ours = run(load_hf_checkpoint(tmp_path / "out"), ids, mask)
  np.testing.assert_allclose(ours[real], hf_logits(hf, ids, mask)[real], atol=1e-4, rtol=0)


def test_sharded_index_round_trip(ckpt, tmp_path):
  """Multi-file export (tiny shard limit) + index loads in transformers and here."""
  path, hf = ckpt
  save_hf_checkpoint(load_hf_checkpoint(path), tmp_path, max_shard_bytes=40_000)
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 1
  ids, mask = batch(seed=2)
  real = mask.astype(bool)
  reloaded = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path).eval()
  np.testing.assert_allclose(hf_logits(reloaded, ids, mask)[real], hf_logits(hf, ids, mask)[real],
                             atol=1e-4, rtol=0)
  ours = run(load_hf_checkpoint(tmp_path), ids, mask)
  np.testing.assert_allclose(ours[real], hf_logits(hf, ids, mask)[real], atol=1e-4, rtol=0)


def test_bfloat16_checkpoint_files(ckpt, tmp_path):
  """Real Qwen2.5 checkpoints are stored in bfloat16: read them, and write them back as bfloat16."""
  path, _ = ckpt
  transformers.Qwen2ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(
      tmp_path / "bf16")
  hf_bf16 = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
  # The same (bf16-representable) weights, computed in float32.
  hf_ref = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "bf16",
                                                         dtype=torch.float32).eval()
  ids, mask = batch(seed=8)
  real = mask.astype(bool)
  ours = run(load_hf_checkpoint(tmp_path / "bf16"), ids, mask)
  np.testing.assert_allclose(ours[real], hf_logits(hf_ref, ids, mask)[real], atol=1e-4, rtol=0)
  save_hf_checkpoint(load_hf_checkpoint(tmp_path / "bf16", dtype="bfloat16"), tmp_path / "out")
  cfg = json.loads((tmp_path / "out" / "config.json").read_text())
  assert cfg["dtype"] == "bfloat16"
  with safetensors.safe_open(tmp_path / "out" / "model.safetensors", "pt") as f:
    assert {f.get_slice(n).get_dtype() for n in f.keys()} == {"BF16"}
  reloaded = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.bfloat16)
  expected = hf_bf16.state_dict()
  for name, tensor in reloaded.state_dict().items():
    assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, expected[name]), name


@pytest.mark.parametrize("shape,scan_layers", [(dict(data=2, fsdp=2, tensor=2), False),
                                               (dict(data=1, fsdp=8, tensor=1), False),
                                               (dict(data=2, fsdp=2, tensor=2), True)])
def test_mesh_sharded_logits_equal_single_device(ckpt, shape, scan_layers):
  path, _ = ckpt
  ids, mask = batch(seed=3, b=4)
  single = run(load_hf_checkpoint(path), ids, mask)
  mesh = make_mesh(**shape)
  model = load_hf_checkpoint(path, mesh=mesh, scan_layers=scan_layers)
  q = model.model.layers[0].attn.q_kernel[...]
  gate = model.model.layers[1].mlp.gate_kernel[...]
  embed = model.model.embed[...]
  if shape["tensor"] == 2:
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    assert gate.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert embed.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  else:
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", None, None)
    assert embed.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
  # Each device really holds a fraction of the weight, not a replica.
  n_shards = 4 if shape["tensor"] == 2 else 8
  assert q.addressable_shards[0].data.size * n_shards == q.size
  assert len({s.device for s in q.addressable_shards}) == 8

  @jax.jit
  def forward(graphdef, state, ids, mask):
    return nnx.merge(graphdef, state)(ids, mask)

  graphdef, state = nnx.split(model)
  with jax.set_mesh(mesh):
    out = np.asarray(forward(graphdef, state, jnp.asarray(ids), jnp.asarray(mask)))
  np.testing.assert_allclose(out, single, atol=1e-5, rtol=0)


def test_bfloat16_compute_close_to_float32(ckpt):
  """bf16 activations (float32 params, float32 logits): mean KL(p32 || p16) < 1e-3 per token."""
  path, _ = ckpt
  ids, mask = batch(seed=4)
  logits32 = run(load_hf_checkpoint(path), ids, mask)
  model16 = load_hf_checkpoint(path, compute_dtype="bfloat16")
  logits16 = run(model16, ids, mask)
  assert logits16.dtype == np.float32
  lp32 = jax.nn.log_softmax(logits32)
  lp16 = jax.nn.log_softmax(logits16)
  kl = np.asarray(jnp.sum(jnp.exp(lp32) * (lp32 - lp16), -1))[mask.astype(bool)]
  assert kl.mean() < 1e-3, kl.mean()
  # bfloat16 parameters too (half the memory) stay within the same bound on this model.
  logits_bf = run(load_hf_checkpoint(path, dtype="bfloat16"), ids, mask)
  lpb = jax.nn.log_softmax(logits_bf)
  klb = np.asarray(jnp.sum(jnp.exp(lp32) * (lp32 - lpb), -1))[mask.astype(bool)]
  assert klb.mean() < 1e-3, klb.mean()


def test_kv_cache_prefill_then_decode_equals_full_forward(ckpt):
  """Prefill a left-padded prompt, append ragged tokens, decode one: logits == one full forward."""
  path, hf = ckpt
  model = load_hf_checkpoint(path)
  ids, _ = batch(seed=5, b=2, t=10)
  prompt_mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], np.int32)
  cache = KVCache.init(model.config, batch=2, max_length=16)
  logits_p, cache = forward_cached(model, jnp.asarray(ids[:, :6]), jnp.asarray(prompt_mask), cache)
  # Ragged continuation: row 0 appends 3 tokens, row 1 appends 1 (right-padded chunk).
  ext = ids[:, 6:9]
  ext_mask = np.array([[1, 1, 1], [1, 0, 0]], np.int32)
  logits_e, cache = forward_cached(model, jnp.asarray(ext), jnp.asarray(ext_mask), cache)
  np.testing.assert_array_equal(np.asarray(cache.lengths), [7, 7])
  np.testing.assert_array_equal(np.asarray(cache.cursor), [9, 7])
  step = np.array([[ids[0, 9]], [ids[1, 9]]], np.int32)
  logits_d, cache = forward_cached(model, jnp.asarray(step), jnp.ones((2, 1), jnp.int32), cache)
  # Reference: each row's real tokens as one unpadded sequence through transformers.
  for row, seq in enumerate([np.r_[ids[0, 2:6], ids[0, 6:9], ids[0, 9]],
                             np.r_[ids[1, :6], ids[1, 6], ids[1, 9]]]):
    ref = hf_logits(hf, seq[None].astype(np.int32), np.ones((1, len(seq)), np.int32))[0]
    n_prompt = int(prompt_mask[row].sum())
    np.testing.assert_allclose(np.asarray(logits_p)[row, -1], ref[n_prompt - 1], atol=1e-4)
    n_ext = int(ext_mask[row].sum())
    np.testing.assert_allclose(np.asarray(logits_e)[row, :n_ext], ref[n_prompt:n_prompt + n_ext],
                               atol=1e-4)
    np.testing.assert_allclose(np.asarray(logits_d)[row, 0], ref[-1], atol=1e-4)


def test_value_model_loads_backbone_from_policy_checkpoint(ckpt):
  path, hf = ckpt
  critic = load_hf_checkpoint(path, head="value", seed=3)
  assert isinstance(critic, Qwen2ValueModel)
  fresh = Qwen2ValueModel(critic.config, rngs=nnx.Rngs(3))
  np.testing.assert_array_equal(np.asarray(critic.value_kernel[...]),
                                np.asarray(fresh.value_kernel[...]))
  ids, mask = batch(seed=6)
  values = run(critic, ids, mask)
  assert values.shape == (3, 9) and values.dtype == np.float32
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    hidden = hf.model(input_ids=torch.tensor(ids, dtype=torch.long),
                      attention_mask=torch.tensor(mask),
                      position_ids=torch.tensor(positions)).last_hidden_state.numpy()
  expected = hidden @ np.asarray(critic.value_kernel[...]) + float(critic.value_bias[...])
  real = mask.astype(bool)
  np.testing.assert_allclose(values[real], expected[real], atol=1e-4)


@pytest.mark.parametrize("remat,scan_layers", [(True, False), (False, True), (True, True)])
def test_remat_and_scanned_layers_give_identical_gradients(remat, scan_layers):
  """Against the plain unrolled forward: every parameter's gradient, the per-layer ones included (a scan
  that mixed up the layers' stacked weights or their gradients' order would break this)."""
  config = Qwen2Config.tiny(vocab_size=VOCAB)
  ids, mask = batch(seed=7)

  def grads(remat, scan_layers):
    model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0), remat=remat, scan_layers=scan_layers)

    def loss(m):
      return jnp.mean(jax.nn.log_softmax(m(jnp.asarray(ids), jnp.asarray(mask)))[..., 0])

    return nnx.jit(nnx.grad(loss))(model)

  a, b = grads(False, False), grads(remat, scan_layers)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_scanned_layers_match_transformers(ckpt):
  path, hf = ckpt
  ids, mask = batch(seed=8)
  ours = run(load_hf_checkpoint(path, scan_layers=True), ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], hf_logits(hf, ids, mask)[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("preset,published", [
    (qwen2_5_0_5b, 494_032_768), (qwen2_5_1_5b, 1_543_714_304), (qwen2_5_3b, 3_085_938_688),
    (qwen2_5_7b, 7_615_616_512)])
def test_presets_match_published_parameter_counts(preset, published):
  """Counts from the Qwen2.5 model cards / safetensors index sizes."""
  config = preset()
  assert config.num_params() == published
  if published < 2e9:  # abstract build is shape-only, but keep the test fast
    assert count_params(abstract_model(config)) == published


def test_abstract_model_allocates_nothing_and_has_sharding_names():
  mesh = make_mesh(data=1, fsdp=4, tensor=2)
  abstract = abstract_model(qwen2_5_3b())
  from agent_r1_jax.models import state_shardings
  shardings = state_shardings(nnx.state(abstract), mesh)
  q = shardings["model"]["layers"][0]["attn"]["q_kernel"].get_value()
  assert q.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  kv = shardings["model"]["layers"][0]["attn"]["k_kernel"].get_value()
  assert kv.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)  # 2 KV heads / tensor=2
  assert isinstance(abstract.model.embed.get_value(), jax.ShapeDtypeStruct)


# -- bad input -------------------------------------------------------------------------------------


def test_missing_directory(tmp_path):
  with pytest.raises(CheckpointError, match="checkpoint directory not found"):
    load_hf_checkpoint(tmp_path / "nope")


def test_missing_config(tmp_path):
  with pytest.raises(ConfigError, match="config.json: not found"):
    load_hf_checkpoint(tmp_path)


def test_malformed_config(tmp_path):
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ConfigError, match="malformed JSON"):
    load_hf_checkpoint(tmp_path)


def test_unsupported_architecture(ckpt, tmp_path):
  path, _ = ckpt
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(model_type="mistral", architectures=["MistralForCausalLM"])
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ConfigError, match="unsupported architecture.*mistral"):
    load_hf_checkpoint(tmp_path)


def test_missing_weights_file(ckpt, tmp_path):
  path, _ = ckpt
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  with pytest.raises(CheckpointError, match="no model.safetensors"):
    load_hf_checkpoint(tmp_path)


def test_wrong_shaped_tensor(ckpt, tmp_path):
  path, _ = ckpt
  cfg = json.loads((path / "config.json").read_text())
  cfg["intermediate_size"] = 128  # the file holds 96-wide MLP weights
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
  with pytest.raises(CheckpointError,
                     match=r"model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' has "
                           r"shape \[64, 96\], expected \[64, 128\]"):
    load_hf_checkpoint(tmp_path)


def test_missing_tensor(ckpt, tmp_path):
  path, _ = ckpt
  cfg = json.loads((path / "config.json").read_text())
  cfg["num_hidden_layers"] = 3
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
  with pytest.raises(CheckpointError, match="'model.layers.2.*' is missing"):
    load_hf_checkpoint(tmp_path)


def test_truncated_safetensors(ckpt, tmp_path):
  path, _ = ckpt
  (tmp_path / "config.json").write_text((path / "config.json").read_text())
  data = (path / "model.safetensors").read_bytes()
  (tmp_path / "model.safetensors").write_bytes(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match="model.safetensors.*truncated"):
    load_hf_checkpoint(tmp_path)
