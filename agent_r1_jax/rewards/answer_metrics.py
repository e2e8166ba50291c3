"""Answer normalisation, exact match and token F1 as the official multi-hop QA evaluations define them.

HotpotQA's `hotpot_evaluate_v1.py` (also used by 2WikiMultihopQA and MuSiQue) normalises an answer string by

  1. lower-casing,
  2. deleting every ASCII punctuation character (`string.punctuation`),
  3. replacing the whole words `a`, `an`, `the` with a space,
  4. collapsing runs of whitespace to one space and stripping the ends.

EM is equality of the normalised strings. Token F1 over the whitespace tokens of the normalised strings is

  P = |pred ∩ gold| / |pred|,  R = |pred ∩ gold| / |gold|,  F1 = 2PR / (P + R)

with multiset intersection, and F1 = 0 when either side normalises to `yes`, `no` or `noanswer` and the two
normalised strings differ (so "yes" never earns partial credit against "no idea"). MuSiQue and 2Wiki score
against every gold alias and keep the best; `*_any` below do that.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Callable, Sequence

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL_ANSWERS = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
  """Lower-case, drop ASCII punctuation, blank out articles, collapse whitespace."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def exact_match(prediction: str, ground_truth: str) -> float:
  """1.0 when the normalised strings are equal, else 0.0."""
  return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction: str, ground_truth: str) -> float:
  """Token-level F1 of the normalised strings (HotpotQA definition, yes/no/noanswer rule included)."""
  pred = normalize_answer(prediction)
  gold = normalize_answer(ground_truth)
  if (pred in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS) and pred != gold:
    return 0.0
  pred_tokens = pred.split()
  gold_tokens = gold.split()
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_tokens)
  recall = num_same / len(gold_tokens)
  return 2.0 * precision * recall / (precision + recall)


def substring_match(prediction: str, ground_truth: str) -> float:
  """1.0 when the normalised gold is a substring of the normalised prediction (and non-empty)."""
  gold = normalize_answer(ground_truth)
  return float(bool(gold) and gold in normalize_answer(prediction))


def as_aliases(ground_truth: str | Sequence[str]) -> list[str]:
  """The gold answer(s) as a non-empty list of strings.

  Raises:
    ValueError: if no gold answer is given or an alias is not a string.
  """
  aliases = [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)
  if not aliases or not all(isinstance(a, str) for a in aliases):
    raise ValueError(
        f"ground_truth must be a string or a non-empty list of strings (the answer and its aliases), "
        f"got {ground_truth!r}")
  return aliases


def best_over_aliases(metric: Callable[[str, str], float], prediction: str,
                      ground_truth: str | Sequence[str]) -> float:
  """max over gold aliases g of metric(prediction, g)."""
  return max(metric(prediction, gold) for gold in as_aliases(ground_truth))


def exact_match_any(prediction: str, ground_truth: str | Sequence[str]) -> float:
  """Exact match against the best gold alias."""
  return best_over_aliases(exact_match, prediction, ground_truth)


def f1_any(prediction: str, ground_truth: str | Sequence[str]) -> float:
  """Token F1 against the best gold alias."""
  return best_over_aliases(f1, prediction, ground_truth)


def substring_match_any(prediction: str, ground_truth: str | Sequence[str]) -> float:
  """Substring accuracy against the best gold alias."""
  return best_over_aliases(substring_match, prediction, ground_truth)
