"""The README's table of TPU dry runs, from the JSON reports they wrote (`--config.dry_run_report`).

    python docs/make_dry_run_table.py docs/tpu_dry_run/*.json

Each report's file name is `<algorithm>_<preset>_<topology>.json`; its `overrides` line (if any) is read from the
`.cmd` file beside it, the command that wrote it.
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from agent_r1_jax.sizing import roofline  # noqa: E402

_GIB = float(1 << 30)


def _step_seconds(report: dict) -> float | None:
  """`DryRunReport.step_seconds()['total']` from the report's own figures (None without them)."""
  chip = report.get("chip")
  if chip is None or any("iteration_flops" not in p or p["bytes_accessed"] is None for p in report["programs"]):
    return None
  chip = roofline.Chip(**chip)
  return sum(roofline.estimate_seconds(p["iteration_flops"], p["bytes_accessed"], chip,
                                       iterations=p["iterations_per_step"]) for p in report["programs"])


def _row(path: pathlib.Path) -> str:
  report = json.loads(path.read_text())
  command = path.with_suffix(".cmd").read_text().split() if path.with_suffix(".cmd").exists() else []
  config = next((a.split("=", 1)[1] for a in command if a.startswith("--config=")), "?")
  algorithm, _, preset = pathlib.Path(config).name.partition(":")
  overrides = [a for a in command if a.startswith("--config.") and not a.startswith("--config.dry_run")]
  programs = {p["name"]: p for p in report["programs"]}
  worst = max(report["programs"], key=lambda p: p["peak"] if p["peak"] is not None else float("inf"))
  decode = programs.get("decode") or programs.get("decode_chunk") or {}
  ratio = (f"{decode['bytes_accessed'] / decode['must_read_bytes']:.2f}x" if decode.get("must_read_bytes") else "-")
  flops = []
  for name in ("actor_update", "critic_update"):
    p = programs.get(name, {})
    if p.get("micro_batch_flops_analytic"):
      compiled = p.get("iteration_flops", p.get("micro_batch_flops"))  # the name before the step estimate
      flops.append(f"{compiled / p['micro_batch_flops_analytic']:.2f}x")
  step = _step_seconds(report)
  peak = "refused" if worst["peak"] is None else f"{worst['peak'] / _GIB:.2f} ({worst['name']})"
  return (f"| {preset} | {algorithm.removesuffix('_multihopqa.py')} | `{report['topology']}` | "
          f"{' '.join(f'`{o}`' for o in overrides) or '-'} | {peak} | {report['chip_hbm_bytes'] / _GIB:.2f} | "
          f"{'yes' if report['fits'] else 'no'} | {ratio} | {' / '.join(flops) or '-'} | "
          f"{'-' if step is None else f'{step / 60:.1f} min'} |")


def table(paths: list[pathlib.Path]) -> str:
  head = ("| preset | algorithm | slice | override | largest peak per chip, GiB (program) | chip allows, GiB | fits | "
          "decode bytes / must read | update FLOPs compiled / analytic | estimated step |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
  return "\n".join([head] + [_row(p) for p in paths])


if __name__ == "__main__":
  print(table([pathlib.Path(p) for p in sys.argv[1:]]))
