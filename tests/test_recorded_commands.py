"""Every dry-run command the docs record parses as the CLI parses it: `docs/**/*.cmd` (the command that wrote the
report beside it) and the `python -m agent_r1_jax.train ... --config.dry_run=True` commands in the Markdown docs.

Only the argument parsing runs (absl + ml_collections into fresh flags, the CLI's unknown-override check and the
config's validation), no compile: a record that drifted from the CLI fails here in seconds.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import shlex

import pytest
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags.config_flags import FlagOrderError

from agent_r1_jax.cli_config import unknown_override
from agent_r1_jax.sizing import checks as sizing_checks
from agent_r1_jax.sizing import dry_run
from agent_r1_jax.trainer import config as config_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CLI = "python -m agent_r1_jax.train"
CMD_FILES = sorted(DOCS.rglob("*.cmd"))
_FENCED = re.compile(r"```[^\n]*\n(.*?)```", re.S)
_INLINE = re.compile(r"`([^`]+)`")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")        # a leading VAR=value of a shell command
_PLACEHOLDER = re.compile(r"[:=][A-Z][A-Z_]+(\s|$)")  # a template's slot: --config=...:PRESET, =SLICE


def _markdown_commands() -> list[tuple[str, str]]:
  """(file, command) for each dry-run command in a Markdown file's fenced blocks (backslash continuations joined)
  or inline code spans, leading environment variables dropped; templates with a PRESET-style slot left out."""
  found = []
  for path in sorted([REPO / "README.md", *DOCS.rglob("*.md")]):
    text = path.read_text()
    blocks = [b.replace("\\\n", " ") for b in _FENCED.findall(text)]
    lines = [line for b in blocks for line in b.splitlines()]
    lines += [" ".join(span.split()) for span in _INLINE.findall(_FENCED.sub("", text))]
    for line in lines:
      words = line.split()
      while words and _ENV.match(words[0]):
        words = words[1:]
      command = " ".join(words)
      if command.startswith(CLI) and "--config.dry_run=True" in command and not _PLACEHOLDER.search(command):
        found.append((str(path.relative_to(REPO)), command))
  return found


def _parse(command: str):
  """The config the CLI builds from `command` (absl flags with ml_collections' config flag, as `train` defines
  them), after the CLI's own check for overrides naming no field; raises what the CLI's parsing raises."""
  argv = ["train", *shlex.split(command)[len(CLI.split()):]]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  assert unknown_override(argv) is None
  values(argv)
  return holder.value


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
  monkeypatch.chdir(REPO)  # the commands name configs/ relative to the repository, as the docs run them


def test_every_dry_run_report_has_the_command_that_wrote_it():
  reports = sorted((DOCS / "tpu_dry_run").glob("*.json"))
  assert reports and {p.with_suffix(".cmd") for p in reports} == set(CMD_FILES)


@pytest.mark.parametrize("path", CMD_FILES, ids=lambda p: p.name)
def test_a_recorded_command_parses_to_the_report_it_wrote(path):
  """The command's config is a dry run of the report's topology and parameter count, and its batch splits over
  the report's mesh as the dry run checks it on the slice."""
  report = json.loads(path.with_suffix(".json").read_text())
  c = _parse(path.read_text())
  config_lib.validate(c)
  assert c.dry_run is True and c.dry_run_topology == report["topology"]
  assert dry_run._architecture(c).num_params() == report["num_params"]
  sizing_checks.check_topology_mesh(c, math.prod(report["mesh"].values()))


def test_the_markdown_dry_run_commands_parse():
  commands = _markdown_commands()
  assert commands, "no dry-run command found in the Markdown docs"
  for where, command in commands:
    c = _parse(command)
    config_lib.validate(c)
    topology = re.search(r"--config\.dry_run_topology=(\S+)", command)
    assert c.dry_run is True and c.dry_run_topology == (topology.group(1) if topology else ""), where


def test_an_override_before_the_config_is_refused():
  """The control: the order the records were first written in (`--config.dry_run=True` before `--config=...`) is
  what ml_collections refuses, so the parse above would catch a record that went back to it."""
  words = CMD_FILES[0].read_text().split()
  words.remove("--config.dry_run=True")
  words.insert(len(CLI.split()), "--config.dry_run=True")
  with pytest.raises(FlagOrderError, match="before a value for --config"):
    _parse(" ".join(words))
