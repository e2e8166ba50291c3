"""Warm-up until the policy reads: a check of the final read on validation questions, and extra rounds.

A model trained from scratch learns to copy a value out of an observation as a phase change, and whether the
planned warm-up stages get it there turns on the seed. Of the tiny default's five runs on one machine four
warm-ups read 0.89-1.00 of the held-out final values and one 0.59 (no birth year and no birthplace at all), and
RL does not teach the read afterwards: every run's EM after RL ended within 0.07 of its warm-up's read rate
(docs/experiments.md). So after the planned stages the warm-up measures the read and trains more where it is
missing:

    a = (1/N) sum_i 1[argmax_v p(v | episode_i, v_<j) = v_ij for every token j of the value v_i]
        over the scripted expert's episodes of the first N = `sft.read_check_questions` validation questions
    rounds = 0
    while a < sft.min_read_accuracy and rounds < sft.extra_rounds:
        train `sft.extra_stage` with a fresh AdamW state and a new schedule (linear warm-up, cosine to 0)
        peaking at `sft.extra_lr`; its batches drawn by the seed (run seed, round)
        rounds += 1; measure a again

The check is teacher-forced (`warmup.final_read`), reads validation questions only (never the test split), and
draws no random numbers: a warm-up that already reads trains exactly as it would without the check. Every
measurement is kept (`ReadCheck`) and lands in the run's summary.

The check needs the synthetic task: its scripted expert writes the read value in the final thought. On real
data (`data.source='multihopqa'`) the supporting-facts expert's final turn reads nothing before its answer, so
there the warm-up runs without the check whatever `sft.min_read_accuracy` says (`applies`), and says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from flax import nnx
from ml_collections import config_dict

from agent_r1_jax.warmup import final_read

# train_round(params, round_index) -> params: one extra round of `sft.extra_stage` (round_index counts from 1).
RoundTrainer = Callable[[nnx.State, int], nnx.State]


@dataclasses.dataclass(frozen=True)
class ReadCheck:
  """One measurement: after `rounds` extra rounds, `right` of `total` validation reads were right;
  `by_relation` splits them by the final hop's relation ({relation: (right, total)})."""
  rounds: int
  right: int
  total: int
  by_relation: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

  @property
  def accuracy(self) -> float:
    return self.right / self.total

  def to_dict(self) -> dict[str, Any]:
    return dict(rounds=self.rounds, right=self.right, total=self.total, accuracy=self.accuracy,
                by_relation={name: list(pair) for name, pair in self.by_relation.items()})

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> ReadCheck:
    """The check `to_dict` wrote (a resumed warm-up's record)."""
    return cls(rounds=int(d["rounds"]), right=int(d["right"]), total=int(d["total"]),
               by_relation={name: (int(right), int(n)) for name, (right, n) in d["by_relation"].items()})

  def relation_summary(self) -> str:
    """"relation right/total" for every relation, worst read first."""
    order = sorted(self.by_relation.items(), key=lambda item: item[1][0] / item[1][1])
    return ", ".join(f"{name} {right}/{total}" for name, (right, total) in order)


def applies(c: config_dict.ConfigDict) -> bool:
  """Whether the warm-up checks the read: a bar above 0 and the synthetic task (see the module docstring)."""
  return bool(c.sft.min_read_accuracy) and c.data.source == "synthetic"


def validation_items(c: config_dict.ConfigDict, task: Any) -> list[final_read.ProbeItem]:
  """The scripted expert's episodes (searching every hop, through the run's own env) for the first
  `sft.read_check_questions` validation questions of the synthetic world, tokenized as the warm-up's."""
  from agent_r1_jax.data.synthetic import expert_trajectories  # pylint: disable=import-outside-toplevel

  trajectories = expert_trajectories(task.synthetic_files, "validation", env=task.env,
                                     limit=c.sft.read_check_questions)
  return final_read.probe_items(task.tokenizer, trajectories, task.prompt_tool_schemas, instruction=task.instruction)


def measure(graphdef: nnx.GraphDef, params: nnx.State, items: list[final_read.ProbeItem], rounds: int) -> ReadCheck:
  """The teacher-forced read accuracy of the policy (`graphdef`, `params`) over `items`."""
  if not items:
    raise ValueError("the read check has no validation episodes (the expert's retrieval missed every value)")
  counts = final_read.probe(final_read.model_predictor(nnx.merge(graphdef, params)), items)
  return ReadCheck(rounds=rounds, right=sum(right for right, _ in counts.values()),
                   total=sum(n for _, n in counts.values()),
                   by_relation={name: (right, n) for name, (right, n) in counts.items()})


def train_until_reading(params: nnx.State, *, check: Callable[[nnx.State, int], ReadCheck], train_round: RoundTrainer,
                        min_accuracy: float, max_rounds: int) -> tuple[nnx.State, list[ReadCheck]]:
  """Extra rounds while `check(params, rounds_done).accuracy` is below `min_accuracy`, at most `max_rounds`.

  Returns the final parameters and every measurement in order, the first made before any extra round.
  """
  checks = [check(params, 0)]
  while checks[-1].accuracy < min_accuracy and len(checks) <= max_rounds:
    params = train_round(params, len(checks))
    checks.append(check(params, len(checks)))
  return params, checks
