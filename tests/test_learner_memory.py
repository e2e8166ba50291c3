"""The learner at scale: chunked log-probs equal the unchunked ones (values and gradients), and the compiled
memory of the log-prob pass and the actor update does not grow with the batch (a Qwen2.5-0.5B shape with 2
layers compiled for 8 simulated devices, no weights)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax import models
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.learner import build
from agent_r1_jax.sizing import dry_run
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.learner import updates as lrn


def _batch(rng, b, p, r, vocab):
  ids = rng.integers(0, vocab, (b, p + r)).astype(np.int32)
  mask = np.ones((b, p + r), np.int32)
  mask[0, :p - 2] = 0  # a left-padded prompt
  mask[1, p + r - 5:] = 0  # a short response
  return {"input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray(mask), "response_ids": jnp.asarray(ids[:, p:])}


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_logprobs_and_gradients_equal_the_unchunked_ones(chunk):
  """A block boundary off by one, a padded tail read back, or logits saved instead of recomputed would change
  values or gradients; R = 21 is not a multiple of 7 or 16, so the padded last block is exercised."""
  config = Qwen2Config.tiny(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)
  graphdef, params = nnx.split(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)))
  batch = _batch(np.random.default_rng(0), 3, 6, 21, 300)
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(3, 21)), jnp.float32)

  def objective(p, chunk_size):
    logp, entropy = lrn.response_logprobs(nnx.merge(graphdef, p), batch, temperature=0.7, with_entropy=True,
                                           chunk_size=chunk_size)
    return jnp.sum(weights * logp) + jnp.sum(weights * entropy), (logp, entropy)

  (_, (logp, ent)), grads = jax.value_and_grad(objective, has_aux=True)(params, 0)
  (_, (logp_c, ent_c)), grads_c = jax.value_and_grad(objective, has_aux=True)(params, chunk)
  np.testing.assert_allclose(np.asarray(logp_c), np.asarray(logp), atol=1e-5)
  np.testing.assert_allclose(np.asarray(ent_c), np.asarray(ent), atol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def _half_b_config(prompts: int):
  """The qwen2.5-0.5b preset at `prompts` x 2 samples, a 128 + 512 context, 1 row per device per micro-batch."""
  c = config_lib.base_config("grpo", "qwen2.5-0.5b")
  c.dry_run = True
  c.trainer.batch_size = prompts
  c.rollout.n_samples = 2
  c.rollout.max_prompt_length = 128
  c.rollout.max_response_length = 512
  c.rollout.max_context_length = 640
  return c


@pytest.mark.slow
def test_compiled_learner_memory_does_not_grow_with_the_batch():
  """64 and 640 rows on 8 devices: the per-device temporaries of the log-prob pass and the actor update stay
  within 10% (a pass over all rows at once, or logits of the whole batch, would grow them 10x), while the
  log-prob pass's outputs ([rows, R] log-probs and entropy) do grow 10x."""
  arch = dataclasses.replace(models.qwen2_5_0_5b(), num_hidden_layers=2)
  figures = {}
  for prompts in (32, 320):
    c = _half_b_config(prompts)
    mesh = build.build_mesh(c)
    assert mesh.devices.size == 8
    programs, _ = dry_run.size_programs(c, arch, mesh, programs=("logprobs", "actor_update"))
    figures[prompts] = {p.name: p for p in programs}
  for name in ("logprobs", "actor_update"):
    small, large = figures[32][name], figures[320][name]
    assert large.temporaries <= 1.1 * small.temporaries, (name, small.temporaries, large.temporaries)
    assert small.temporaries <= 1.1 * large.temporaries, (name, small.temporaries, large.temporaries)
  assert figures[320]["logprobs"].outputs > 9 * figures[32]["logprobs"].outputs
