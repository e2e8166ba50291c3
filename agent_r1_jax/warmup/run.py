"""The supervised warm-up of a run, start to end: its stages on the expert episodes (`warmup.sft`), then, where
the read check applies (`warmup.read_gate`, `sft.min_read_accuracy`), extra rounds while the final read fails.

`warm_up` returns the warmed-up actor parameters and what the run records of it; the step loop makes them the
actor, the reference and the critic's backbone (`trainer.loop`). Its phases (the stages, then each extra round)
number their optimizer steps in one sequence, so a `Progress` (the trainer's warm-up checkpoints) can resume
any of them: every phase asks it where to start (a phase finished before the interruption replays its batch
draws only and returns the saved parameters), and a read check already recorded is read back, not measured.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from flax import nnx
from ml_collections import config_dict

from agent_r1_jax.warmup import data as data_lib
from agent_r1_jax.warmup import read_gate
from agent_r1_jax.warmup import sft as sft_lib

StepLogger = Callable[[int, dict[str, Any]], None]


def warm_up(c: config_dict.ConfigDict, task: Any, graphdef: nnx.GraphDef, params: nnx.State, *,
            log: StepLogger | None, verbose: bool, progress: sft_lib.Progress | None = None
            ) -> tuple[nnx.State, dict[str, Any]]:
  """(warmed-up params, record) after `c.sft.stages` on the episodes of `data.warmup_data` and any extra rounds of
  the read check. The record holds `sft_seconds`, the example counts and, with the check, `sft_read_checks`.
  `log(step, metrics)` receives every optimizer step, numbered across stages and rounds; `verbose` prints;
  `progress` resumes an interrupted warm-up and follows every step (module docstring)."""
  t0 = time.perf_counter()
  tok = task.tokenizer
  stages = sft_lib.parse_stages(c.sft.stages)
  data = data_lib.warmup_data(c, task, stages, verbose=verbose)
  examples, rag_examples, reading_examples = data.examples, data.rag_examples, data.reading_examples

  def train(params, stages, *, lr, seed, first_step):
    return sft_lib.run_sft(
        graphdef, params, examples, stages=stages, drill_examples=data.drill,
        single_turn_examples=rag_examples, reading_examples=reading_examples,
        lr=lr, warmup_steps=c.sft.warmup_steps, weight_decay=c.sft.weight_decay, adam_b2=c.sft.adam_b2,
        prompt_length=data.prompt_length, response_length=c.rollout.max_response_length,
        pad_id=int(tok.pad_token_id), seed=seed, length_multiple=c.trainer.length_multiple or None,
        log_fn=log, logits_chunk_size=c.sft.logits_chunk_size, length_group=c.sft.length_group,
        first_step=first_step, progress=progress)

  record: dict[str, Any] = {}
  params = train(params, stages, lr=c.sft.lr, seed=c.seed, first_step=0)
  if c.sft.min_read_accuracy and not read_gate.applies(c) and verbose:
    print(f"warm-up read check skipped: it reads the synthetic expert's episodes, and data.source="
          f"{c.data.source!r}", flush=True)
  if read_gate.applies(c):
    planned = sum(stage.steps for stage in stages)
    extra = sft_lib.parse_stages(c.sft.extra_stage)
    per_round = sum(stage.steps for stage in extra)

    def train_round(params, index):
      return train(params, extra, lr=c.sft.extra_lr, seed=(c.seed, index),
                   first_step=planned + (index - 1) * per_round)

    items = read_gate.validation_items(c, task)

    def check(params, rounds):
      recorded = rounds < len(progress.checks) if progress is not None else False
      if recorded:
        result = read_gate.ReadCheck.from_dict(progress.checks[rounds])
      else:
        result = read_gate.measure(graphdef, params, items, rounds)
        if progress is not None:
          progress.checks.append(result.to_dict())
      if verbose:
        print(f"\nwarm-up read check after {rounds} extra round(s){' (recorded before the resume)' * recorded}: "
              f"{result.right}/{result.total} validation reads right ({result.accuracy:.3f}; needed "
              f"{c.sft.min_read_accuracy}); by the final hop's relation: {result.relation_summary()}", flush=True)
      return result

    params, checks = read_gate.train_until_reading(params, check=check, train_round=train_round,
                                                   min_accuracy=c.sft.min_read_accuracy,
                                                   max_rounds=c.sft.extra_rounds)
    record["sft_read_checks"] = [done.to_dict() for done in checks]
  record.update(sft_seconds=time.perf_counter() - t0,
                sft_examples=len(examples) + len(rag_examples) + len(reading_examples),
                sft_rag_examples=len(rag_examples), sft_multi_hop_reading_examples=len(reading_examples))
  return params, record
