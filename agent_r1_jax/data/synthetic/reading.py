"""One-hop reading episodes in fresh worlds: warm-up practice in reading an observation, with nothing to memorise.

The tiny preset's warm-up imitates the expert on the world's two-hop training questions. Those questions
reach the same intermediate entities again and again, so a small model can answer their second hop from
facts it memorised in warm-up instead of from the passage it just retrieved, and that does not carry over to
held-out questions. The paper's starting point, an instruct model, reads its context instead; this module
gives the from-scratch model that habit. It draws fresh worlds (other seeds: other name combinations and
other facts) and asks one-hop questions about their entities, answered by the same scripted expert through a
search tool over that world's passages:

    user:       Question: What is the birthplace of Kira Voss?
    assistant:  <think>I need the birthplace of Kira Voss.</think> <tool_call>{... "query": "Kira Voss"}</tool_call>
    tool:       Doc 1 (Title: "Kira Voss") Kira Voss was born in Tessstead in 1924, studied at ...
                Doc 2 (Title: "Voss Labs") ...
    assistant:  <think>The birthplace of Kira Voss is Tessstead.</think> <answer>Tessstead</answer>

Every fact there contradicts or is absent from the task's world (each world draws its own), so imitating the
expert means copying the value out of the observation, the skill the second hop of a held-out question needs.
The fresh worlds' questions never enter RL or evaluation.

`naive_rag_examples` gives the same practice in the naive-RAG format (`data.rag`: the question's retrieved
passages in the user turn, one answering turn), which an instruct model also reads without being taught and
the from-scratch model does not. `held_out_one_hop` asks one-hop questions about the task world's held-out
test anchors: an evaluation set where one retrieval with the question suffices, unlike the bridge questions.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any, Iterator, Mapping, Sequence

from agent_r1_jax.data import rag
from agent_r1_jax.data.sft import SFTExample, tokenize_trajectory
from agent_r1_jax.data.synthetic import expert as expert_lib
from agent_r1_jax.data.synthetic.templates import RELATION_PHRASES
from agent_r1_jax.data.synthetic.world import World, WorldConfig, corpus_row, generate_world

DATA_SOURCE = "synthetic_one_hop"  # the rows' data_source (scored like the multi-hop world: EM of the answer)

# Attributes that are facts a question can ask about (`is_capital` is a flag, not a relation).
_ASKABLE = tuple(RELATION_PHRASES)


def fresh_world_configs(config: WorldConfig, count: int, *, num_questions: int = 0,
                        seed_offset: int = 1000) -> list[WorldConfig]:
  """`count` configs of `config`'s size and mix whose seeds (`config.seed + seed_offset + k`) differ from it and
  from each other, each with `num_questions` training questions of `config`'s hop mix."""
  if not isinstance(count, int) or count < 0:
    raise ValueError(f"the number of fresh worlds must be an integer >= 0, got {count!r}")
  return [dataclasses.replace(config, seed=config.seed + seed_offset + k, num_train=num_questions,
                              num_validation=0, num_test=0) for k in range(1, count + 1)]


def task_relation_mix(questions: Sequence[Mapping]) -> dict[str, int]:
  """How often the task's `questions` read each relation, hop by hop: the `relation_mix` of reading practice
  that matches the task (a bridge question "Who founded the company that X works for?" counts one
  `employer` and one `founder`)."""
  return dict(collections.Counter(hop["relation"] for q in questions for hop in q["hops"]))


def relation_fact_counts(world: World) -> dict[str, int]:
  """How many askable facts `world` states per relation: the relation mix of a uniform draw over its facts."""
  return dict(collections.Counter(r for entity in world.entities.values() for r in entity.attrs if r in _ASKABLE))


def blended_relation_mix(task_mix: Mapping[str, float], fact_counts: Mapping[str, float],
                         uniform_share: float) -> dict[str, float]:
  """The task's relation mix with a share of every relation's weight spread as a uniform draw over facts would.

  w_r = (1 - s) * t_r / sum(t) + s * f_r / sum(f), with t the task's hop counts (`task_relation_mix`), f the
  facts per relation (`relation_fact_counts`) and s = `uniform_share` in [0, 1]: s = 0 is the task's mix, s = 1
  the uniform one. For s > 0 every relation the world states gets weight >= s * f_r / sum(f), so relations
  the task reads rarely or never (years of founding or release) are still practised, while those it reads
  most (employers, countries) keep most of their share.
  """
  if not 0.0 <= uniform_share <= 1.0:
    raise ValueError(f"uniform_share must be in [0, 1], got {uniform_share!r}")
  task_total, fact_total = sum(task_mix.values()), sum(fact_counts.values())
  relations = sorted(set(task_mix) | set(fact_counts))
  s = uniform_share
  return {r: (1.0 - s) * task_mix.get(r, 0) / task_total + s * fact_counts.get(r, 0) / fact_total for r in relations}


