"""Weights & Biases logging (trainer/wandb_logging.py), checked against the files wandb itself writes.

The runs log with `WANDB_MODE=offline`: wandb 0.31 then writes each attempt's records (run with its config,
history rows, summary updates, files, exit) to `WANDB_DIR/wandb/offline-run-*/run-<id>.wandb`, a LevelDB-style
log of `wandb.proto.wandb_internal_pb2.Record` messages that `wandb sync` uploads. `read_offline_runs` parses
those records here, so the tests see what W&B would receive, not what the sink meant to send.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import zlib

import pytest
import wandb
from absl import flags
from ml_collections import config_flags
from wandb.proto import wandb_internal_pb2

from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.trainer import loop, wandb_logging
from agent_r1_jax.trainer.metrics import read_metrics

from test_trainer import micro_config

REPO = pathlib.Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------------------
# Reading an offline run's transaction log.

_BLOCK, _HEADER = 32768, 7  # LevelDB log blocks; every chunk has a 7-byte header (crc32, length, type)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: pathlib.Path):
  """The `Record` messages of one `.wandb` file: a 7-byte file header (`:W&B`, magic 0xBEE1, version 0), then
  chunks in 32 KiB blocks (a block's tail shorter than a header is padding), a record split over FIRST, MIDDLE
  and LAST chunks when it crosses a block; each chunk's crc32 (seeded with its type byte) is checked."""
  data = path.read_bytes()
  assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), data[:7]
  pos, pending = _HEADER, b""
  while pos + _HEADER <= len(data):
    left = _BLOCK - pos % _BLOCK
    if left < _HEADER:
      pos += left
      continue
    crc, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
    chunk = data[pos + _HEADER:pos + _HEADER + length]
    pos += _HEADER + length
    if kind == 0:  # zero padding at the end of the file
      continue
    assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"corrupt chunk at {pos} in {path}"
    pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
    if kind in (_FULL, _LAST):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      yield record


def _item_key(item) -> str:
  return item.key or "/".join(item.nested_key)


@dataclasses.dataclass
class OfflineRun:
  """What one offline attempt recorded."""
  folder: pathlib.Path
  run_id: str
  project: str
  name: str
  tags: list[str]
  start: float
  config: dict
  history: list[dict]          # one dict per history record, `_step` / `_runtime` / `_timestamp` included
  summary: dict
  preempting: bool
  exit_code: int | None


def read_offline_runs(wandb_dir: pathlib.Path) -> list[OfflineRun]:
  """Every offline run under `wandb_dir` (WANDB_DIR), oldest first."""
  runs = []
  for folder in wandb_dir.glob("wandb/offline-run-*"):
    (log,) = folder.glob("run-*.wandb")
    run, config, history, summary, preempting, exit_code = None, {}, [], {}, False, None
    for record in _records(log):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run = record.run
        config.update({_item_key(u): json.loads(u.value_json) for u in run.config.update})
      elif kind == "config":
        config.update({_item_key(u): json.loads(u.value_json) for u in record.config.update})
      elif kind == "history":
        history.append({_item_key(item): json.loads(item.value_json) for item in record.history.item})
      elif kind == "summary":
        summary.update({_item_key(u): json.loads(u.value_json) for u in record.summary.update})
      elif kind == "preempting":
        preempting = True
      elif kind == "exit":
        exit_code = record.exit.exit_code
    assert run is not None, f"no run record in {log}"
    config.pop("_wandb", None)
    runs.append(OfflineRun(folder=folder, run_id=run.run_id, project=run.project, name=run.display_name,
                           tags=list(run.tags), start=run.start_time.ToSeconds() + run.start_time.nanos / 1e9,
                           config=config, history=history, summary=summary, preempting=preempting,
                           exit_code=exit_code))
  return sorted(runs, key=lambda r: r.start)


def _metrics_of(history_row: dict) -> dict:
  """A history row as the line of metrics.jsonl it came from: its step, W&B's own `_` keys dropped."""
  return {"step": history_row["_step"], **{k: v for k, v in history_row.items() if not k.startswith("_")}}


