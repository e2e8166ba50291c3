"""A seeded fictional encyclopedia and the multi-hop questions asked about it.

Entities of seven kinds (people, cities, countries, films, bands, companies, universities) are linked by
relations (a film's director, a person's birthplace, a city's country, ...). Each entity gets exactly one short
templated passage (1-3 sentences) stating its relations, so every fact a question needs is in the passage of the
entity it is about, and the entity's name is both the passage title and the natural search query.

Questions follow relation paths from an *anchor* entity named verbatim in the question, in the kinds the paper's
data sets mix (HotpotQA: bridge and comparison; 2WikiMultihopQA: compositional and comparison; MuSiQue: 2-4 hops):

* one_hop (1 hop):         "Who directed {film}?"                          film -> person
* bridge (2 hops):         "Where was the director of {film} born?"        film -> person -> city
* compositional (3 hops):  "In which country was the director of {film} born?"  ... -> city -> country
* four_hop (4 hops):       "In which country is the company that employs the director of {film} headquartered?"
* comparison (2 entities): "Which film was released earlier, {a} or {b}?"  both films' years

Namesakes (`namesake_rate`): a share of films get a sequel ("{film} II") and of companies a subsidiary ("{company}
International"), each a full entity with its own facts whose passage names the original in passing. A search
for the original's name then returns both passages, the namesake's often first (it holds the name twice), as
real BM25 returns near-duplicate titles: the reader must take the fact from the passage titled exactly as asked.

Each question stores its gold answer, the titles of its supporting passages, and `hops`: the list of
`(query, relation, value)` steps a perfect searcher takes, which the scripted expert replays. Anchors of each kind
are partitioned into train/validation/test, so no entity named in a held-out question is named in a training
question (intermediate entities reached through the hops may be shared; their passages are the world's facts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from typing import Mapping, Sequence

from agent_r1_jax.data.synthetic import names
from agent_r1_jax.data.synthetic.templates import (ANCHOR_KINDS, COMPARISON_TEMPLATES, HOP_KINDS, PATH_TEMPLATES,
                                                   relation_phrase)

# 2: a comparison's final thought restates the first year and compares in question order (`_comparison_question`).
GENERATOR_VERSION = 2
DATA_SOURCE = "synthetic_multihop"
SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class WorldConfig:
  """Knobs of the generator (all settable from configs).

  Attributes:
    seed: the only source of randomness; same config -> byte-identical world.
    num_*: entity counts per kind (universities are "University of <city>", so at most `num_cities`).
    num_train, num_validation, num_test: questions per split.
    hop_mix: fraction of questions of each kind (`HOP_KINDS`); normalised.
    entity_split: fractions of each anchor kind's entities reserved for train / validation / test questions.
    namesake_rate: fraction of films given a sequel and of companies given a subsidiary (module docstring).
  """
  seed: int = 0
  num_countries: int = 10
  num_cities: int = 60
  num_people: int = 240
  num_films: int = 150
  num_bands: int = 60
  num_companies: int = 80
  num_universities: int = 30
  num_train: int = 1200
  num_validation: int = 200
  num_test: int = 200
  hop_mix: tuple[tuple[str, float], ...] = (("bridge", 0.5), ("compositional", 0.3), ("comparison", 0.2))
  entity_split: tuple[float, float, float] = (0.7, 0.15, 0.15)
  namesake_rate: float = 0.0

  @classmethod
  def create(cls, **kwargs) -> "WorldConfig":
    """Builds a config from plain values (a mapping is accepted for `hop_mix`), validating every knob."""
    if isinstance(kwargs.get("hop_mix"), Mapping):
      kwargs["hop_mix"] = tuple(sorted(kwargs["hop_mix"].items(), key=lambda kv: HOP_KINDS.index(kv[0])
                                       if kv[0] in HOP_KINDS else len(HOP_KINDS)))
    unknown = set(kwargs) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"unknown synthetic-world option(s) {sorted(unknown)}; valid: "
                       f"{[f.name for f in dataclasses.fields(cls)]}")
    if "hop_mix" in kwargs:
      kwargs["hop_mix"] = tuple((str(k), float(v)) for k, v in kwargs["hop_mix"])
    if "entity_split" in kwargs:
      kwargs["entity_split"] = tuple(float(v) for v in kwargs["entity_split"])
    config = cls(**kwargs)
    config.validate()
    return config

  def validate(self) -> None:
    """Raises ValueError naming the knob to change when the config cannot produce a world."""
    mix = dict(self.hop_mix)
    if set(mix) - set(HOP_KINDS) or any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
      raise ValueError(f"hop_mix must map a subset of {HOP_KINDS} to non-negative fractions with a positive "
                       f"sum, got {self.hop_mix}")
    if not 0.0 <= self.namesake_rate <= 1.0:
      raise ValueError(f"namesake_rate must be in [0, 1], got {self.namesake_rate}")
    if len(self.entity_split) != 3 or min(self.entity_split) <= 0:
      raise ValueError(f"entity_split must be three positive fractions (train, validation, test), got "
                       f"{self.entity_split}")
    limits = {
        "num_countries": len(names.COUNTRIES),
        "num_cities": len(names.CITY_PREFIXES) * len(names.CITY_SUFFIXES),
        "num_people": len(names.FIRST_NAMES) * len(names.LAST_NAMES),
        "num_films": len(names.ADJECTIVES) * len(names.FILM_NOUNS),
        "num_bands": len(names.ADJECTIVES) * len(names.BAND_NOUNS),
        "num_companies": len(names.LAST_NAMES) * len(names.COMPANY_SUFFIXES),
        "num_universities": self.num_cities,
    }
    for field, limit in limits.items():
      value = getattr(self, field)
      if not 2 <= value <= limit:
        raise ValueError(f"{field}={value} is out of range: use 2..{limit}")
    if self.num_cities < self.num_countries:
      raise ValueError(f"num_cities ({self.num_cities}) must be >= num_countries ({self.num_countries}): "
                       f"every country has a capital city")
    for field in ("num_train", "num_validation", "num_test"):
      if getattr(self, field) < 0:
        raise ValueError(f"{field} must be >= 0")

  def to_dict(self) -> dict:
    out = {"generator_version": GENERATOR_VERSION, **dataclasses.asdict(self)}
    if not self.namesake_rate:  # worlds without namesakes keep the cache key they had before the option existed
      del out["namesake_rate"]
    return out

  def cache_key(self) -> str:
    """A short stable hash of every generation parameter (and the generator version)."""
    blob = json.dumps(self.to_dict(), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass
class Entity:
  name: str
  kind: str
  attrs: dict[str, str]


@dataclasses.dataclass
class World:
  """A generated world: entities by name, passages (one per entity) and question splits."""
  config: WorldConfig
  entities: dict[str, Entity]
  passages: list[dict[str, str]]  # {"id", "title", "text"}
  splits: dict[str, list[dict]]


def passage_text(entity: Entity) -> str:
  """The 1-3 templated sentences stating an entity's relations."""
  n, a = entity.name, entity.attrs
  if entity.kind == "person":
    # One sentence naming the person once: a query for a company that shares the surname then still ranks
    # the company's own passage first.
    return (f"{n} was born in {a['birthplace']} in {a['birth_year']}, studied at {a['university']} and is "
            f"employed by {a['employer']}.")
  if entity.kind == "city":
    text = f"{n} is a city in {a['country']}."
    return text + f" It is the capital of {a['country']}." if a.get("is_capital") == "yes" else text
  if entity.kind == "country":
    return f"{n} is a country. Its capital is {a['capital']}."
  if entity.kind == "film":
    text = f"{n} is a film directed by {a['director']}. It was released in {a['release_year']}."
    return text + f" It is the sequel to {a['sequel_of']}." if "sequel_of" in a else text
  if entity.kind == "band":
    return f"{n} is a band founded by {a['founder']} in {a['founding_year']}. The band was formed in {a['origin']}."
  if entity.kind == "company":
    text = (f"{n} is a company founded by {a['founder']} in {a['founding_year']}. It is headquartered in "
            f"{a['headquarters']}.")
    return text + f" It is a subsidiary of {a['parent']}." if "parent" in a else text
  if entity.kind == "university":
    return f"{n} is a university in {a['city']}. It was founded in {a['founding_year']}."
  raise ValueError(f"unknown entity kind {entity.kind!r}")


