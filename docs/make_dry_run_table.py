"""The tables of TPU dry runs in docs/measurements.md, from the JSON reports they wrote (`--config.dry_run_report`).

    python docs/make_dry_run_table.py docs/tpu_dry_run/*.json

Each report's file name is `<algorithm>_<preset>_<topology>[_variant].json`; its `overrides` (if any) are read from
the `.cmd` file beside it, the command that wrote it. The first table has a row per report; the second a row per
report of the paged slot engine (`model.kv_cache=paged`): its pages and episodes per chip against the dense
cache's, and its decode bytes against the bytes a step must read under both length distributions
(`sizing.paged_sizing`: the worst case, every turn at its full budget, and an assumed mean context).
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from agent_r1_jax.sizing import roofline  # noqa: E402

_GIB = float(1 << 30)


def _step_seconds(report: dict) -> float | None:
  """`DryRunReport.step_seconds()['total']` from the report's own figures (None without them): each program's
  iterations at max(FLOPs / peak, bytes / bandwidth), a paged program's kernel FLOPs and bytes added."""
  chip = report.get("chip")
  if chip is None or any("iteration_flops" not in p or p["bytes_accessed"] is None for p in report["programs"]):
    return None
  chip = roofline.Chip(**chip)
  return sum(roofline.estimate_seconds(p["iteration_flops"] + p.get("kernel_flops", 0.0),
                                       p["bytes_accessed"] + p.get("kernel_bytes", 0.0), chip,
                                       iterations=p["iterations_per_step"]) for p in report["programs"])


def _command(path: pathlib.Path) -> tuple[str, str, list[str]]:
  """(algorithm, preset, overrides) of the `.cmd` beside a report."""
  cmd = path.with_suffix(".cmd")
  command = cmd.read_text().split() if cmd.exists() else []
  config = next((a.split("=", 1)[1] for a in command if a.startswith("--config=")), "?")
  algorithm, _, preset = pathlib.Path(config).name.partition(":")
  overrides = [a for a in command if a.startswith("--config.") and not a.startswith("--config.dry_run")]
  return algorithm.removesuffix("_multihopqa.py"), preset, overrides


def _decode_ratio(decode: dict) -> str:
  """Decode's bytes per step (a paged one's kernel included) / its must-read, and against the cache as the pages
  store it where that differs (a zero-padded head width)."""
  if not decode.get("must_read_bytes"):
    return "-"
  total = decode["bytes_accessed"] + decode.get("kernel_bytes", 0.0)
  ratio = f"{total / decode['must_read_bytes']:.2f}x"
  padded = decode.get("must_read_padded_bytes")
  if padded and padded != decode["must_read_bytes"]:
    ratio += f" ({total / padded:.2f}x as stored)"
  return ratio


def _row(path: pathlib.Path) -> str:
  report = json.loads(path.read_text())
  algorithm, preset, overrides = _command(path)
  programs = {p["name"]: p for p in report["programs"]}
  worst = max(report["programs"], key=lambda p: p["peak"] if p["peak"] is not None else float("inf"))
  decode = programs.get("decode") or programs.get("decode_chunk") or {}
  flops = []
  for name in ("actor_update", "critic_update"):
    p = programs.get(name, {})
    if p.get("micro_batch_flops_analytic"):
      compiled = p.get("iteration_flops", p.get("micro_batch_flops"))  # the name before the step estimate
      flops.append(f"{compiled / p['micro_batch_flops_analytic']:.2f}x")
  step = _step_seconds(report)
  peak = "refused" if worst["peak"] is None else f"{worst['peak'] / _GIB:.2f} ({worst['name']})"
  return (f"| {preset} | {algorithm} | `{report['topology']}` | "
          f"{' '.join(f'`{o}`' for o in overrides) or '-'} | {peak} | {report['chip_hbm_bytes'] / _GIB:.2f} | "
          f"{'yes' if report['fits'] else 'no'} | {_decode_ratio(decode)} | {' / '.join(flops) or '-'} | "
          f"{'-' if step is None else f'{step / 60:.1f} min'} |")


def table(paths: list[pathlib.Path]) -> str:
  head = ("| preset | algorithm | slice | override | largest peak per chip, GiB (program) | chip allows, GiB | fits | "
          "decode bytes / must read | update FLOPs compiled / analytic | estimated step |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
  return "\n".join([head] + [_row(p) for p in paths])


def _paged_row(path: pathlib.Path) -> str:
  report = json.loads(path.read_text())
  _, preset, _ = _command(path)
  plan = report["paged"]
  ratios = " / ".join(f"{c['ratio']:.2f}x" + (f" ({c['ratio_padded']:.2f}x as stored)" if c["ratio_padded"] !=
                                                c["ratio"] else "") for c in plan["checks"]) or "-"
  return (f"| {preset} | `{report['topology']}` | {plan['slots_per_device']} | {plan['page_bytes'] / 2**20:.2f} | "
          f"{plan['non_pool_bytes'] / _GIB:.2f} | {plan['fit_pages']} ({plan['pages_per_device']}) | "
          f"{plan['episodes_full']} / {plan['dense_episodes']} | {plan['episodes_mean']} | {ratios} |")


def paged_table(paths: list[pathlib.Path]) -> str:
  rows = [_paged_row(p) for p in paths if "paged" in json.loads(p.read_text())]
  head = ("| preset | slice | slots per chip | page, MiB per chip | not pool, GiB | pages per chip that fit "
          "(compiled) | episodes per chip at the worst case's full context: paged / dense | paged at the assumed mean "
          "context | decode bytes / must read: worst case / assumed mean |\n"
          "|---|---|---|---|---|---|---|---|---|")
  return "\n".join([head] + rows) if rows else ""


if __name__ == "__main__":
  files = [pathlib.Path(p) for p in sys.argv[1:]]
  print(table(files))
  paged = paged_table(files)
  if paged:
    print()
    print(paged)
