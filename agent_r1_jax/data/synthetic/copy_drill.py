"""Copy drill: the from-scratch model's stand-in for what pretraining gives a real LM, the ability to copy.

A pretrained LM arrives with induction heads: it can repeat a span it has just read, token by token, even a span
it has never seen. Every step of a search episode needs that (the question's entity into the query, a name
from an observation into the next thought and query, the final value into the answer), and the tiny preset's
model starts from random weights. Trained only on the expert's episodes, it copies the first token of a name
and then guesses the rest from the names it memorised ("Dunmore Systems" -> "Dunmore Media"), which is no
use on held-out questions. The drill teaches the copy itself, with nothing to memorise:

    user:       Names: Orrin Penhale; The Silent Otters; Kalvale; Crane Shipping
    assistant:  Orrin Penhale; The Silent Otters; Kalvale; Crane Shipping
                "Orrin Penhale", "The Silent Otters", "Kalvale", "Crane Shipping"<|im_end|>

Names are fresh random combinations of the world's name pools (first x last names, adjective x noun titles,
city prefix x suffix, ...), mostly not entities of the world, and they carry no facts: the only way to lower
the loss is to read the user turn. The second line repeats them in the quoted form a tool call and a passage
title use, whose first token differs from the space-prefixed one (`"Kalvale` vs ` Kalvale`). The loss covers
the assistant turn only, as for every warm-up example.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from agent_r1_jax.data.sft import SFTExample, tokenize_trajectory
from agent_r1_jax.data.synthetic import names

_IM_END = "<|im_end|>"

# Each builder makes one random name of a kind, the way the world generator names its entities.
_NAME_BUILDERS: tuple[Callable[[random.Random], str], ...] = (
    lambda r: f"{r.choice(names.FIRST_NAMES)} {r.choice(names.LAST_NAMES)}",
    lambda r: f"{r.choice(names.FIRST_NAMES)} {r.choice(names.LAST_NAMES)}",
    lambda r: f"{r.choice(names.LAST_NAMES)} {r.choice(names.COMPANY_SUFFIXES)}",
    lambda r: r.choice(names.CITY_PREFIXES) + r.choice(names.CITY_SUFFIXES),
    lambda r: "University of " + r.choice(names.CITY_PREFIXES) + r.choice(names.CITY_SUFFIXES),
    lambda r: f"The {r.choice(names.ADJECTIVES)} {r.choice(names.FILM_NOUNS)}",
    lambda r: f"The {r.choice(names.ADJECTIVES)} {r.choice(names.BAND_NOUNS)}",
    lambda r: r.choice(names.COUNTRIES),
    lambda r: str(r.randint(1700, 2009)),
)


def random_names(rng: random.Random, count: int) -> list[str]:
  """`count` distinct random names of random kinds."""
  out: list[str] = []
  while len(out) < count:
    name = rng.choice(_NAME_BUILDERS)(rng)
    if name not in out:
      out.append(name)
  return out


def drill_texts(items: Sequence[str]) -> tuple[str, str]:
  """(user turn, assistant turn) of one drill example for the names `items`."""
  listed = "; ".join(items)
  quoted = ", ".join(f'"{x}"' for x in items)
  return f"Names: {listed}", f"{listed}\n{quoted}{_IM_END}"


def copy_drill_examples(tokenizer: Any, count: int, *, seed: int = 0, min_names: int = 3, max_names: int = 6,
                        max_response_tokens: int | None = 48,
                        tool_schemas: Sequence[dict] | None = None) -> list[SFTExample]:
  """`count` tokenized drill examples (chat-framed like the task's prompts; loss mask on the assistant turn).

  Args:
    tokenizer: the task's HF tokenizer (its chat template frames the user turn).
    count: number of examples; each lists between `min_names` and `max_names` random names.
    seed: seeds the names (the same seed gives the same examples).
    max_response_tokens: names are dropped from the end of a list (down to `min_names`) until the assistant
      turn fits in this many tokens, so drill batches stay in one small padding bucket (None: no cap).
    tool_schemas: listed in the system turn exactly as the task's prompts list them (None: no `# Tools` block).
  """
  if not 1 <= min_names <= max_names:
    raise ValueError(f"need 1 <= min_names <= max_names, got {min_names}, {max_names}")
  rng = random.Random(f"copy-drill:{seed}")
  out = []
  for i in range(count):
    items = random_names(rng, rng.randint(min_names, max_names))
    while max_response_tokens and len(items) > min_names and len(
        tokenizer(drill_texts(items)[1], add_special_tokens=False)["input_ids"]) > max_response_tokens:
      items = items[:-1]
    user, assistant = drill_texts(items)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                           tools=list(tool_schemas) if tool_schemas else None, tokenize=False,
                                           add_generation_prompt=True)
    out.append(tokenize_trajectory(tokenizer, prompt, [(assistant, True)], example_id=f"copy-drill-{i}"))
  return out
