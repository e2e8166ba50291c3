"""Warm-up trajectories for real multi-hop QA: search each supporting title, then answer.

A pretrained instruct model that never writes a `<tool_call>` gives RL no signal for tool use, so a real-data
run can start with a short supervised warm-up on episodes played by this expert. For a row with supporting
titles (t_1, ..., t_n) (HotpotQA: n = 2, in the release's order) and gold answer a it writes

  turn k (k = 1..n):  <think>I need to look up t_k.</think>\\n<tool_call>\\n{"name": "search", "arguments":
                      {"query": "t_k"}}\\n</tool_call>
  (observation: the run's own environment executes the call with the real retriever and frames the result)
  final turn:         <think>I have found what I need.</think>\\n<answer>a</answer><|im_end|>

The observations come from the same environment the RL rollout uses, so the warm-up trains on exactly the
token sequences RL will later see (the action mask keeps the observations out of the loss). An episode is
kept only when it is grounded: every supporting title was retrieved by its search (its passage, which the
corpus renders as `"title"` on the first line, is in the observation), and the answer is in some observation
(or is `yes` / `no`, which comparison questions answer without a span). Rows without supporting titles
(question/answer-only releases) give no episode.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from agent_r1_jax.data.synthetic.expert import Trajectory, tool_call_text

IM_END = "<|im_end|>"
FINAL_THOUGHT = "I have found what I need."


def search_turn(title: str) -> str:
  """The assistant turn that searches for `title`."""
  return f"<think>I need to look up {title}.</think>\n{tool_call_text(title)}"


def answer_turn(answer: str) -> str:
  """The final assistant turn."""
  return f"<think>{FINAL_THOUGHT}</think>\n<answer>{answer}</answer>{IM_END}"


def _retrieved(title: str, observation: str) -> bool:
  return f"\"{title}\"" in observation


def _answer_seen(answer: str, observations: Sequence[str]) -> bool:
  if answer.strip().lower() in ("yes", "no"):
    return True
  return any(answer.lower() in obs.lower() for obs in observations)


def supporting_facts_trajectories(examples: Sequence[Mapping[str, Any]], env: Any, *,
                                  max_searches: int = 4) -> list[Trajectory]:
  """Expert episodes for `examples` (shared example dicts) through `env` (`batch_step(list[str])`).

  All rows search in lock-step, one `env.batch_step` per turn, so a batched retriever sees batched queries.
  Returns the grounded episodes only (see the module docstring), in input order; `Trajectory.grounded` is True
  for each. Rows with no supporting title or more than `max_searches` of them are skipped.
  """
  if getattr(env, "assistant_prefix", ""):
    raise ValueError("the supporting-facts expert writes whole turns; use env.assistant_prefix=''")
  rows = [dict(e) for e in examples if 0 < len(e.get("supporting_titles") or ()) <= max_searches
          and e.get("answers")]
  segments: list[list[tuple[str, bool]]] = [[] for _ in rows]
  grounded = [True] * len(rows)
  for hop in range(max((len(r["supporting_titles"]) for r in rows), default=0)):
    calls = [i for i, r in enumerate(rows) if hop < len(r["supporting_titles"]) and grounded[i]]
    if not calls:
      break
    texts = [search_turn(rows[i]["supporting_titles"][hop]) for i in calls]
    for i, text, (observation, _, active) in zip(calls, texts, env.batch_step(texts)):
      if not active:
        raise RuntimeError(f"the env ended the episode after a tool call of row {rows[i].get('id')}")
      segments[i] += [(text, True), (observation, False)]
      grounded[i] = _retrieved(rows[i]["supporting_titles"][hop], observation)
  out = []
  for row, segs, ok in zip(rows, segments, grounded):
    answer = row["answers"][0]
    if not ok or not _answer_seen(answer, [text for text, is_action in segs if not is_action]):
      continue
    out.append(Trajectory(question=row, segments=segs + [(answer_turn(answer), True)], answer=answer,
                          guessed=False, grounded=True))
  return out