def relation_counts(weights: Mapping[str, float], available: Mapping[str, int], count: int) -> dict[str, int]:
  """`count` split over the relations in proportion to `weights`, none above its `available` facts.

  n_r = count * w_r / sum(w) where that fits; a relation with too few facts gets all of them and the rest is
  split over the others the same way; fractions go to the largest remainders. Raises if the relations with a
  positive weight state fewer than `count` facts in all.
  """
  open_ = {r: float(w) for r, w in weights.items() if w > 0 and available.get(r, 0) > 0}
  supply = sum(available[r] for r in open_)
  if supply < count:
    raise ValueError(f"asked for {count} one-hop questions over relations {sorted(open_)} but the world states "
                     f"only {supply} such facts")
  out = {r: 0 for r in open_}
  left = count
  ideal: dict[str, float] = {}
  while open_:
    total = sum(open_.values())
    ideal = {r: left * w / total for r, w in open_.items()}
    full = [r for r in open_ if ideal[r] >= available[r]]
    if not full:
      break
    for r in full:
      out[r] = available[r]
      left -= available[r]
      del open_[r]
  floors = {r: int(ideal[r]) for r in open_}
  by_remainder = sorted(open_, key=lambda r: (floors[r] - ideal[r], r))
  for i, r in enumerate(by_remainder):
    out[r] = floors[r] + (1 if i < left - sum(floors.values()) else 0)
  return out


def one_hop_questions(world: World, count: int, *, seed: int = 0, entities: Sequence[str] | None = None,
                      relation_mix: Mapping[str, float] | None = None) -> list[dict]:
  """`count` distinct questions "What is {relation} of {entity}?" over random (entity, relation) pairs.

  Each has the fields the expert and the warm-up read (`id`, `question`, `answers`, `hops` with one step,
  `answer_kind`, `question_entities`) and a dataset row's (`data_source`, `supporting_titles`). `entities`
  restricts the entities asked about (default: all). Without `relation_mix` the pairs are uniform over the
  world's askable facts; with it, relation r gets `relation_counts(relation_mix, ...)[r]` of them (e.g. the
  task's own hop relations: its questions read an employer from a person's passage far more often than a
  uniform draw would practise). Raises if fewer than `count` askable facts exist.
  """
  names = world.entities if entities is None else sorted(set(entities))
  facts = [(name, relation) for name in names for relation in world.entities[name].attrs if relation in _ASKABLE]
  if count > len(facts):
    raise ValueError(f"asked for {count} one-hop questions but the world states only {len(facts)} facts "
                     f"about the entities asked about")
  rng = random.Random(f"one-hop:{world.config.seed}:{seed}")
  if relation_mix is None:
    chosen = rng.sample(facts, count)
  else:
    by_relation = collections.defaultdict(list)
    for fact in facts:
      by_relation[fact[1]].append(fact)
    counts = relation_counts(relation_mix, {r: len(f) for r, f in by_relation.items()}, count)
    chosen = [fact for r in sorted(counts) for fact in rng.sample(by_relation[r], counts[r])]
    rng.shuffle(chosen)
  out = []
  for i, (name, relation) in enumerate(chosen):
    value = world.entities[name].attrs[relation]
    out.append({"id": f"one-hop-{world.config.seed}-{seed}-{i}", "type": "one_hop", "data_source": DATA_SOURCE,
                "question": f"What is {RELATION_PHRASES[relation].format(name)}?", "answers": [value],
                "supporting_titles": [name], "question_entities": [name],
                "hops": [{"query": name, "relation": relation, "value": value}],
                "answer_kind": world.entities[value].kind if value in world.entities else "year"})
  return out


def search_env_over(world: World, *, top_k: int, max_tool_response_length: int, assistant_prefix: str = "",
                    parallel_tool_calls: bool = False) -> Any:
  """A `NousToolEnv` whose `search` tool is BM25 over `world`'s passages (built in memory, nothing written).

  The passages go through the same corpus rows and parser as a world's `corpus.jsonl`, so the index holds
  exactly what `make_search_env` would load from disk.
  """
  # Lazy: these import bm25s, which starts a JAX backend at import; the trainer imports this module.
  from agent_r1_jax.envs import NousToolEnv  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval import BM25Index  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.retrieval.corpus import passages_from_rows  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools import WikiSearchTool  # pylint: disable=import-outside-toplevel
  passages = passages_from_rows(corpus_row(p) for p in world.passages)
  return NousToolEnv([WikiSearchTool(BM25Index(passages), top_k=top_k)],
                     max_tool_response_length=max_tool_response_length, assistant_prefix=assistant_prefix,
                     parallel_tool_calls=parallel_tool_calls)


