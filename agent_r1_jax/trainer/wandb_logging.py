"""Weights & Biases logging: a sink the loop feeds beside `metrics.jsonl` (off unless a project is named).

`--config.logging.wandb_project=NAME` (with `wandb_entity`, `wandb_run_name`, `wandb_tags`) sends a run to W&B:

  config   the resolved run config, the same JSON as `<workdir>/config.json`;
  history  every row `MetricsWriter.write` returns, at W&B step = the RL step (the same keys and values as the
           line of `metrics.jsonl`; a non-finite value, `null` there, is `null` here too);
  summary  `summary.json`'s `before_rl` / `after_rl` held-out evaluations and `curves.png` as the image `curves`
           (one figure of the whole run: in the summary, so it needs no history step after the last one).

Only the chief process logs (as only it writes `metrics.jsonl`). The package is an optional extra
(`pip install -e ".[wandb]"`): `check_installed` runs at start-up, before anything is built or compiled, so a
missing package is one error naming the extra rather than a crash after the warm-up.

Resuming. `<workdir>/wandb_run.json` keeps the W&B run's id and the last step sent to it. A rerun that resumes
from a checkpoint resumes that W&B run (`id=`, `resume="allow"`); a run with no checkpoint yet (a fresh start)
starts a new W&B run, as `metrics.jsonl` starts empty. W&B's step must only increase, and a run resumed from
checkpoint k replays steps k+1.. that the interrupted run may have sent already: those are not sent again. The
replay is exact (the same data and randomness, tests/test_export_resume.py), so what W&B kept for them is what
`metrics.jsonl` holds again, wall-clock timings aside. With `WANDB_MODE=offline` each attempt writes its own
`offline-run-*` folder (under `WANDB_DIR`, default `./wandb`) with the same run id; `wandb sync` uploads them
into the one run.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from typing import TYPE_CHECKING, Any, Mapping

from ml_collections import config_dict

if TYPE_CHECKING:
  from etils import epath  # a bucket workdir's path type (agent_r1_jax/workdir.py)

STATE_FILE = "wandb_run.json"  # {"id": the W&B run id, "last_step": the last RL step sent to it}
INSTALL = 'pip install -e ".[wandb]"'


def enabled(c: config_dict.ConfigDict) -> bool:
  """Whether the config asks for W&B logging (a non-empty `logging.wandb_project`)."""
  return bool(c.logging.wandb_project)


def import_wandb(c: config_dict.ConfigDict):
  """The `wandb` module, or one ValueError naming the extra that installs it."""
  try:
    import wandb  # pylint: disable=import-outside-toplevel  (an optional extra)
  except ImportError as e:
    raise ValueError(f"logging.wandb_project={c.logging.wandb_project!r} logs the run to Weights & Biases, but "
                     f"the wandb package is not installed: install the extra with `{INSTALL}` (or drop "
                     f"--config.logging.wandb_project)") from e
  return wandb


def check_logging_fields(c: config_dict.ConfigDict) -> None:
  """The `logging` section's W&B fields, checked by `config.validate`: tags that parse (`wandb_tags`), and no
  entity, run name or tag set without a project (they would be ignored silently). The other fields are typed
  `str` placeholders, which ml_collections keeps strings or None."""
  tags = wandb_tags(c)
  if not c.logging.wandb_project:
    for name, value in (("wandb_entity", c.logging.wandb_entity), ("wandb_run_name", c.logging.wandb_run_name),
                        ("wandb_tags", tags)):
      if value:
        raise ValueError(f"logging.{name}={c.logging[name]!r} is read only when W&B logging is on: add "
                         f"--config.logging.wandb_project=NAME (or unset it)")


def wandb_tags(c: config_dict.ConfigDict) -> tuple[str, ...]:
  """`logging.wandb_tags` as a tuple of tags: from a tuple or list of strings, or one comma-separated string
  (every string is split at commas, blanks around a tag dropped, empty pieces skipped). Raises one ValueError
  naming what to change for anything else, or for a tag W&B refuses (over 64 characters)."""
  value = c.logging.wandb_tags
  if value is None:
    return ()
  if isinstance(value, str):
    value = (value,)
  if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
    raise ValueError(f"logging.wandb_tags must be a tuple or list of strings or one comma-separated string "
                     f"(e.g. --config.logging.wandb_tags=grpo,tiny), got {value!r}")
  tags = tuple(tag.strip() for entry in value for tag in entry.split(",") if tag.strip())
  too_long = [tag for tag in tags if len(tag) > 64]
  if too_long:
    raise ValueError(f"logging.wandb_tags: W&B tags have at most 64 characters; shorten {too_long}")
  return tags


def check_installed(c: config_dict.ConfigDict) -> None:
  """Raises `import_wandb`'s error when W&B logging is on and the package is missing; called at start-up on every
  process, so no process goes on to build and compile while the chief stops."""
  if enabled(c):
    import_wandb(c)


class WandbSink:
  """One W&B run of one training run: `log` each metrics row, then `finish` (or `preempted`).

  Build it with `WandbSink.start`; the loop calls it where it calls `MetricsWriter`.
  """

  def __init__(self, run, state_path, last_step: int):
    """`run`: the started `wandb` run; `state_path`: where its id and `last_step` (the last step it holds) are
    kept."""
    self._run = run
    self._state_path = state_path
    self._last_step = last_step

  @classmethod
  def start(cls, c: config_dict.ConfigDict, workdir, *, resumed: bool) -> "WandbSink":
    """Starts (or, when `resumed` from a checkpoint, resumes) the workdir's W&B run with the run's config.

    `workdir`: the run directory, a `pathlib.Path` or an `etils.epath.Path` (a bucket's), where the state file
    goes.
    """
    wandb = import_wandb(c)
    state_path = workdir / STATE_FILE
    state = json.loads(state_path.read_text()) if resumed and state_path.exists() else {}
    run = wandb.init(project=c.logging.wandb_project, entity=c.logging.wandb_entity or None,
                     name=c.logging.wandb_run_name or None, tags=list(wandb_tags(c)),
                     config=json.loads(c.to_json_best_effort()), id=state.get("id"), resume="allow")
    sink = cls(run, state_path, int(state.get("last_step", 0)))
    sink._save_state()
    if sink._last_step:
      print(f"W&B run {run.id} resumed; it holds steps up to {sink._last_step}, later ones are logged", flush=True)
    return sink

  def _save_state(self) -> None:
    """Writes the run id and last step through a temporary file, so an interrupted write leaves the old state."""
    tmp = self._state_path.with_name(STATE_FILE + ".tmp")
    tmp.write_text(json.dumps({"id": self._run.id, "last_step": self._last_step}) + "\n")
    tmp.replace(self._state_path)

  def log(self, row: Mapping[str, Any]) -> None:
    """Sends one row of `MetricsWriter.write` (its `step` and Python scalars) at W&B step = its RL step, unless
    the W&B run already holds that step (a replay after resuming)."""
    step = int(row["step"])
    if step <= self._last_step:
      return
    self._run.log({k: v for k, v in row.items() if k != "step"}, step=step)
    self._last_step = step
    self._save_state()

  def finish(self, summary: Mapping[str, Any], curves: pathlib.Path | epath.Path | None) -> None:
    """Puts `summary` (summary.json's content) and the `curves` PNG (if one was drawn) in the run summary, and
    closes the run.

    The PNG is read through its path object and handed to wandb as a local copy: `wandb.Image` opens local files
    only, and the workdir may be a bucket (`gs://`). Setting the summary copies it into the run's media at once.
    """
    import wandb  # pylint: disable=import-outside-toplevel  (present: `start` imported it)
    self._run.summary.update(dict(summary))
    if curves is not None:
      with tempfile.TemporaryDirectory() as tmp:
        local = pathlib.Path(tmp) / "curves.png"
        local.write_bytes(curves.read_bytes())
        self._run.summary["curves"] = wandb.Image(str(local))
    self._run.finish()

  def preempted(self) -> None:
    """Closes the run marked as preempted (SIGTERM: the loop saved a checkpoint and a rerun resumes it)."""
    self._run.mark_preempting()
    self._run.finish()
