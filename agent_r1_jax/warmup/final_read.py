"""The final read, teacher-forced: does a policy copy out of the last observation the value it answers with?

A scripted-expert episode is fed whole to the policy (one forward pass, teacher forcing) and the final thought,
where the expert writes the value it read, is checked token by token:

    ... tool:       Doc 1 (Title: "Cato Ferro") Cato Ferro was born in Ravport in 1979, studied at ...
        assistant:  <think>The birth year of Cato Ferro is 1979.</think> <answer>1979</answer>
                                                           ^^^^ the read: tokens v_1..v_n of " 1979"

The read counts as right when argmax_v p(v | episode, v_<j) is the expert's v_j for every j = 1..n (the value's
first tokens in the final assistant turn; the <answer> copy after it is not the read). `probe` tallies it per
relation of the final hop. Used by the warm-up's reading check (`warmup.read_gate`) and by the reading-probe
experiment (`experiments.reading_probe`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agent_r1_jax.data.sft import SFTExample

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
