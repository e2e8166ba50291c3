"""Train a tool-using agent with RL.

    python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py[:PRESET] --workdir=DIR \
        [--config.rollout.max_turns=3 ...]

Writes `DIR/metrics.jsonl` (one JSON object per step), TensorBoard events, checkpoints under
`DIR/checkpoints/` (rerunning with the same DIR resumes; SIGTERM or Ctrl-C saves and exits, in RL or in the
warm-up), `DIR/summary.json`, `DIR/curves.png` and the final policy as a Hugging Face checkpoint in
`DIR/hf_export/`. DIR may be a Cloud Storage directory (`gs://bucket/run`, the machine's Google credentials;
agent_r1_jax/workdir.py).
`--config.dry_run=True` compiles every program of one step at the configured shapes (no weights) and prints
each one's per-device memory and cost as the compiler reports it, and whether the run fits
`--config.dry_run_memory_gb`; with `--config.dry_run_topology=v5e:2x4` (libtpu) XLA:TPU compiles them for that
TPU slice and the budget is its chips' HBM. `--config.dry_run_report=PATH` also writes the figures as JSON.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from agent_r1_jax.cli_config import config_problem, unknown_override

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training config file, e.g. configs/grpo_multihopqa.py or configs/ppo_multihopqa.py:qwen2.5-3b.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (metrics, checkpoints, exports), local or "
                                "gs://bucket/dir. Reused = resumed.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config.dry_run:  # before any backend exists: XLA reads its flags once
    # After flag parsing: only a dry run sets this XLA flag.
    from agent_r1_jax.sizing.dry_run import use_memory_scheduler  # pylint: disable=import-outside-toplevel
    use_memory_scheduler()
  from agent_r1_jax.distributed import maybe_initialize  # pylint: disable=import-outside-toplevel  (after flags)
  maybe_initialize()  # multi-host pods: before anything touches a JAX backend; a no-op for one process
  if not config.dry_run and not _WORKDIR.value:
    raise app.UsageError("--workdir is required (a directory for metrics, checkpoints and the HF export)")
  try:
    run(config, _WORKDIR.value)
  except ValueError as e:  # a user-fixable problem: one message, no traceback (AGENT_R1_DEBUG=1 shows it)
    if os.environ.get("AGENT_R1_DEBUG"):
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:  # Ctrl-C outside the warm-up and RL steps (which save first), or a second Ctrl-C
    print("interrupted: nothing saved since the last checkpoint; rerun the same command to resume from it",
          file=sys.stderr)
    sys.exit(130)


def run(c, workdir: str | None):
  """The CLI's choice: size the run without weights (`dry_run`: `sizing.dry_run`) or train it (`trainer.train`).
  Imported here, not at the top: a multi-host run initialises `jax.distributed` first (`main`)."""
  from agent_r1_jax import trainer  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sizing.dry_run import dry_run  # pylint: disable=import-outside-toplevel
  if c.dry_run:
    trainer.prepare_config(c)
    return dry_run(c)
  return trainer.train(c, workdir)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing with config mistakes (a missing file, an unknown preset, a mistyped override) reported in
  one line instead of a traceback."""
  problem = config_problem(argv)
  if problem:
    print(f"error: {problem}", file=sys.stderr)
    sys.exit(2)
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, flags.IllegalFlagValueError) as e:
    message = unknown_override(argv)
    print(f"error: {message or e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=_parse_flags)
