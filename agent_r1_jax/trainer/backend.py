"""Which hardware JAX runs on, said at start, and the refusal to train a real model on the host CPU.

`pip install -e .` installs `jaxlib` from requirements.txt, which runs on the CPU only; JAX uses a TPU or GPU
only when its plugin is installed too (the `tpu` and `cuda12` extras of pyproject.toml: `libtpu`, the CUDA 12
plugin). Without it JAX falls back to the CPU with at most a warning, and a real preset would then spend
hours on the host CPUs before anyone noticed. So the trainer prints the backend line at start and
`check_accelerator` stops a real preset on the CPU with one message naming the extra to install, unless
`--config.allow_cpu=True` says the CPU is intended (debugging a real checkpoint on a workstation).
"""

from __future__ import annotations

import importlib.util
import os

import jax
from ml_collections import config_dict

from agent_r1_jax.trainer.config import REAL_PRESETS

# Modules of the accelerator plugins the extras install (`libtpu`: `.[tpu]`; `jax_cuda12_plugin`: `.[cuda12]`).
ACCELERATOR_PLUGINS = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin")


def _plural(count: int, word: str, plural: str | None = None) -> str:
  return f"{count} {word if count == 1 else (plural or word + 's')}"


def describe_backend() -> str:
  """One line naming JAX's backend, its devices (count and kind) and the processes, e.g.
  `backend: cpu, 8 x cpu devices, 1 process` or `backend: tpu, 32 x TPU v5 lite devices (4 per process), 8
  processes`; printed at start so a run's log says which hardware it trained on."""
  devices = jax.devices()
  kinds = ", ".join(sorted({d.device_kind for d in devices}))
  line = f"backend: {jax.default_backend()}, {len(devices)} x {kinds} device{'' if len(devices) == 1 else 's'}"
  if jax.process_count() > 1:
    line += f" ({jax.local_device_count()} per process)"
  return f"{line}, {_plural(jax.process_count(), 'process', 'processes')}"


def installed_plugins() -> list[str]:
  """The accelerator plugin modules importable here (none after a plain `pip install -e .`)."""
  return [name for name in ACCELERATOR_PLUGINS if importlib.util.find_spec(name) is not None]


def check_accelerator(c: config_dict.ConfigDict) -> None:
  """Raises one ValueError when a real preset would train on the CPU backend.

  A real preset (`config.REAL_PRESETS`) is meant for a TPU or GPU; on the CPU it is a silent, many-hours
  mistake, usually a jaxlib installed without its accelerator plugin. Allowed: `dry_run` (it sizes the run
  for the mesh it is given, CPU included), `allow_cpu=True` (the CPU on purpose) and the tiny preset.
  """
  if c.preset not in REAL_PRESETS or c.dry_run or c.allow_cpu or jax.default_backend() != "cpu":
    return
  reasons = []
  platforms = os.environ.get("JAX_PLATFORMS", "")
  restricted = bool(platforms) and not set(platforms.lower().split(",")) & {"tpu", "cuda", "gpu", "rocm"}
  if restricted:
    reasons.append(f"JAX_PLATFORMS={platforms} keeps JAX on the CPU (unset it)")
  plugins = installed_plugins()
  if not plugins:
    reasons.append("pip installed the CPU-only jaxlib (requirements.txt pins it; the accelerator builds are extras)")
  elif not restricted:
    reasons.append(f"the accelerator plugin ({', '.join(plugins)}) is installed but JAX found no TPU or GPU for it "
                   f"(see JAX's warnings above)")
  raise ValueError(
      f"preset {c.preset!r} trains a real Qwen2.5 model and needs a TPU or GPU, but JAX runs on the CPU "
      f"({describe_backend()}): {'; '.join(reasons)}. Install the accelerator extra: `pip install -e \".[tpu]\"` "
      f"on a Cloud TPU VM, `pip install -e \".[cuda12]\"` on NVIDIA GPUs (CUDA 12). To train on the CPU anyway "
      f"(slow; for debugging) pass --config.allow_cpu=True")