def _unique_names(rng: random.Random, count: int, build, *pools: Sequence[str]) -> list[str]:
  combos = [(x,) for x in pools[0]] if len(pools) == 1 else [(x, y) for x in pools[0] for y in pools[1]]
  return [build(*c) for c in rng.sample(combos, count)]


def _build_entities(config: WorldConfig, rng: random.Random) -> dict[str, list[Entity]]:
  """Samples names, then relations; returns entities grouped by kind, in generation order."""
  countries = _unique_names(rng, config.num_countries, lambda x: x, names.COUNTRIES)
  cities = _unique_names(rng, config.num_cities, lambda p, s: p + s, names.CITY_PREFIXES, names.CITY_SUFFIXES)
  people = _unique_names(rng, config.num_people, lambda f, l: f"{f} {l}", names.FIRST_NAMES, names.LAST_NAMES)
  films = _unique_names(rng, config.num_films, lambda a, n: f"The {a} {n}", names.ADJECTIVES, names.FILM_NOUNS)
  bands = _unique_names(rng, config.num_bands, lambda a, n: f"The {a} {n}", names.ADJECTIVES, names.BAND_NOUNS)
  companies = _unique_names(rng, config.num_companies, lambda l, s: f"{l} {s}", names.LAST_NAMES,
                            names.COMPANY_SUFFIXES)
  universities = [f"University of {c}" for c in rng.sample(cities, config.num_universities)]

  # Every country gets at least one city (its capital); the rest are spread at random.
  city_country = {c: countries[i] for i, c in enumerate(cities[: len(countries)])}
  city_country.update({c: rng.choice(countries) for c in cities[len(countries):]})
  capitals = {countries[i]: cities[i] for i in range(len(countries))}

  out: dict[str, list[Entity]] = {}
  out["country"] = [Entity(k, "country", {"capital": capitals[k]}) for k in countries]
  out["city"] = [Entity(c, "city", {"country": city_country[c],
                                    "is_capital": "yes" if capitals[city_country[c]] == c else "no"})
                 for c in cities]
  out["university"] = [Entity(u, "university", {"city": u[len("University of "):],
                                                "founding_year": str(rng.randint(1700, 1950))})
                       for u in universities]
  r = rng
  out["company"] = [Entity(c, "company", {"founder": r.choice(people), "founding_year": str(r.randint(1850, 1999)),
                                          "headquarters": r.choice(cities)}) for c in companies]
  out["person"] = [Entity(p, "person", {"birthplace": r.choice(cities), "birth_year": str(r.randint(1900, 1979)),
                                        "university": r.choice(universities), "employer": r.choice(companies)})
                   for p in people]
  out["film"] = [Entity(f, "film", {"director": r.choice(people), "release_year": str(r.randint(1940, 2009))})
                 for f in films]
  out["band"] = [Entity(b, "band", {"founder": r.choice(people), "founding_year": str(r.randint(1960, 2009)),
                                    "origin": r.choice(cities)}) for b in bands]
  if config.namesake_rate > 0:
    _add_namesakes(out, config.namesake_rate, random.Random(f"{config.seed}:namesakes"), people, cities)
  return out


