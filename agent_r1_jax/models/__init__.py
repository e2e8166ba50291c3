"""Qwen2 / Qwen2.5 and Llama-family (no biases, e.g. SmolLM2) decoders in Flax NNX, with Hugging Face
safetensors import/export, GGUF conversion (`models.convert_gguf`) and mesh sharding."""

from agent_r1_jax.models.config import (PRESETS, ConfigError, Qwen2Config, qwen2_5_0_5b,
                                        qwen2_5_1_5b, qwen2_5_3b, qwen2_5_7b)
from agent_r1_jax.models.hf_io import CheckpointError, load_hf_checkpoint, save_hf_checkpoint
from agent_r1_jax.models.kv_cache import KVCache
from agent_r1_jax.models.qwen2 import (Qwen2ForCausalLM, Qwen2Model, Qwen2ValueModel,
                                       abstract_model, count_params, merge_for_compute)
from agent_r1_jax.models.sharding import (LOGICAL_RULES, constrain, logical_to_spec, make_mesh,
                                          shard_model, state_shardings)

__all__ = [
    "PRESETS", "CheckpointError", "ConfigError", "KVCache", "LOGICAL_RULES", "Qwen2Config",
    "Qwen2ForCausalLM", "Qwen2Model", "Qwen2ValueModel", "abstract_model", "constrain",
    "count_params", "load_hf_checkpoint", "merge_for_compute", "logical_to_spec", "make_mesh", "qwen2_5_0_5b",
    "qwen2_5_1_5b", "qwen2_5_3b", "qwen2_5_7b", "save_hf_checkpoint", "shard_model",
    "state_shardings",
]
