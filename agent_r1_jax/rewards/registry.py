"""Reward functions by `data_source`: each example row names its source, the trainer asks for its scorer."""

from __future__ import annotations

import functools
from typing import Callable, Protocol, Sequence

from agent_r1_jax.rewards import multihopqa


class Scorer(Protocol):
  def __call__(self, solution_str: str, ground_truth: str | Sequence[str]) -> dict: ...


_FACTORIES: dict[str, Callable[..., Scorer]] = {}


def register_scorer(data_source: str, factory: Callable[..., Scorer]) -> None:
  """Registers `factory(**options) -> scorer` for a data source.

  Raises:
    ValueError: when another factory is already registered for `data_source` (as for tools and advantage
      estimators: a silent replacement would change the reward of every run that imports both).
  """
  if data_source in _FACTORIES and _FACTORIES[data_source] is not factory:
    raise ValueError(f"a reward function is already registered for data_source {data_source!r}")
  _FACTORIES[data_source] = factory


def _multihopqa_factory(style: str = "paper") -> Scorer:
  if style not in multihopqa.STYLES:
    raise ValueError(f"unknown reward style {style!r}; set algorithm.reward_style to one of {multihopqa.STYLES}")
  return functools.partial(multihopqa.compute_score, style=style)


for _source in ("hotpotqa", "2wikimultihopqa", "musique", "synthetic_multihop", "synthetic_one_hop"):
  register_scorer(_source, _multihopqa_factory)


def known_data_sources() -> list[str]:
  return sorted(_FACTORIES)


def get_scorer(data_source: str, **options) -> Scorer:
  """The scorer for `data_source`, built with `options` (e.g. `style="partial_credit"`).

  Raises:
    ValueError: for a data source with no registered scorer.
  """
  if data_source not in _FACTORIES:
    raise ValueError(f"no reward function registered for data_source {data_source!r}; known: "
                     f"{known_data_sources()} (register one with agent_r1_jax.rewards.register_scorer)")
  return _FACTORIES[data_source](**options)