def _add_namesakes(out: dict[str, list[Entity]], rate: float, rng: random.Random, people: Sequence[str],
                   cities: Sequence[str]) -> None:
  """Adds a sequel to `rate` of the films and a subsidiary to `rate` of the companies (module docstring). Their
  own draws (a separate generator) leave every other entity of the world as it is without namesakes."""
  films, companies = list(out["film"]), list(out["company"])
  for film in rng.sample(films, round(rate * len(films))):
    year = int(film.attrs["release_year"]) + rng.randint(2, 9)
    out["film"].append(Entity(f"{film.name} II", "film", {"director": rng.choice(people),
                                                          "release_year": str(year), "sequel_of": film.name}))
  for company in rng.sample(companies, round(rate * len(companies))):
    year = int(company.attrs["founding_year"]) + rng.randint(5, 40)
    out["company"].append(Entity(f"{company.name} International", "company", {
        "founder": rng.choice(people), "founding_year": str(year), "headquarters": rng.choice(cities),
        "parent": company.name}))


def _path_question(entities: dict[str, Entity], anchor: str, template: str,
                   relations: Sequence[str], kind: str) -> dict:
  hops, current = [], anchor
  for relation in relations:
    value = entities[current].attrs[relation]
    hops.append({"query": current, "relation": relation, "value": value})
    current = value
  answer_kind = entities[current].kind if current in entities else "year"
  return {"type": kind, "question": template.format(anchor), "answers": [current],
          "supporting_titles": [h["query"] for h in hops], "question_entities": [anchor], "hops": hops,
          "answer_kind": answer_kind}


