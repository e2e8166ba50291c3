"""Where the project finds data that does not live in its tree.

`shared_data_dir()` is the read-only folder of public data sets kept beside the project
(`../shared/data` from the repository root) that tests and demos read. It can be moved with the
environment variable `AGENT_R1_SHARED_DATA`. `cache_dir()` is where generated artefacts
(synthetic world, prepared datasets, indexes) are written; `AGENT_R1_CACHE` overrides it.
"""

from __future__ import annotations

import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def shared_data_dir() -> pathlib.Path:
  """The shared public-data folder (may not exist on a user's machine)."""
  override = os.environ.get("AGENT_R1_SHARED_DATA")
  if override:
    return pathlib.Path(override)
  return REPO_ROOT.parent / "shared" / "data"


def cache_dir() -> pathlib.Path:
  """A writable folder for generated artefacts; created on first use."""
  override = os.environ.get("AGENT_R1_CACHE")
  path = pathlib.Path(override) if override else pathlib.Path.home() / ".cache" / "agent_r1_jax"
  path.mkdir(parents=True, exist_ok=True)
  return path