def _untimed(row: dict) -> dict:
  return {k: v for k, v in row.items() if not k.startswith("time/") and "time_" not in k}


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch) -> pathlib.Path:
  """W&B offline, every file it writes (runs, its settings, caches) under a temp folder; returns WANDB_DIR."""
  root = tmp_path / "wandb_home"
  root.mkdir()
  for name, sub in (("WANDB_DIR", "runs"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                    ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
    (root / sub).mkdir()
    monkeypatch.setenv(name, str(root / sub))
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("WANDB_CONSOLE", "off")       # no stdout capture: pytest captures it
  monkeypatch.setenv("WANDB_DISABLE_GIT", "true")  # no git state of this checkout in the run
  monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")  # no system-metrics sampler on a shared machine
  return root / "runs"


# ---------------------------------------------------------------------------------------------------------
# A real training run, interrupted twice.


def test_wandb_run_holds_each_step_once_with_metrics_config_summary_and_curves(tmp_path, offline_wandb,
                                                                                monkeypatch):
  """Five micro GRPO steps (checkpoints at 2 and 4, evaluations at 2, 4, 5) in three attempts: the first dies
  at the start of step 4 (step 3 sent to W&B, its checkpoint never written), the second resumes at 2, replays
  step 3 and is preempted by SIGTERM after step 4, the third resumes at 4 and finishes.

  Defects caught: a step sent twice or skipped (the replayed step 3 logged again, an off-by-one in the resume
  point), a metric missing, renamed or changed on the way (every history row must equal its metrics.jsonl line
  value for value, nulls included), a step number other than the RL step, a new W&B run on resume instead of
  the same id, a config other than config.json, summary.json or curves.png missing from the run summary, the
  preemption not reported, and a crashed attempt's state file not covering what it sent."""
  workdir = tmp_path / "run"
  c = micro_config("grpo", **{"trainer.total_steps": 5, "trainer.save_every": 2, "trainer.eval_every": 2,
                              "logging.wandb_project": "agent-r1-tests", "logging.wandb_run_name": "micro-grpo",
                              "logging.wandb_tags": "grpo, micro"})
  original_step = loop.RLTrainer.step

  class Crash(RuntimeError):
    pass

  def crash_before_step_4(self, step):
    if step == 4:
      self.checkpointer.wait()  # what a killed process leaves: step 2's checkpoint, step 3's rows
      self.checkpointer.close()
      raise Crash
    return original_step(self, step)

  monkeypatch.setattr(loop.RLTrainer, "step", crash_before_step_4)
  with pytest.raises(Crash):
    loop.train(c, workdir)
  wandb.finish(exit_code=1)  # what wandb's exit hook does when the process dies
  assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3]
  first_rows = {r["step"]: r for r in read_metrics(workdir)}
  state = json.loads((workdir / wandb_logging.STATE_FILE).read_text())
  assert state["last_step"] == 3

  def sigterm_after_step_4(self, step):
    metrics = original_step(self, step)
    if step == 4:
      os.kill(os.getpid(), signal.SIGTERM)  # the loop finishes step 4, saves and returns preempted
    return metrics

  monkeypatch.setattr(loop.RLTrainer, "step", sigterm_after_step_4)
  second = loop.train(c, workdir)
  assert second.preempted and second.step == 4
  monkeypatch.setattr(loop.RLTrainer, "step", original_step)
  third = loop.train(c, workdir)
  assert not third.preempted and third.step == 5

  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
  runs = read_offline_runs(offline_wandb)
  assert len(runs) == 3, [r.folder.name for r in runs]
  assert {r.run_id for r in runs} == {state["id"]}
  assert json.loads((workdir / wandb_logging.STATE_FILE).read_text()) == {"id": state["id"], "last_step": 5}
  assert [[h["_step"] for h in r.history] for r in runs] == [[1, 2, 3], [4], [5]]

  logged = [_metrics_of(h) for r in runs for h in r.history]
  # Step 3 in W&B is the first attempt's; metrics.jsonl holds the replay's, equal but for the wall-clock times.
  assert logged[2] == first_rows[3]
  assert _untimed(logged[2]) == _untimed(rows[2])
  assert [logged[i] for i in (0, 1, 3, 4)] == [rows[i] for i in (0, 1, 3, 4)]
  assert {k for k in rows[1] if k.startswith("eval/")} and not {k for k in rows[0] if k.startswith("eval/")}

  config_json = json.loads((workdir / "config.json").read_text())
  for run in runs:
    assert run.project == "agent-r1-tests" and run.name == "micro-grpo" and run.tags == ["grpo", "micro"]
    assert run.config == config_json
  assert [r.preempting for r in runs] == [False, True, False]
  assert [r.exit_code for r in runs] == [1, 0, 0]

  summary = json.loads((workdir / "summary.json").read_text())
  final = runs[-1].summary
  assert final["before_rl"] == summary["before_rl"] and final["after_rl"] == summary["after_rl"]
  image = final["curves"]
  assert image["_type"] == "image-file"
  logged_png = runs[-1].folder / "files" / image["path"]
  assert logged_png.read_bytes() == (workdir / "curves.png").read_bytes()
  assert image["sha256"] == hashlib.sha256(logged_png.read_bytes()).hexdigest()


def test_default_config_runs_without_importing_wandb(tmp_path, offline_wandb, monkeypatch):
  """W&B is off by default and the package is never imported: with `import wandb` made to fail, a default run
  trains, evaluates and finishes, and leaves no W&B state or run files; a fresh interpreter that loads the CLI
  and the trainer and validates the default config has not imported it."""
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  c = micro_config("grpo", **{"trainer.total_steps": 1})
  assert not c.logging.wandb_project
  result = loop.train(c, tmp_path / "run")
  assert result.step == 1 and not result.preempted
  assert (tmp_path / "run" / "curves.png").exists()
  assert not (tmp_path / "run" / wandb_logging.STATE_FILE).exists()
  assert not list(offline_wandb.iterdir())
  # ... and no module of the trainer imports it when loaded (this process has it from the imports above).
  check = ("import sys; from agent_r1_jax import train; from agent_r1_jax.trainer import config, loop; "
           "config.validate(config.base_config('grpo', 'tiny')); "
           "assert 'wandb' not in sys.modules, 'imported wandb'")
  proc = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]