def _comparison_question(entities: dict[str, Entity], a: str, b: str, template: str, relation: str,
                         direction: str) -> dict:
  """A comparison of `a` and `b` by a year `relation`, and the final thought the expert writes after reading
  b's year (its turn opens "The release year of b is yb."):

      "The release year of a is ya. ya is earlier than yb, so the answer is a."

  The first sentence repeats, word for word, the sentence of the expert's second turn that read a's year, so
  the year comes back by matching that phrase rather than by recalling it from two turns before; the two years
  then stand side by side in a's-then-b's order, and the comparison is one word ("earlier" or "later"). The
  answer is a when that word is the question's direction, else b. (Generator version 1's thought, "{smaller} is
  earlier than {larger}, so the answer is ...", asked for a's year from two turns back and for the years in
  sorted order; its tiny policies mostly wrote the last year read twice. With this one they restate both years
  but still confuse the two names and the comparison word: 0.12-0.16 of comparisons right after RL either way.)
  """
  ya, yb = int(entities[a].attrs[relation]), int(entities[b].attrs[relation])
  word = "earlier" if ya < yb else "later"
  answer = a if word == direction else b
  hops = [{"query": a, "relation": relation, "value": str(ya)},
          {"query": b, "relation": relation, "value": str(yb)}]
  thought = (f"{relation_phrase(relation, a, capital=True)} is {ya}. {ya} is {word} than {yb}, so the answer is "
             f"{answer}.")
  return {"type": "comparison", "question": template.format(a, b), "answers": [answer],
          "supporting_titles": [a, b], "question_entities": [a, b], "hops": hops, "final_thought": thought,
          "answer_kind": "choice"}


def _split_counts(total: int, mix: Mapping[str, float]) -> dict[str, int]:
  """Integer counts per hop kind summing to `total`, proportional to `mix` (largest remainders)."""
  weight = sum(mix.values())
  exact = {k: total * v / weight for k, v in mix.items()}
  counts = {k: int(x) for k, x in exact.items()}
  for k in sorted(exact, key=lambda k: (counts[k] - exact[k], HOP_KINDS.index(k)))[: total - sum(counts.values())]:
    counts[k] += 1
  return counts


