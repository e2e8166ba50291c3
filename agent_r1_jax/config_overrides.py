"""The config overrides of a command line checked against the config they override, without absl flags: the CLIs
report a mistyped `--config.a.b=v` in one line (`train._parse_flags`), and a test can check a recorded command
without defining the CLI's global flags."""

from __future__ import annotations

import importlib.util


def unknown_override(argv: list[str]) -> str | None:
  """The first `--config.a.b=v` override naming a field the config does not have, explained; else None."""
  spec = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), None)
  if spec is None:
    return None
  path, _, preset = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_agent_r1_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(preset)
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
