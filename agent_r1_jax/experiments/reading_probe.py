"""Reading probe: does a synthetic-task policy read the value it answers with? Teacher-forced, per relation.

    python -m agent_r1_jax.experiments.reading_probe --workdir=RUN [--step=0] [--num_questions=200]

Held-out EM after RL mixes three skills: deciding to search, querying right, and reading the answer out of the
last observation, and it costs a whole run. The probe isolates the read (`warmup.final_read`: the scripted
expert's episodes played through the run's own search env, teacher-forced, and whether the policy's argmax
reproduces the value where the final thought writes it). Accuracy is reported per relation of the final hop
on three sets:

    task       the run's world, held-out test questions (what evaluation asks; the expert searches every hop)
    one_hop    one-hop questions of a fresh world no warm-up draws: reading after one observation
    multi_hop  two-hop questions of another such world: the final read after the second observation

`--step=0` probes the policy right after warm-up (every run keeps that checkpoint), so a warm-up recipe can be
judged in a minute before any RL. Writes `reading_probe_step<k>.json` in the workdir and prints a table.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from agent_r1_jax.warmup.final_read import ProbeItem, model_predictor, probe, probe_items

# Offsets of the probe's fresh worlds from the task world's seed, before the reading module adds its own (one-hop
# 1000 + 1, multi-hop 2000 + 1): seeds + 8001 and + 10001, clear of the warm-up's practice worlds (+ 1001..,
# + 2001..) for any world count below 6000.
ONE_HOP_OFFSET = 7000
MULTI_HOP_OFFSET = 8000


def probe_sets(c: Any, task: Any, num_questions: int) -> dict[str, list[ProbeItem]]:
  """The three sets of the module docstring, `num_questions` episodes each at most."""
  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.data.synthetic import expert_trajectories
  from agent_r1_jax.data.synthetic.reading import multi_hop_reading, one_hop_trajectories
  from agent_r1_jax.warmup.data import practice_env_options

  files = task.synthetic_files
  env_options = practice_env_options(c)

  def fresh(offset: int):
    return dataclasses.replace(files.config, seed=files.config.seed + offset)

  trajectories = {
      "task": expert_trajectories(files, "test", env=task.env, limit=num_questions),
      "one_hop": one_hop_trajectories(fresh(ONE_HOP_OFFSET), worlds=1, per_world=num_questions,
                                      env_options=env_options, seed=c.seed),
      "multi_hop": multi_hop_reading(fresh(MULTI_HOP_OFFSET), worlds=1, per_world=num_questions,
                                     env_options=env_options, seed=c.seed),
  }
  return {name: probe_items(task.tokenizer, trajs, task.prompt_tool_schemas, instruction=task.instruction)
          for name, trajs in trajectories.items()}


def markdown(results: Mapping[str, Mapping[str, Sequence[int]]]) -> str:
  """Rows: relations; columns: sets; cells "right/episodes (rate)"."""
  names = list(results)
  relations = sorted({r for counts in results.values() for r in counts})
  lines = ["| relation | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
  totals = {name: [sum(v[0] for v in counts.values()), sum(v[1] for v in counts.values())]
            for name, counts in results.items()}
  for r in relations + ["all"]:
    cells = []
    for name in names:
      right, n = totals[name] if r == "all" else results[name].get(r, (0, 0))
      cells.append(f"{right}/{n} ({right / n:.2f})" if n else "")
    lines.append(f"| {r} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  # pylint: disable=import-outside-toplevel
  from absl import flags

  from agent_r1_jax import workdir as workdir_lib
  from agent_r1_jax.trainer import build_mesh, model_config
  from agent_r1_jax.trainer.actor_checkpoint import read_workdir_config, restore_actor
  from agent_r1_jax.trainer.task import build_task
  from flax import nnx

  del argv
  workdir, step = flags.FLAGS.workdir, flags.FLAGS.step
  c = read_workdir_config(workdir)
  if c.data.source != "synthetic":
    raise ValueError(f"{workdir} trained on data.source={c.data.source!r}: the reading probe needs the synthetic "
                     f"world (its scripted expert plays the episodes)")
  task = build_task(c)
  graphdef, params, step = restore_actor(workdir, c, model_config(c, vocab_size=len(task.tokenizer)),
                                         build_mesh(c), step)
  predict = model_predictor(nnx.merge(graphdef, params))
  results = {name: probe(predict, items) for name, items in probe_sets(c, task, flags.FLAGS.num_questions).items()}
  table = markdown(results)
  print(f"Reading probe, {workdir} step {step} (teacher-forced final read, right/episodes):\n{table}")
  out = workdir_lib.absolute(workdir) / f"reading_probe_step{step}.json"
  out.write_text(json.dumps(dict(step=step, results=results), indent=1))


if __name__ == "__main__":
  from absl import app, flags

  flags.DEFINE_string("workdir", None, "A synthetic-task training run's workdir.", required=True)
  flags.DEFINE_integer("step", 0, "Checkpoint to probe (0: the policy right after warm-up).")
  flags.DEFINE_integer("num_questions", 200, "Episodes per set at most.")
  app.run(main)
