"""A scripted expert that answers synthetic-world questions by searching, in the exact NousToolEnv format.

For a question with hops `(q_1, r_1, v_1) ... (q_n, r_n, v_n)` the expert writes

  turn 1:   <think>I need the director of The Crimson Harbor.</think>\\n<tool_call>\\n{"name": "search",
            "arguments": {"query": "The Crimson Harbor"}}\\n</tool_call>
  (observation: the env runs the real search tool and frames the result as a tool turn)
  turn k:   <think>The director of The Crimson Harbor is Arlen Voss. Now I need the birthplace of Arlen
            Voss.</think>\\n<tool_call>...{"query": "Arlen Voss"}...</tool_call>
  final:    <think>The birthplace of Arlen Voss is Morvale.</think>\\n<answer>Morvale</answer><|im_end|>

so every name it writes is either in the question or copied from the observation it just received. With
probability `guess_rate` it instead stops searching and guesses (a random answer of the right kind: a city for a
birthplace, a year, one of the two compared names, ...), which is how an imperfect warm-up policy fails: at each
hop (`guess_at="each_hop"`), or only before its first search (`guess_at="start"`: it either answers from "memory"
without the tool or searches every hop, like an instruct model that under-uses its tools). The observations
come from the environment passed in, i.e. from the same tool and the
same framing the RL rollout uses. Turns are produced for all questions in lock-step, one `env.batch_step` per
turn, so the search backend sees batched queries.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any, Mapping, Sequence

from agent_r1_jax.data.synthetic.templates import relation_phrase

_IM_END = "<|im_end|>"


@dataclasses.dataclass
class Trajectory:
  """One expert episode.

  Attributes:
    question: the question row it answers.
    segments: the response as (text, is_action) pieces in order: assistant turns (True) and environment
      observations (False); their concatenation is the decoded response the rollout would produce.
    answer: the final answer written.
    guessed: whether the expert skipped hops and guessed.
    grounded: whether each value the expert wrote was present in the observation it had just received.
  """
  question: dict
  segments: list[tuple[str, bool]]
  answer: str
  guessed: bool
  grounded: bool

  @property
  def response_text(self) -> str:
    return "".join(text for text, _ in self.segments)

  @property
  def num_tool_calls(self) -> int:
    return sum(1 for text, is_action in self.segments if is_action and "</tool_call>" in text)


def tool_call_text(query: str) -> str:
  """A `search(query)` call in the Nous format the environment parses."""
  call = json.dumps({"name": "search", "arguments": {"query": query}}, ensure_ascii=False)
  return f"<tool_call>\n{call}\n</tool_call>"


class ScriptedExpert:
  """Writes expert trajectories through a tool environment.

  Args:
    env: a `NousToolEnv` (or any env with `batch_step(list[str]) -> list[(observation, successes, active)]`
      and an `assistant_prefix` attribute) whose tools include `search`.
    guess_pools: candidate guesses by answer kind (`city`, `country`, `person`, `university`, `company`,
      `year`, ...); a question of kind `choice` guesses between its two compared entities.
    guess_rate: probability of giving up searching and guessing, at each hop or only at the start.
    guess_at: "each_hop" or "start" (see the module docstring).
    seed: seeds the per-question error/guess draws (each question's draws depend only on seed and its id).
  """

  def __init__(self, env: Any, guess_pools: Mapping[str, Sequence[str]], *, guess_rate: float = 0.0,
               guess_at: str = "each_hop", seed: int = 0):
    if not 0.0 <= guess_rate <= 1.0:
      raise ValueError(f"guess_rate must be in [0, 1], got {guess_rate}")
    if guess_at not in ("each_hop", "start"):
      raise ValueError(f"guess_at must be 'each_hop' or 'start', got {guess_at!r}")
    self.guess_at = guess_at
    self.env = env
    self.guess_pools = {k: list(v) for k, v in guess_pools.items()}
    self.guess_rate = float(guess_rate)
    self.seed = seed
    self.prefix = getattr(env, "assistant_prefix", "") or ""

  def _plan(self, question: Mapping) -> tuple[int, str | None]:
    """How many hops the expert searches before answering, and its guess if it stops early."""
    rng = random.Random(f"{self.seed}:{question['id']}")
    hops = question["hops"]
    for i in range(len(hops) if self.guess_at == "each_hop" else 1):
      if rng.random() < self.guess_rate:
        kind = question.get("answer_kind", "")
        pool = ([h["query"] for h in hops] if kind == "choice" else self.guess_pools.get(kind, []))
        if not pool:
          raise ValueError(f"no guess pool for answer kind {kind!r} (question {question['id']})")
        return i, rng.choice(pool)
    return len(hops), None

  def _turn_text(self, question: Mapping, step: int, searched: int, guess: str | None) -> tuple[str, bool]:
    """The expert's assistant text at `step` (0-based) and whether it is the final turn."""
    hops = question["hops"]
    known = (f"{relation_phrase(hops[step - 1]['relation'], hops[step - 1]['query'], capital=True)} is "
             f"{hops[step - 1]['value']}." if step > 0 else "")
    if step < searched:
      need = f"I need {relation_phrase(hops[step]['relation'], hops[step]['query'])}."
      thought = f"{known} Now {need}" if known else need
      return f"<think>{thought}</think>\n{tool_call_text(hops[step]['query'])}", False
    if guess is not None:
      thought = (f"{known} " if known else "") + f"I will guess {guess}."
      return f"<think>{thought}</think>\n<answer>{guess}</answer>{_IM_END}", True
    thought = known + (f" {question['final_thought']}" if question.get("final_thought") else "")
    return f"<think>{thought}</think>\n<answer>{question['answers'][0]}</answer>{_IM_END}", True

  def action_texts(self, question: Mapping) -> list[str]:
    """The assistant turns of a perfect episode (no env needed; used to train the tokenizer)."""
    n = len(question["hops"])
    return [self._turn_text(question, step, n, None)[0] for step in range(n + 1)]

  def _strip_prefix(self, text: str) -> str:
    """The env already wrote `assistant_prefix` after an observation; the action continues after it."""
    if not self.prefix:
      return text
    if not text.startswith(self.prefix):
      raise ValueError(f"the env forces assistant_prefix {self.prefix!r} but the expert's turn starts with "
                       f"{text[:20]!r}; use assistant_prefix '' or '<think>'")
    return text[len(self.prefix):]

  def run(self, questions: Sequence[Mapping]) -> list[Trajectory]:
    """Plays every question to its final answer; returns trajectories in input order."""
    plans = [self._plan(q) for q in questions]
    segments: list[list[tuple[str, bool]]] = [[] for _ in questions]
    grounded = [True] * len(questions)
    active = list(range(len(questions)))
    step = 0
    while active:
      texts, calls = {}, []
      for i in active:
        text, final = self._turn_text(questions[i], step, *plans[i])
        if step > 0:
          text = self._strip_prefix(text)
        texts[i] = text
        if final:
          segments[i].append((text, True))
        else:
          calls.append(i)
      if calls:
        results = self.env.batch_step([texts[i] for i in calls])
        for i, (observation, _, is_active) in zip(calls, results):
          if not is_active:
            raise RuntimeError(f"the env ended the episode after a tool call of question {questions[i]['id']}")
          segments[i].append((texts[i], True))
          segments[i].append((observation, False))
          if questions[i]["hops"][step]["value"] not in observation:
            grounded[i] = False
      active = calls
      step += 1
    out = []
    for q, (_, guess), segs, ok in zip(questions, plans, segments, grounded):
      final_text = segs[-1][0]
      answer = final_text[final_text.index("<answer>") + len("<answer>"):final_text.index("</answer>")]
      out.append(Trajectory(question=dict(q), segments=segs, answer=answer, guessed=guess is not None,
                            grounded=ok))
    return out