def test_missing_wandb_is_one_error_naming_the_extra_before_anything_is_prepared(tmp_path, monkeypatch):
  """wandb_project set without the package: `train` (and `RLTrainer`) stop with one ValueError naming the
  extra, before assets are prepared, the workdir is made or any model is built."""
  monkeypatch.setitem(sys.modules, "wandb", None)

  def fail(*args, **kwargs):
    raise AssertionError("reached assets.resolve before the W&B check")

  monkeypatch.setattr(loop.assets, "resolve", fail)
  c = micro_config("grpo", **{"logging.wandb_project": "p"})
  for start in (loop.train, loop.RLTrainer):
    with pytest.raises(ValueError, match=r"wandb package is not installed: install the extra with "
                                         r"`pip install -e \"\.\[wandb\]\"`") as error:
      start(c, tmp_path / "run")
    assert "logging.wandb_project='p'" in str(error.value)
  assert not (tmp_path / "run").exists()
  # A dry run logs nothing, so it does not need the package: the CLI sizes it after `prepare_config` alone.
  with pytest.raises(AssertionError, match="reached assets.resolve"):
    loop.prepare_config(micro_config("grpo", **{"logging.wandb_project": "p", "dry_run": True}))


# ---------------------------------------------------------------------------------------------------------
# The config fields.


def _parse_cli(*overrides: str):
  """The config the training CLI builds from these `--config.*` overrides (absl + ml_collections' flags)."""
  argv = ["train", f"--config={REPO / 'configs' / 'grpo_multihopqa.py'}:tiny", *overrides]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
  values(argv)
  return holder.value


@pytest.mark.parametrize("flag, tags", [
    ("grpo,tiny", ("grpo", "tiny")),
    ("grpo", ("grpo",)),
    ("('a', 'b c')", ("a", "b c")),
    ("['x,y', ' z ']", ("x", "y", "z")),
])
def test_wandb_tags_from_the_command_line(flag, tags):
  c = _parse_cli("--config.logging.wandb_project=p", f"--config.logging.wandb_tags={flag}")
  assert wandb_logging.wandb_tags(c) == tags


def test_bad_logging_fields_name_what_to_change():
  c = config_lib.base_config("grpo", "tiny")
  assert wandb_logging.wandb_tags(c) == () and not wandb_logging.enabled(c)
  wandb_logging.check_logging_fields(c)  # the default passes
  c.logging.wandb_tags = "grpo"
  with pytest.raises(ValueError, match=r"logging.wandb_tags='grpo' is read only when W&B logging is on: add "
                                       r"--config.logging.wandb_project=NAME"):
    config_lib.validate(c)
  c.logging.wandb_tags = ()
  c.logging.wandb_entity = "team"
  with pytest.raises(ValueError, match=r"logging.wandb_entity='team' is read only when W&B logging is on"):
    wandb_logging.check_logging_fields(c)
  c.logging.wandb_project = "p"
  wandb_logging.check_logging_fields(c)
  for bad in (("a", 1), 3, {"a": "b"}):
    c.logging.wandb_tags = bad
    with pytest.raises(ValueError, match=r"logging.wandb_tags must be a tuple or list of strings or one "
                                         r"comma-separated string \(e.g. --config.logging.wandb_tags=grpo,tiny\)"):
      wandb_logging.check_logging_fields(c)
  c.logging.wandb_tags = "ok," + "x" * 65
  with pytest.raises(ValueError, match=r"W&B tags have at most 64 characters; shorten \['x{65}'\]"):
    wandb_logging.check_logging_fields(c)
  c.logging.wandb_tags = "x" * 64
  assert wandb_logging.wandb_tags(c) == ("x" * 64,)
