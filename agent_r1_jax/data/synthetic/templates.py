"""The synthetic world's question kinds: their relation paths and question templates, and how a relation reads.

`world.py` draws questions from these; the scripted expert phrases its thoughts with `RELATION_PHRASES`; the
evaluation labels its per-type columns with `TYPE_LABELS`.
"""

from __future__ import annotations

HOP_KINDS = ("one_hop", "bridge", "compositional", "four_hop", "comparison")
# The per-type columns of an evaluation (the paper's per-data-set columns in miniature).
TYPE_LABELS = {"one_hop": "one-hop", "bridge": "bridge", "compositional": "3-hop", "four_hop": "4-hop",
               "comparison": "comparison"}

# How the expert reads a relation: "the director of X".
RELATION_PHRASES = {
    "director": "the director of {}",
    "release_year": "the release year of {}",
    "birthplace": "the birthplace of {}",
    "birth_year": "the birth year of {}",
    "university": "the university attended by {}",
    "employer": "the employer of {}",
    "founder": "the founder of {}",
    "founding_year": "the founding year of {}",
    "headquarters": "the headquarters city of {}",
    "origin": "the home city of {}",
    "city": "the city of {}",
    "country": "the country of {}",
    "capital": "the capital of {}",
}


def relation_phrase(relation: str, subject: str, capital: bool = False) -> str:
  """`RELATION_PHRASES[relation]` about `subject` ("the director of X"; "The director of X" with `capital`)."""
  text = RELATION_PHRASES[relation].format(subject)
  return text[0].upper() + text[1:] if capital else text


# (anchor kind, question template, relation path)
PATH_TEMPLATES = {
    "one_hop": (
        ("film", "Who directed {}?", ("director",)),
        ("film", "When was {} released?", ("release_year",)),
        ("band", "Who founded {}?", ("founder",)),
        ("company", "In which city is {} headquartered?", ("headquarters",)),
        ("person", "Where was {} born?", ("birthplace",)),
        ("person", "Which university did {} attend?", ("university",)),
    ),
    "bridge": (
        ("film", "Where was the director of {} born?", ("director", "birthplace")),
        ("film", "Which university did the director of {} attend?", ("director", "university")),
        ("film", "When was the director of {} born?", ("director", "birth_year")),
        ("band", "Where was the founder of {} born?", ("founder", "birthplace")),
        ("band", "In which country was {} formed?", ("origin", "country")),
        ("company", "In which country is {} headquartered?", ("headquarters", "country")),
        ("company", "When was the founder of {} born?", ("founder", "birth_year")),
        ("person", "Who founded the company that {} works for?", ("employer", "founder")),
        ("person", "Where is the company that {} works for headquartered?", ("employer", "headquarters")),
        ("university", "In which country is {}?", ("city", "country")),
    ),
    "compositional": (
        ("film", "In which country was the director of {} born?", ("director", "birthplace", "country")),
        ("film", "Who founded the company that employs the director of {}?", ("director", "employer", "founder")),
        ("band", "In which country was the founder of {} born?", ("founder", "birthplace", "country")),
        ("company", "In which city is the university attended by the founder of {}?",
         ("founder", "university", "city")),
        ("person", "In which country is the company that {} works for headquartered?",
         ("employer", "headquarters", "country")),
        ("person", "In which country is the university attended by {}?", ("university", "city", "country")),
    ),
    "four_hop": (
        ("film", "In which country is the company that employs the director of {} headquartered?",
         ("director", "employer", "headquarters", "country")),
        ("film", "In which country is the university attended by the director of {}?",
         ("director", "university", "city", "country")),
        ("band", "In which country is the university attended by the founder of {}?",
         ("founder", "university", "city", "country")),
        ("company", "In which country is the university attended by the founder of {}?",
         ("founder", "university", "city", "country")),
        ("person", "In which country was the founder of the company that {} works for born?",
         ("employer", "founder", "birthplace", "country")),
    ),
}
# (anchor kind, question template with two slots, year relation, "earlier" or "later")
COMPARISON_TEMPLATES = (
    ("film", "Which film was released earlier, {} or {}?", "release_year", "earlier"),
    ("film", "Which film was released later, {} or {}?", "release_year", "later"),
    ("person", "Who was born earlier, {} or {}?", "birth_year", "earlier"),
    ("company", "Which company was founded earlier, {} or {}?", "founding_year", "earlier"),
    ("band", "Which band was formed later, {} or {}?", "founding_year", "later"),
)
ANCHOR_KINDS = ("person", "film", "band", "company", "university")
