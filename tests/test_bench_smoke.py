"""Every `bench/` script runs: each in its `--smoke` mode (toy sizes, one repeat) as a subprocess, which must exit 0
and print its ratio line(s), the comparison against a baseline measured in the same run. Nothing here reads a
time or a ratio's value (tests never time anything); a bench whose code no longer matches the package (a renamed
batch field, a changed signature) fails here instead of when someone next measures."""

from __future__ import annotations

import ast
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
RATIO = r"\d+\.\d+x"

# Per script: the lines (regular expressions, searched line by line in its stdout) that state its ratios.
RATIO_LINES = {
    "advantages": [rf"^GAE\s+jit scan\s.*\s{RATIO}\s", rf"^GRPO\s+jit\s.*\s{RATIO}\s",
                   rf"best jitted GAE is {RATIO} faster"],
    # Against the device's copy bandwidth and matmul rate measured in the same run: roofline fractions.
    "decode_roofline": [r"^baselines: copy bandwidth [\d.]+ GB/s \(read \+ write\), bf16 matmul [\d.]+ TFLOP/s$",
                        r"^\| 2 \| \d+ \| [\d.]+ \| \d+ \| [\d.]+ \| [\d.]+ \([\d.]+\) \| [\d.]+ \| [\d.]+ \|$"],
    "learner": [rf"^\s+update:\s+ours .*\| ratio\s+{RATIO}", rf"^\s+log-prob: ours .*\| ratio\s+{RATIO}",
                rf"^\s+on-policy step .*\| shortcut: .*\| ratio\s+{RATIO}",
                rf"^\| smoke .* \| [\d.]+ ms \| [\d.]+ ms \| {RATIO} \|$"],
    # The machine's float32 matmul rate (the figure the docs quote), jitted jax.numpy against NumPy's BLAS.
    "matmul_rate": [r"^cpu: .+; \d+ logical CPUs; load average ", r"^float32 256 x 256 matmul, jitted jax\.numpy: ",
                    r"^float32 256 x 256 matmul, numpy: ", rf"^ratio jax\.numpy / numpy: {RATIO}$"],
    "python_tool": [rf"^sandbox cost: {RATIO} the time of unisolated snippets"],
    # Memory-mapped BM25 over HTTP against in-process search; ScaNN against exact numpy search.
    "retrieval": [rf"^HTTP, one query per request, 1 client\s+:.*\({RATIO} in-process\)",
                  rf"^HTTP, batches of \d+, \d+ clients\s+:.*\({RATIO} one per request\)",
                  rf"^ScaNN single query\s+:.*\({RATIO} exact single\)",
                  rf"^ScaNN batched\s+:.*\({RATIO} single, {RATIO} exact batched\)"],
    # The slot engine against the lockstep driver on the same episodes, per injected tool latency.
    "rollout": [rf"^ratio smoke {latency}\s+\d+/\d+ slots chunk\s+\d+: episodes/s {RATIO} \| tokens/s {RATIO} \| "
                rf"occupancy {RATIO} \| tool time hidden (\d+%|n/a) \(lockstep 0%\) \| peak memory {RATIO}$"
                for latency in ("none", "100ms", "lognormal")] + [r"^targets \(smoke; reported, not asserted\): "],
    # Length-grouped warm-up batches against random ones: padding counted per group size, then timed; then the
    # same stage with blocked attention against dense.
    "sft": [r"^\| 0 \| [\d.]+ \| [\d.]+ \|$", r"^\| 8 \| [\d.]+ \| [\d.]+ \|$",
            rf"^ratio \(g = 0 / g = 8\): {RATIO} with compilation, ({RATIO}|n/a) per compiled step; ",
            rf"^\s+dense: .* the first size's time over this one's: {RATIO} with compilation, ({RATIO}|n/a) per "
            rf"compiled step; "],
    "sampler": [rf"^smoke .*\| ratio\s+{RATIO} \|", rf"^episode .*\| speed-up\s+{RATIO}",
                rf"^summary: small {RATIO} HF \| continuation {RATIO} re-prefill"],
}


def _environment() -> dict[str, str]:
  """This environment without the suite's 8 fake CPU devices (conftest): a bench runs as a user runs it."""
  env = dict(os.environ)
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
  if flags:
    env["XLA_FLAGS"] = flags
  else:
    env.pop("XLA_FLAGS", None)
  return env


def test_every_bench_script_has_its_ratio_lines_listed():
  """A bench added to bench/ without an entry here would not be smoke-tested."""
  assert sorted(p.stem for p in (REPO / "bench").glob("*.py")) == sorted(RATIO_LINES)


@pytest.mark.parametrize("name", sorted(RATIO_LINES))
@pytest.mark.slow
def test_bench_smoke_mode_completes_and_prints_its_ratios(name):
  if name == "python_tool":
    from agent_r1_jax.tools import sandbox  # pylint: disable=import-outside-toplevel
    try:
      sandbox.check_available()
    except sandbox.SandboxUnavailable as e:
      pytest.skip(f"the python tool bench compares against the namespace sandbox, unavailable here: {e}")
  proc = subprocess.run([sys.executable, str(REPO / "bench" / f"{name}.py"), "--smoke"], cwd=REPO, env=_environment(),
                        capture_output=True, text=True, timeout=600, check=False)
  tail = f"\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
  assert proc.returncode == 0, f"bench/{name}.py --smoke exited {proc.returncode}{tail}"
  lines = proc.stdout.splitlines()
  for pattern in RATIO_LINES[name]:
    assert any(re.search(pattern, line) for line in lines), f"no line matches {pattern!r}{tail}"


def test_matmul_rate_runs_after_the_plain_install_and_prints_a_positive_rate():
  """`bench/matmul_rate.py`, the README's way to print the machine's rate, needs only the package's own requirements
  (no torch, which `pip install -e .` does not install) and prints a positive, finite rate per side."""
  tree = ast.parse((REPO / "bench" / "matmul_rate.py").read_text())
  imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
  imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
  assert imported - set(sys.stdlib_module_names) - {"__future__"} == {"jax", "numpy"}  # both in requirements.txt
  proc = subprocess.run([sys.executable, str(REPO / "bench" / "matmul_rate.py"), "--smoke"], cwd=REPO,
                        env=_environment(), capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rates = re.findall(r"^float32 256 x 256 matmul, (jitted jax\.numpy|numpy): ([^ ]+) GFLOP/s", proc.stdout, re.M)
  assert [side for side, _ in rates] == ["jitted jax.numpy", "numpy"], proc.stdout
  for _, rate in rates:
    assert math.isfinite(float(rate)) and float(rate) > 0, proc.stdout