def _fresh_experts(configs: Sequence[WorldConfig], env_options: dict, seed: int
                   ) -> Iterator[tuple[World, Any, expert_lib.ScriptedExpert]]:
  """(world, its search env, the expert answering through that env) for each world config, generated in turn."""
  for world_config in configs:
    world = generate_world(world_config)
    env = search_env_over(world, **env_options)
    yield world, env, expert_lib.ScriptedExpert(env, {}, seed=seed)


def one_hop_trajectories(config: WorldConfig, *, worlds: int, per_world: int, env_options: dict,
                         seed: int = 0, relation_mix: Mapping[str, float] | None = None
                         ) -> list[expert_lib.Trajectory]:
  """The expert's one-hop episodes in `worlds` fresh worlds of `config`'s size, `per_world` questions each.

  `env_options` are `search_env_over`'s keywords (the run's top-k and observation framing); `relation_mix`
  weighs the relations asked about (`one_hop_questions`).
  """
  out: list[expert_lib.Trajectory] = []
  for world, _, expert in _fresh_experts(fresh_world_configs(config, worlds), env_options, seed):
    out.extend(expert.run(one_hop_questions(world, per_world, seed=seed, relation_mix=relation_mix)))
  return out


def multi_hop_reading(config: WorldConfig, *, worlds: int, per_world: int, env_options: dict,
                      seed: int = 0) -> list[expert_lib.Trajectory]:
  """Reading practice after a second observation: the task's own multi-hop questions in `worlds` fresh worlds.

  Each fresh world asks `per_world` questions of `config`'s hop mix (the task's templates, so its relation
  mix); the expert searches every hop (no guesses). The first assistant turn of each episode is returned as
  context (`is_action` False), so the practice trains every read, up to the final one after the last
  observation, and never the decision whether to search, which stays the task world's:

      user:       Question: Who founded the company that Kira Voss works for?
      context:    <think>I need the employer of Kira Voss.</think> <tool_call>...</tool_call>   (no loss)
      tool:       Doc 1 ... Kira Voss ... is employed by Brinmoor Labs. ...
      assistant:  <think>The employer of Kira Voss is Brinmoor Labs. Now I need the founder of ...</think> ...
      tool:       Doc 1 ... Brinmoor Labs is a company founded by Ilsa Crane in 1950. ...
      assistant:  <think>The founder of Brinmoor Labs is Ilsa Crane.</think> <answer>Ilsa Crane</answer>

  The worlds' seeds differ from the one-hop practice worlds' (`seed_offset` 2000).
  """
  out: list[expert_lib.Trajectory] = []
  configs = fresh_world_configs(config, worlds, num_questions=per_world, seed_offset=2000)
  for world, _, expert in _fresh_experts(configs, env_options, seed):
    for trajectory in expert.run(world.splits["train"]):
      (first, _), *rest = trajectory.segments
      out.append(dataclasses.replace(trajectory, segments=[(first, False), *rest]))
  return out


def naive_rag_examples(tokenizer: Any, config: WorldConfig, *, worlds: int, per_world: int, env_options: dict,
                       seed: int = 0, relation_mix: Mapping[str, float] | None = None) -> list[SFTExample]:
  """One-hop questions of `worlds` fresh worlds in the naive-RAG format, answered in one expert turn.

  The prompt is `data.rag.render_rag_prompt` over the question's top-k passages retrieved through the world's
  search tool (`env_options` as in `one_hop_trajectories`); the response is the expert's final turn
  (`<think>The birthplace of X is V.</think>\n<answer>V</answer><|im_end|>`). Questions whose retrieved
  passages do not contain the answer are dropped: the example must be answerable by reading. `relation_mix`
  weighs the relations asked about (`one_hop_questions`).
  """
  out: list[SFTExample] = []
  for world, env, expert in _fresh_experts(fresh_world_configs(config, worlds), env_options, seed):
    # seed + 1: not the agent episodes' sample
    questions = one_hop_questions(world, per_world, seed=seed + 1, relation_mix=relation_mix)
    for question, passages in zip(questions, rag.retrieve_passages(env, [q["question"] for q in questions])):
      if question["answers"][0] not in passages:
        continue
      prompt = rag.render_rag_prompt(tokenizer, question["question"], passages)
      out.append(tokenize_trajectory(tokenizer, prompt, [(expert.action_texts(question)[-1], True)],
                                     example_id=f"rag-{question['id']}"))
  return out


def held_out_one_hop(world: World, test_questions: Sequence[dict], *, seed: int = 0) -> list[dict]:
  """One one-hop question per test question, about the task world's held-out test anchors.

  The anchors (`question_entities` of the test split) are never named by a training question, so the policy
  has to retrieve their facts; one search with the question finds the anchor's passage, where the answer is.
  """
  anchors = [name for q in test_questions for name in q["question_entities"]]
  return one_hop_questions(world, len(test_questions), seed=seed, entities=anchors)
