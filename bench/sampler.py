"""Sampler throughput vs transformers' PyTorch `generate`, and cache continuation vs re-prefill.

Not a test: prints tokens/s and ratios measured in this run on this machine. All models are random
(built in-process, same weights for both frameworks via a temporary HF checkpoint). Compilation and
PyTorch warm-up are excluded: every measured call is preceded by an identical warm-up call.

  python bench/sampler.py                 # small (4 x 256) and Qwen2.5-0.5B-shaped models + episode
  python bench/sampler.py --skip-0.5b     # skip the 2 GB model
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np
import torch
import transformers
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from agent_r1_jax.models import load_hf_checkpoint  # noqa: E402
from agent_r1_jax.sampling import Sampler, SamplingParams, buckets  # noqa: E402

QWEN_VOCAB = 151936
PAD = 151643


def hf_model(*, vocab, hidden, inter, layers, heads, kv_heads, tie, seed=0):
  torch.manual_seed(seed)
  cfg = transformers.Qwen2Config(
      vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
      num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tie,
      rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768)
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  with torch.no_grad():  # default init leaves biases 0 and norms 1; perturb so nothing is trivial
    for name, p in model.named_parameters():
      if "bias" in name or "norm" in name:
        p.add_(0.02 * torch.randn_like(p))
  return model


def prompts(batch, lo, hi, vocab, seed=0):
  rng = np.random.RandomState(seed)
  lengths = rng.randint(lo, hi + 1, size=batch)
  width = int(lengths.max())
  ids = np.full((batch, width), PAD % vocab, np.int32)
  mask = np.zeros((batch, width), np.int32)
  for i, n in enumerate(lengths):
    ids[i, width - n:] = rng.randint(0, vocab - 1000, size=n)
    mask[i, width - n:] = 1
  return ids, mask


def timed_pair(fn_a, fn_b, repeats=1):
  """Best-of-`repeats` wall time of two callables, measured alternately (a, b, a, b, ...).

  Alternating keeps both sides under the same background load on a shared machine; each is warmed up
  once first (compilation, first-call allocation).
  """
  out_a, out_b = fn_a(), fn_b()
  best_a = best_b = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out_a = fn_a()
    best_a = min(best_a, time.perf_counter() - start)
    start = time.perf_counter()
    out_b = fn_b()
    best_b = min(best_b, time.perf_counter() - start)
  return (best_a, out_a), (best_b, out_b)


def throughput(name, hf, ids, mask, new_tokens, repeats):
  """Greedy decoding of `new_tokens` per row with both implementations; returns tokens/s pair."""
  vocab = hf.config.vocab_size
  with tempfile.TemporaryDirectory() as tmp:
    hf.save_pretrained(tmp)
    model = load_hf_checkpoint(tmp)
  graphdef, params = nnx.split(model)
  stop = vocab - 1  # never in prompts; greedy output is checked for it below
  sampler = Sampler(graphdef, max_cache_length=buckets.prompt_bucket(ids.shape[1]) + new_tokens,
                    stop_token_ids=[stop], pad_id=PAD % vocab)
  greedy = SamplingParams(greedy=True)
  budgets = np.full((ids.shape[0],), new_tokens, np.int32)

  def ours():
    state = sampler.prefill(params, ids, mask)
    _, seg = sampler.decode(params, state, budgets, greedy, jax.random.key(0))
    return seg

  def theirs():
    with torch.inference_mode():
      return hf.generate(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=PAD % vocab, eos_token_id=None)

  (t_ours, seg), (t_hf, out) = timed_pair(ours, theirs, repeats)
  n_ours = int(seg.lengths.sum())
  n_hf = int(out[:, ids.shape[1]:].numel())
  agree = float((seg.tokens == out[:, ids.shape[1]:].numpy()).mean())
  r_ours, r_hf = n_ours / t_ours, n_hf / t_hf
  print(f"{name}: ours {r_ours:9.1f} tok/s ({n_ours} tokens, {t_ours:.2f} s) | transformers "
        f"{r_hf:9.1f} tok/s ({n_hf} tokens, {t_hf:.2f} s) | ratio {r_ours / r_hf:5.2f}x | "
        f"greedy token agreement {agree:.3f}", flush=True)
  del hf
  return r_ours / r_hf, (graphdef, params, vocab)


def episode(graphdef, params, vocab, *, batch, prompt_len, turns, action_tokens, obs_tokens,
            repeats):
  """5-turn episode: continue_ (cache kept) vs prefilling the whole context before every turn."""
  ids, mask = prompts(batch, prompt_len, prompt_len, vocab, seed=1)
  # Both paths share one sampler, so the cache fits the re-prefill path's largest bucketed context.
  longest = prompt_len + (turns - 1) * (action_tokens + obs_tokens)
  capacity = buckets.prompt_bucket(longest) + action_tokens
  sampler = Sampler(graphdef, max_cache_length=capacity, stop_token_ids=[vocab - 1],
                    pad_id=PAD % vocab)
  sampling = SamplingParams(temperature=1.0)
  budgets = np.full((batch,), action_tokens, np.int32)
  rng = np.random.RandomState(2)
  observations = [[rng.randint(0, vocab - 1000, size=obs_tokens).tolist() for _ in range(batch)]
                  for _ in range(turns - 1)]

  def continued():
    state = sampler.prefill(params, ids, mask)
    state, seg = sampler.decode(params, state, budgets, sampling, jax.random.key(0))
    total = int(seg.lengths.sum())
    for t in range(turns - 1):
      state, seg = sampler.continue_(params, state, observations[t], budgets, sampling,
                                     jax.random.key(t + 1))
      total += int(seg.lengths.sum())
    return total

  def reprefill():
    contexts = [ids[i][mask[i] > 0].tolist() for i in range(batch)]
    total = 0
    for t in range(turns):
      width = max(len(c) for c in contexts)
      c_ids = np.full((batch, width), PAD % vocab, np.int32)
      c_mask = np.zeros((batch, width), np.int32)
      for i, c in enumerate(contexts):
        c_ids[i, width - len(c):] = c
        c_mask[i, width - len(c):] = 1
      state = sampler.prefill(params, c_ids, c_mask)
      _, seg = sampler.decode(params, state, budgets, sampling, jax.random.key(t))
      total += int(seg.lengths.sum())
      for i in range(batch):
        contexts[i] += seg.tokens[i, :seg.lengths[i]].tolist()
        if t < turns - 1:
          contexts[i] += observations[t][i]
    return total

  (t_cont, n_cont), (t_full, n_full) = timed_pair(continued, reprefill, repeats)
  print(f"episode ({turns} turns, batch {batch}, prompt {prompt_len}, {action_tokens} action + "
        f"{obs_tokens} observation tokens/turn): continuation {t_cont:.2f} s ({n_cont} tokens) | "
        f"re-prefill {t_full:.2f} s ({n_full} tokens) | speed-up {t_full / t_cont:5.2f}x",
        flush=True)
  return t_full / t_cont


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--skip-0.5b", action="store_true", dest="skip_big")
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  print(f"jax {jax.__version__} ({jax.devices()[0].platform}, {os.cpu_count()} CPUs), torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}", flush=True)
  # The project's small-model setting: the synthetic world's tokenizer has a 4096-token vocabulary.
  small = hf_model(vocab=4096, hidden=256, inter=1024, layers=4, heads=4, kv_heads=2, tie=True)
  ids, mask = prompts(16, 16, 32, 4096)
  ratio_small, (graphdef, params, vocab) = throughput(
      "small 4x256, vocab 4096, batch 16, 128 new", small, ids, mask, 128, args.repeats)
  ratio_ep = episode(graphdef, params, vocab, batch=16, prompt_len=128, turns=5, action_tokens=32,
                     obs_tokens=128, repeats=args.repeats)
  # Same body with the full Qwen2.5 vocabulary: the 151936 x 256 LM head dominates every step.
  small_q = hf_model(vocab=QWEN_VOCAB, hidden=256, inter=1024, layers=4, heads=4, kv_heads=2,
                     tie=True)
  ids, mask = prompts(16, 16, 32, QWEN_VOCAB)
  ratio_small_q, _ = throughput("small 4x256, vocab 151936, batch 16, 128 new", small_q, ids, mask,
                                128, 1)
  ratio_big = None
  if not args.skip_big:
    big = hf_model(vocab=QWEN_VOCAB, hidden=896, inter=4864, layers=24, heads=14, kv_heads=2,
                   tie=True)
    ids, mask = prompts(4, 32, 64, QWEN_VOCAB)
    ratio_big, _ = throughput("Qwen2.5-0.5B shape, batch 4, 64 new", big, ids, mask, 64, 1)
  big = "skipped" if ratio_big is None else f"{ratio_big:.2f}x"
  print(f"summary: small {ratio_small:.2f}x HF (target >= 5x; {ratio_small_q:.2f}x with the Qwen "
        f"vocabulary) | 0.5B {big} HF (target >= 1x) | continuation {ratio_ep:.2f}x re-prefill "
        "(target >= 2x)")


if __name__ == "__main__":
  main()