def _questions_for_split(entities: dict[str, Entity], anchors: dict[str, list[str]], count: int,
                         mix: Mapping[str, float], rng: random.Random, split: str) -> list[dict]:
  counts = _split_counts(count, mix)
  questions: list[dict] = []
  for kind in HOP_KINDS:
    need = counts.get(kind, 0)
    if not need:
      continue
    if kind == "comparison":
      candidates = []
      templates = [t for t in COMPARISON_TEMPLATES if len(anchors[t[0]]) >= 2]
      seen, attempts = set(), 0
      while len(candidates) < need and attempts < 50 * need + 1000:
        attempts += 1
        anchor_kind, template, relation, direction = rng.choice(templates)
        a, b = rng.sample(anchors[anchor_kind], 2)
        key = (template, frozenset((a, b)))
        if key in seen or entities[a].attrs[relation] == entities[b].attrs[relation]:
          continue
        seen.add(key)
        candidates.append(_comparison_question(entities, a, b, template, relation, direction))
    else:
      candidates = [_path_question(entities, anchor, template, relations, kind)
                    for anchor_kind, template, relations in PATH_TEMPLATES[kind]
                    for anchor in anchors[anchor_kind]]
      rng.shuffle(candidates)
    if len(candidates) < need:
      raise ValueError(
          f"the {split} split needs {need} {kind} questions but its anchor entities only support "
          f"{len(candidates)}: lower num_{split} or that kind's share of hop_mix, or raise the entity counts")
    questions.extend(candidates[:need])
  rng.shuffle(questions)
  for i, q in enumerate(questions):
    q["id"] = f"synthetic-{split}-{i:05d}"
    q["data_source"] = DATA_SOURCE
  return questions


def generate_world(config: WorldConfig | None = None) -> World:
  """Generates the world for `config` (deterministic: a function of the config only)."""
  config = config or WorldConfig()
  config.validate()
  rng = random.Random(config.seed)
  by_kind = _build_entities(config, rng)
  entities = {e.name: e for group in by_kind.values() for e in group}
  if len(entities) != sum(len(g) for g in by_kind.values()):
    raise AssertionError("entity names collided across kinds")  # pools are disjoint; a guard for edits

  ordered = [e for kind in ("country", "city", "university", "company", "person", "film", "band")
             for e in by_kind[kind]]
  rng.shuffle(ordered)
  passages = [{"id": str(i), "title": e.name, "text": passage_text(e)} for i, e in enumerate(ordered)]

  fractions = config.entity_split
  anchors_by_split: dict[str, dict[str, list[str]]] = {s: {} for s in SPLITS}
  for kind in ANCHOR_KINDS:
    pool = [e.name for e in by_kind[kind]]
    rng.shuffle(pool)
    n_train = int(round(len(pool) * fractions[0] / sum(fractions)))
    n_val = int(round(len(pool) * fractions[1] / sum(fractions)))
    anchors_by_split["train"][kind] = pool[:n_train]
    anchors_by_split["validation"][kind] = pool[n_train:n_train + n_val]
    anchors_by_split["test"][kind] = pool[n_train + n_val:]

  mix = {k: v for k, v in config.hop_mix if v > 0}
  counts = {"train": config.num_train, "validation": config.num_validation, "test": config.num_test}
  splits = {s: _questions_for_split(entities, anchors_by_split[s], counts[s], mix, rng, s) for s in SPLITS}
  return World(config=config, entities=entities, passages=passages, splits=splits)


def corpus_row(passage: Mapping[str, str]) -> dict[str, str]:
  """A passage in the Search-R1 / FlashRAG corpus format: {"id", "contents": '"Title"\\ntext'}."""
  return {"id": passage["id"], "contents": f"\"{passage['title']}\"\n{passage['text']}"}


def example_row(question: Mapping) -> dict:
  """A question as a dataset example (the columns every data path shares), with passages as contexts."""
  return {key: question[key] for key in ("id", "data_source", "question", "answers", "supporting_titles")}
