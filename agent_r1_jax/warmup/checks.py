"""The supervised warm-up's config fields (`sft.*`: its stages, practice data, optimizer and read check), each checked
with one ValueError naming the field; `config.validate` calls `check_warmup_fields`."""

from __future__ import annotations

from ml_collections import config_dict

from agent_r1_jax.warmup.sft import parse_stages

READING_RELATIONS = ("task", "uniform")


def check_warmup_fields(c: config_dict.ConfigDict) -> None:
  """`sft.logits_chunk_size` always; the rest when the warm-up is enabled."""
  if not isinstance(c.sft.logits_chunk_size, int) or c.sft.logits_chunk_size < 0:
    raise ValueError(f"sft.logits_chunk_size must be an integer >= 0 (0: no chunking), got {c.sft.logits_chunk_size!r}")
  if not isinstance(c.sft.save_every, int) or isinstance(c.sft.save_every, bool) or c.sft.save_every < 0:
    raise ValueError(f"sft.save_every must be an integer >= 0 (optimizer steps between warm-up checkpoints; 0: "
                     f"only at phase ends and on a signal), got {c.sft.save_every!r}")
  if c.sft.enabled:
    parse_stages(c.sft.stages)
    if c.sft.reading_relations not in READING_RELATIONS:
      raise ValueError(f"sft.reading_relations must be one of {READING_RELATIONS}, got {c.sft.reading_relations!r}")
    share = c.sft.reading_uniform_share
    if not isinstance(share, (int, float)) or not 0 <= share <= 1:
      raise ValueError(f"sft.reading_uniform_share must be a number in [0, 1], got {share!r}")
    if share and c.sft.reading_relations != "task":
      raise ValueError(f"sft.reading_uniform_share={share} blends the task's relation mix with the uniform one: "
                       f"set sft.reading_relations='task' or the share to 0")
    for name in ("reading_worlds", "reading_questions", "rag_questions", "multi_hop_worlds", "multi_hop_questions",
                 "length_group"):
      if not isinstance(c.sft[name], int) or c.sft[name] < 0:
        raise ValueError(f"sft.{name} must be an integer >= 0, got {c.sft[name]!r}")
    if not isinstance(c.sft.adam_b2, (int, float)) or not 0 < c.sft.adam_b2 < 1:
      raise ValueError(f"sft.adam_b2 must be a number in (0, 1) (AdamW's second-moment decay), got {c.sft.adam_b2!r}")
    check_read_check_fields(c)


def check_read_check_fields(c: config_dict.ConfigDict) -> None:
  """The warm-up's read check (`sft.min_read_accuracy` and the fields it uses; warmup/read_gate.py)."""
  threshold = c.sft.min_read_accuracy
  if not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
    raise ValueError(f"sft.min_read_accuracy must be a number in [0, 1] (0: no read check), got {threshold!r}")
  if not threshold or c.data.source != "synthetic":  # real data: no check (warmup/read_gate.py)
    return
  if not isinstance(c.sft.read_check_questions, int) or c.sft.read_check_questions < 1:
    raise ValueError(f"sft.read_check_questions must be an integer >= 1 with the read check on, got "
                     f"{c.sft.read_check_questions!r}")
  if not isinstance(c.sft.extra_rounds, int) or c.sft.extra_rounds < 0:
    raise ValueError(f"sft.extra_rounds must be an integer >= 0 with the read check on (0: measure and report "
                     f"the read only), got {c.sft.extra_rounds!r}")
  if not isinstance(c.sft.extra_lr, (int, float)) or not c.sft.extra_lr > 0:
    raise ValueError(f"sft.extra_lr must be a number > 0, got {c.sft.extra_lr!r}")
  if any(stage.is_copy_drill for stage in parse_stages(c.sft.extra_stage)):
    raise ValueError(f"sft.extra_stage={c.sft.extra_stage!r} has a 'copy' stage; the extra rounds train on episodes "
                     f"(e.g. 'all:400:16')")
