"""This machine's float32 matmul rate: the figure the docs quote beside every CPU measurement.

Not a test: prints, for an n x n float32 matmul (2048 unless told), the rate of the jitted `jax.numpy` product
(the docs' "float32 matmul N GFLOP/s, jitted 2048 x 2048") and, as the baseline measured in the same run, NumPy's
BLAS on the same matrices. Each is run once to warm up (compilation, first-call allocations), then timed
`--repeats` times; the median is reported. Also prints the CPU model, its vector extensions (AVX2, AVX-512, AMX)
and the load average: the 2-core CPUs the docs quote ran at 70-480 GFLOP/s, and other processes slow it.
Needs only `pip install -e .` (no PyTorch).

  python bench/matmul_rate.py                 # 2048 x 2048, 10 repeats
  python bench/matmul_rate.py --n 4096 --repeats 20
  python bench/matmul_rate.py --smoke         # 256 x 256, one repeat: that it runs
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

_ISA_FLAGS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("amx_tile", "AMX"))


def cpu_description() -> str:
  """The CPU model and its matmul-relevant vector extensions, read from /proc/cpuinfo where there is one."""
  model, flags = "", set()
  cpuinfo = pathlib.Path("/proc/cpuinfo")
  if cpuinfo.is_file():
    for line in cpuinfo.read_text(errors="replace").splitlines():
      key, _, value = line.partition(":")
      if key.strip() == "model name" and not model:
        model = value.strip()
      elif key.strip() == "flags" and not flags:
        flags = set(value.split())
  model = model or platform.processor() or platform.machine() or "unknown"
  extensions = [name for flag, name in _ISA_FLAGS if flag in flags]
  return f"{model} ({', '.join(extensions) if extensions else 'no AVX2/AVX-512/AMX flags listed'})"


def median_seconds(fn, repeats: int) -> float:
  """Median wall time of `fn()` over `repeats` calls, after one untimed call."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def matmul_rates(n: int, repeats: int) -> tuple[float, float]:
  """GFLOP/s (2 n^3 flops per product) of the jitted jnp matmul and of NumPy's, on the same float32 matrices."""
  a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
  b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
  product = jax.jit(jnp.matmul)
  a_device, b_device = jax.device_put(a), jax.device_put(b)
  seconds_jax = median_seconds(lambda: product(a_device, b_device).block_until_ready(), repeats)
  seconds_numpy = median_seconds(lambda: a @ b, repeats)
  flops = 2.0 * n ** 3
  return flops / seconds_jax / 1e9, flops / seconds_numpy / 1e9


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--n", type=int, default=2048, help="matrix size (the docs quote 2048)")
  parser.add_argument("--repeats", type=int, default=10, help="timed products per side; the median is reported")
  parser.add_argument("--smoke", action="store_true", help="256 x 256, one repeat: checks that the script runs")
  args = parser.parse_args()
  n, repeats = (256, 1) if args.smoke else (args.n, args.repeats)

  device = jax.devices()[0]
  load = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"
  print(f"cpu: {cpu_description()}; {os.cpu_count()} logical CPUs; load average {load}")
  print(f"jax {jax.__version__}, backend {jax.default_backend()} ({device.device_kind}), numpy {np.__version__}")
  rate_jax, rate_numpy = matmul_rates(n, repeats)
  print(f"float32 {n} x {n} matmul, jitted jax.numpy: {rate_jax:.1f} GFLOP/s (median of {repeats})")
  print(f"float32 {n} x {n} matmul, numpy: {rate_numpy:.1f} GFLOP/s (median of {repeats})")
  print(f"ratio jax.numpy / numpy: {rate_jax / rate_numpy:.2f}x")


if __name__ == "__main__":
  main()
