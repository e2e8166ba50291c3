"""The CLIs' checks of their `--config=FILE[:PRESET]` flag and its `--config.a.b=v` overrides, without absl flags:
a missing file, an unknown preset or a mistyped override is one line naming what exists (`train._parse_flags`), and
a test can check a recorded command without defining the CLI's global flags."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType


def _config_spec(argv: list[str]) -> tuple[str, str] | None:
  """(FILE, PRESET) of the `--config=FILE[:PRESET]` argument (PRESET "" when absent), or None."""
  spec = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
  if spec is None:
    return None
  path, _, preset = spec.partition(":")
  return path, preset


def _load(path: str) -> ModuleType:
  module_spec = importlib.util.spec_from_file_location("_agent_r1_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def config_problem(argv: list[str]) -> str | None:
  """What is wrong with `--config=FILE[:PRESET]`, in one line naming what exists: a file that is not there (the
  config files beside where it was looked for), or a preset its `get_config` refuses (its own message lists the
  presets); None when the config loads."""
  spec = _config_spec(argv)
  if spec is None:
    return None
  path, preset = spec
  if not pathlib.Path(path).is_file():
    folder = pathlib.Path(path).parent if pathlib.Path(path).parent.is_dir() else pathlib.Path("configs")
    found = sorted(str(f) for f in folder.glob("*.py") if f.name != "__init__.py") if folder.is_dir() else []
    return (f"config file {path} not found; the config files in {folder}/ are: {', '.join(found)}" if found else
            f"config file {path} not found (and no {folder}/ here): run from the repository's root, e.g. "
            f"--config=configs/grpo_multihopqa.py")
  try:
    _load(path).get_config(preset)
  except ValueError as e:
    return str(e)
  return None


def unknown_override(argv: list[str]) -> str | None:
  """The first `--config.a.b=v` override naming a field the config does not have, explained; else None."""
  spec = _config_spec(argv)
  if spec is None:
    return None
  path, preset = spec
  config = _load(path).get_config(preset)
  for arg in argv[1:]:
    if not arg.startswith("--config."):
      continue
    dotted = arg[len("--config."):].split("=", 1)[0]
    node, walked = config, []
    for part in dotted.split("."):
      if not hasattr(node, "keys") or part not in node.keys():
        fields = sorted(node.keys()) if hasattr(node, "keys") else []
        where = ".".join(walked) or "the top level"
        return (f"unknown config field {dotted!r} (from {arg}); fields at {where}: {fields}. "
                f"See agent_r1_jax/trainer/config.py")
      node, walked = node[part], walked + [part]
  return None
