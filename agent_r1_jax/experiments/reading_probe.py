"""Reading probe: does a synthetic-task policy read the value it answers with? Teacher-forced, per relation.

    python -m agent_r1_jax.experiments.reading_probe --workdir=RUN [--step=0] [--num_questions=200]

Held-out EM after RL mixes three skills: deciding to search, querying right, and reading the answer out of the
last observation, and it costs a whole run. The probe isolates the read. It plays the scripted expert's episodes
through the run's own search env and feeds each one whole to the policy (one forward pass, teacher forcing),
then looks at the final thought, where the expert writes the value it read:

    ... tool:       Doc 1 (Title: "Cato Ferro") Cato Ferro was born in Ravport in 1979, studied at ...
        assistant:  <think>The birth year of Cato Ferro is 1979.</think> <answer>1979</answer>
                                                           ^^^^ the read: tokens v_1..v_n of " 1979"

The read counts as right when argmax_v p(v | episode, v_<j) is the expert's v_j for every j = 1..n (the value's
first tokens in the final assistant turn; the <answer> copy after it is not the read). Accuracy is reported per
relation of the final hop on three sets:

    task       the run's world, held-out test questions (what evaluation asks; the expert searches every hop)
    one_hop    one-hop questions of a fresh world no warm-up draws: reading after one observation
    multi_hop  two-hop questions of another such world: the final read after the second observation

`--step=0` probes the policy right after warm-up (every run keeps that checkpoint), so a warm-up recipe can be
judged in a minute before any RL. Writes `reading_probe_step<k>.json` in the workdir and prints a table.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agent_r1_jax.data.sft import SFTExample

# Offsets of the probe's fresh worlds from the task world's seed, before the reading module adds its own (one-hop
# 1000 + 1, multi-hop 2000 + 1): seeds + 8001 and + 10001, clear of the warm-up's practice worlds (+ 1001..,
# + 2001..) for any world count below 6000.
ONE_HOP_OFFSET = 7000
MULTI_HOP_OFFSET = 8000

Predictor = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class ProbeItem:
  """One teacher-forced episode: `example` (prompt, response, action mask), the value's token ids `value_ids`
  as the final thought writes it (space-prefixed), and the final hop's `relation`."""
  example: SFTExample
  value_ids: tuple[int, ...]
  relation: str


def final_turn(action_mask: np.ndarray) -> tuple[int, int]:
  """[start, end) of the last run of 1s in `action_mask` [R] (the final assistant turn)."""
  ones = np.flatnonzero(np.asarray(action_mask))
  if not ones.size:
    raise ValueError("the response has no action token")
  end = int(ones[-1]) + 1
  start = end
  while start > 0 and action_mask[start - 1]:
    start -= 1
  return start, end


def read_span(response_ids: np.ndarray, action_mask: np.ndarray, value_ids: Sequence[int]) -> tuple[int, int]:
  """[start, end) in the response of the first occurrence of `value_ids` inside the final assistant turn.

  Example: response "<think>The birth year of X is 1979.</think> <answer>1979</answer>" after an observation
  that also says " 1979": the span is the thought's " 1979" (the observation is not an action; the answer's
  copy comes later). Raises if the final turn never writes the value.
  """
  start, end = final_turn(action_mask)
  value = list(value_ids)
  n = len(value)
  for i in range(start, end - n + 1):
    if list(response_ids[i:i + n]) == value:
      return i, i + n
  raise ValueError(f"the final turn does not contain the value tokens {value}")


def read_is_right(predicted: np.ndarray, item: ProbeItem) -> bool:
  """Whether the argmax predictions `predicted` [P + R] (position t predicts token t + 1 of prompt + response)
  reproduce every token of the read span."""
  ex = item.example
  start, end = read_span(ex.response_ids, ex.action_mask, item.value_ids)
  offset = len(ex.prompt_ids) - 1  # response token j is predicted at position P + j - 1
  return all(predicted[offset + j] == ex.response_ids[j] for j in range(start, end))


def probe(predict: Predictor, items: Sequence[ProbeItem], batch_size: int = 16) -> dict[str, list[int]]:
  """{relation: [reads right, episodes]} over `items`, `predict` called on batches of `batch_size` sequences."""
  counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
  for i in range(0, len(items), batch_size):
    batch = items[i:i + batch_size]
    sequences = [np.concatenate([it.example.prompt_ids, it.example.response_ids]) for it in batch]
    for item, predicted in zip(batch, predict(sequences)):
      counts[item.relation][0] += int(read_is_right(predicted, item))
      counts[item.relation][1] += 1
  return dict(sorted(counts.items()))


def model_predictor(model: Any, length_multiple: int = 64) -> Predictor:
  """Argmax next-token predictions of an NNX causal LM: sequences right-padded to a multiple of
  `length_multiple` (one compiled program per padded length; padding after a sequence cannot change a causal
  model's outputs at its real positions), returning each sequence's [T] argmax."""
  from flax import nnx  # pylint: disable=import-outside-toplevel

  graphdef, state = nnx.split(model)

  @jax.jit
  def argmax(state, ids, mask):
    return jnp.argmax(nnx.merge(graphdef, state)(ids, mask), axis=-1)

  def predict(sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
    longest = max(len(s) for s in sequences)
    width = -(-longest // length_multiple) * length_multiple
    ids = np.zeros((len(sequences), width), np.int32)
    mask = np.zeros((len(sequences), width), np.int32)
    for row, s in enumerate(sequences):
      ids[row, :len(s)], mask[row, :len(s)] = s, 1
    out = np.asarray(argmax(state, jnp.asarray(ids), jnp.asarray(mask)))
    return [out[row, :len(s)] for row, s in enumerate(sequences)]

  return predict


def probe_items(tokenizer: Any, trajectories: Iterable[Any], tool_schemas: Sequence[dict], *,
                instruction: str) -> list[ProbeItem]:
  """Tokenized expert episodes (`data.synthetic.sft_examples`, so exactly the warm-up's framing) with each
  one's read value and final relation; episodes whose retrieval missed a value are dropped there."""
  from agent_r1_jax.data.synthetic import sft_examples  # pylint: disable=import-outside-toplevel

  by_id = {str(t.question["id"]): t for t in trajectories}
  items = []
  for ex in sft_examples(tokenizer, list(by_id.values()), tool_schemas, instruction=instruction):
    question = by_id[ex.example_id].question
    value = tuple(tokenizer(" " + question["answers"][0], add_special_tokens=False)["input_ids"])
    items.append(ProbeItem(example=ex, value_ids=value, relation=question["hops"][-1]["relation"]))
  return items


def probe_sets(c: Any, task: Any, num_questions: int) -> dict[str, list[ProbeItem]]:
  """The three sets of the module docstring, `num_questions` episodes each at most."""
  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.data.synthetic import expert_trajectories
  from agent_r1_jax.data.synthetic.reading import multi_hop_reading, one_hop_trajectories
  from agent_r1_jax.trainer.warmup import practice_env_options

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
