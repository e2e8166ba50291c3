"""Decode and prefill of a preset-shaped model against the accelerator's own rooflines, measured in the same run.

Not a test: prints tokens/s and their fraction of what the device's memory bandwidth (decode) or matmul rate
(prefill) allows. Random bf16 weights; greedy decoding with no stop token, so every row samples exactly `--new`
tokens. Compilation is excluded: each measured call follows an identical warm-up call.

The baselines, measured first in this run on the same device:
  BW    copy bandwidth, bytes read + written per second by a jitted `x + 1` over a 1 GiB bf16 buffer;
  PEAK  matmul rate of a jitted bf16 [n, n] @ [n, n] (n = 8192 on an accelerator, 2048 on a CPU).

A decode step of batch B reads every weight once and the cached keys and values of every row:
  bytes(step) = P * 2 + 2 * L * B * S * K * hd * 2       (bf16; S = cache slots per row)
The sampler's static-shape attention reads all S slots of the buffer, masking the invalid ones, so this is
what the compiled step has to read; `ideal` counts only each row's filled slots (prompt + tokens so far,
averaged over the segment). The roofline step time is bytes / BW; the printed fraction is
roofline time / measured time (1.0: as fast as the memory allows at the measured copy rate).

Prefill of B rows of T tokens costs about 2 * P_matmul * B * T + 2 * L * B * T^2 * H * hd FLOPs (P_matmul: the
weights inside matmuls, LM head included, embeddings excluded); its fraction is that / PEAK / measured time.

  python bench/decode_roofline.py                          # Qwen2.5-0.5B shape, batches 1,16,128,512
  python bench/decode_roofline.py --preset qwen2.5-1.5b --batches 1,64
  python bench/decode_roofline.py --smoke                  # a 2 x 64 model on any machine: that it runs
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from agent_r1_jax.models import PRESETS, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from agent_r1_jax.sampling import Sampler, SamplingParams, buckets  # noqa: E402

BYTES = 2  # bf16 weights and cache


def best_time(fn, repeats: int) -> float:
  """Best wall time of `fn()` (which must block until its device work is done) after one warm-up call."""
  fn()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def copy_bandwidth(repeats: int) -> float:
  """Bytes read + written per second by a jitted elementwise pass over a 1 GiB bf16 buffer (64 MiB on a CPU)."""
  n = (2**29 if jax.default_backend() != "cpu" else 2**25)
  x = jnp.ones((n,), jnp.bfloat16)
  bump = jax.jit(lambda a: a + 1)
  seconds = best_time(lambda: bump(x).block_until_ready(), repeats)
  return 2 * n * BYTES / seconds


def matmul_rate(repeats: int) -> float:
  """FLOP/s of a jitted bf16 square matmul."""
  n = 8192 if jax.default_backend() != "cpu" else 2048
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  mm = jax.jit(lambda p, q: p @ q)
  return 2 * n**3 / best_time(lambda: mm(a, b).block_until_ready(), repeats)


def model_config(args) -> Qwen2Config:
  if args.smoke:
    return Qwen2Config(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
  return PRESETS[args.preset]()


def weight_counts(cfg: Qwen2Config) -> tuple[int, int]:
  """(every parameter, `Qwen2Config.num_params`; those inside matmuls: all but the norms, the q/k/v biases and
  an untied embedding table, which is only gathered from)."""
  total = cfg.num_params()
  kv = cfg.num_key_value_heads * cfg.head_dim
  biases = (cfg.num_attention_heads * cfg.head_dim + 2 * kv) if cfg.attention_bias else 0
  outside = cfg.num_hidden_layers * (2 * cfg.hidden_size + biases) + cfg.hidden_size
  if not cfg.tie_word_embeddings:
    outside += cfg.vocab_size * cfg.hidden_size
  return total, total - outside


def measure(graphdef, params, cfg: Qwen2Config, *, batch: int, prompt: int, new: int, repeats: int,
            bw: float, peak: float) -> dict:
  """Prefill and decode times of `batch` rows, and their roofline fractions (see the module docstring)."""
  rng = np.random.RandomState(batch)
  ids = rng.randint(0, cfg.vocab_size - 1, size=(batch, prompt)).astype(np.int32)
  mask = np.ones_like(ids)
  slots = buckets.prompt_bucket(prompt) + new
  sampler = Sampler(graphdef, max_cache_length=slots, stop_token_ids=[cfg.vocab_size - 1], pad_id=0,
                    cache_dtype=jnp.bfloat16)
  weights = sampler.prepare(params)
  budgets = np.full((batch,), new, np.int32)
  greedy = SamplingParams(greedy=True)

  def prefill():
    state = sampler.prefill(weights, ids, mask)
    jax.block_until_ready(state.cache)
    return state

  def both():
    _, seg = sampler.decode(weights, prefill(), budgets, greedy, jax.random.key(0))
    return seg

  t_prefill = best_time(prefill, repeats)
  t_both = best_time(both, repeats)
  t_decode = max(t_both - t_prefill, 1e-9)
  seg = both()
  sampled = int(seg.lengths.sum())
  total, in_matmuls = weight_counts(cfg)
  kv_per_slot = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * BYTES
  read_all = total * BYTES + batch * slots * kv_per_slot
  read_ideal = total * BYTES + batch * (prompt + (new + 1) / 2) * kv_per_slot
  step = t_decode / new
  flops = 2 * in_matmuls * batch * prompt + 2 * cfg.num_hidden_layers * batch * prompt**2 * (
      cfg.num_attention_heads * cfg.head_dim)
  return dict(batch=batch, sampled=sampled, prefill_s=t_prefill, prefill_tok_s=batch * prompt / t_prefill,
              prefill_frac=flops / peak / t_prefill, decode_tok_s=sampled / t_decode, step_ms=step * 1e3,
              roof_ms=read_all / bw * 1e3, frac=read_all / bw / step, frac_ideal=read_ideal / bw / step,
              gb_per_step=read_all / 1e9)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(PRESETS))
  parser.add_argument("--batches", default="1,16,128,512")
  parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per row")
  parser.add_argument("--new", type=int, default=256, help="sampled tokens per row")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--smoke", action="store_true", help="a 2 x 64 model, batch 2, 8 tokens: that it runs")
  args = parser.parse_args()
  if args.smoke:
    args.batches, args.prompt, args.new, args.repeats = "2", 8, 8, 1
  device = jax.devices()[0]
  print(f"jax {jax.__version__}, {device.platform} {device.device_kind}, {os.cpu_count()} CPUs", flush=True)
  bw, peak = copy_bandwidth(args.repeats), matmul_rate(args.repeats)
  print(f"baselines: copy bandwidth {bw / 1e9:.1f} GB/s (read + write), bf16 matmul {peak / 1e12:.1f} TFLOP/s",
        flush=True)
  cfg = model_config(args)
  model = Qwen2ForCausalLM(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
  graphdef, params = nnx.split(model)
  total, _ = weight_counts(cfg)
  print(f"model: {'smoke 2x64' if args.smoke else args.preset}, {total / 1e6:.0f}M parameters "
        f"({total * BYTES / 1e9:.2f} GB bf16); prompt {args.prompt}, {args.new} new tokens per row", flush=True)
  print("| batch | prefill tok/s | prefill / matmul roofline | decode tok/s | step ms | roofline step ms "
        "(GB read) | decode / roofline | ... counting filled slots only |")
  print("|---|---|---|---|---|---|---|---|")
  for batch in (int(b) for b in args.batches.split(",")):
    try:
      r = measure(graphdef, params, cfg, batch=batch, prompt=args.prompt, new=args.new, repeats=args.repeats,
                  bw=bw, peak=peak)
    except Exception as e:  # noqa: BLE001 - report the batch that failed (e.g. out of memory) and go on
      print(f"| {batch} | failed: {type(e).__name__}: {str(e).splitlines()[0][:200]} |", flush=True)
      continue
    if r["sampled"] != batch * args.new:  # the random model sampled the stop token: the loop ran on regardless
      print(f"(batch {batch}: {batch * args.new - r['sampled']} tokens cut by the stop token; tok/s counts the rest)")
    print(f"| {batch} | {r['prefill_tok_s']:.0f} | {r['prefill_frac']:.2f} | {r['decode_tok_s']:.0f} | "
          f"{r['step_ms']:.2f} | {r['roof_ms']:.2f} ({r['gb_per_step']:.2f}) | {r['frac']:.2f} | "
          f"{r['frac_ideal']:.2f} |", flush=True)


if __name__ == "__main__":
  main()
