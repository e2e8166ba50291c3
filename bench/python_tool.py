"""The python tool's sandbox cost: snippets per second with namespace isolation vs without, in one run.

  python bench/python_tool.py [--snippets 64] [--workers 4] [--repeats 3]
  python bench/python_tool.py --smoke              # 4 snippets, 2 at a time, one repeat: that it runs

Each side runs the same batch (`PythonTool.call_batch`, `--workers` snippets at a time) of small programs that
a policy writes (arithmetic, a list comprehension, a `json` round trip, a print), `--repeats` times after one
warm-up batch; the best batch time is kept. The baseline is `isolation="none"` (a plain child process with the
same rlimits); the sandbox adds `unshare` (mount, network, PID, IPC and UTS namespaces), a setup shell with its
binds and tmpfs mounts, `pivot_root` and `setpriv`. Prints snippets/s and the ratio; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agent_r1_jax.tools import PythonTool  # noqa: E402

SNIPPETS = (
    "print(sum(i * i for i in range(1000)))",
    "import json\nprint(json.loads(json.dumps({'a': [1, 2, 3]}))['a'][-1])",
    "xs = [x for x in range(200) if x % 7 == 0]\nprint(len(xs), xs[-1])",
    "import math\nprint(round(math.log(1234.5) * math.sqrt(2), 6))",
)


def batch_seconds(tool: PythonTool, batch: list[dict], repeats: int) -> float:
  results = tool.call_batch(batch)  # warm-up: page cache, first process start
  assert all(r.success for r in results), [r.content for r in results if not r.success][:2]
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    results = tool.call_batch(batch)
    best = min(best, time.perf_counter() - t0)
    assert all(r.success for r in results)
  return best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--snippets", type=int, default=64)
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--smoke", action="store_true", help="4 snippets, 2 at a time, one repeat: checks that it runs")
  args = parser.parse_args()
  if args.smoke:
    args.snippets, args.workers, args.repeats = 4, 2, 1
  batch = [{"code": SNIPPETS[i % len(SNIPPETS)]} for i in range(args.snippets)]
  print(f"{args.snippets} snippets, {args.workers} at a time, {os.cpu_count()} CPUs, best of {args.repeats}",
        flush=True)
  rates = {}
  for isolation in ("none", "namespaces"):
    tool = PythonTool(isolation=isolation, max_workers=args.workers, time_limit_s=60)
    seconds = batch_seconds(tool, batch, args.repeats)
    rates[isolation] = args.snippets / seconds
    print(f"isolation={isolation:10s} {seconds:6.2f} s per batch  {rates[isolation]:6.1f} snippets/s "
          f"({1000 * seconds / args.snippets:.1f} ms each)", flush=True)
  print(f"sandbox cost: {rates['none'] / rates['namespaces']:.2f}x the time of unisolated snippets "
        f"(target: within 2x)")


if __name__ == "__main__":
  main()
