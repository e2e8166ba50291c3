"""The docs are current and whole: docs/configuration.md is what docs/make_config_reference.py generates; the README
stays short (a table of contents, <= 350 lines), its links and the paths the docs name exist, its Quick start is
what CI runs; LICENSE and CITATION.cff agree with pyproject.toml."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reference():
  spec = importlib.util.spec_from_file_location("make_config_reference", REPO / "docs" / "make_config_reference.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_configuration_reference_is_current(reference):
  assert (REPO / "docs" / "configuration.md").read_text() == reference.generate(), (
      "docs/configuration.md is stale: run `python docs/make_config_reference.py`")


def test_every_config_field_is_in_the_reference_with_its_default(reference):
  from agent_r1_jax.trainer import config as config_lib
  text = (REPO / "docs" / "configuration.md").read_text()
  flat = reference.flatten(config_lib.base_config("grpo", "tiny"))
  assert len(flat) > 100
  for field, value in flat.items():
    assert f"| `{field}` |" in text, field
  assert "| `rollout.max_turns` | int | `3` |" in text  # the tiny preset's value, not the paper's 5


def test_a_field_without_a_description_fails_the_generator(reference, monkeypatch):
  notes = dict(reference.FIELD_NOTES)
  del notes["rollout.top_k"]  # no comment beside it in config.py
  monkeypatch.setattr(reference, "FIELD_NOTES", notes)
  with pytest.raises(SystemExit, match="rollout.top_k"):
    reference.generate()
  monkeypatch.setattr(reference, "FIELD_NOTES", dict(reference.FIELD_NOTES, **{"rollout.gone": "x"}))
  with pytest.raises(SystemExit, match="rollout.gone"):
    reference.generate()


def test_comments_are_read_by_the_tokenizer_not_by_text_search(reference):
  source = ('  # Above, first line.\n  # Above, second line.\n  c.a.b = "x # not a comment"  # trailing\n\n'
            '  c.a.c = 1\n  # ---- section ----\n  c.d = 2  # d\n')
  assert reference.source_descriptions(source) == {
      "a.b": "Above, first line. Above, second line. trailing", "d": "d"}


def test_the_reference_does_not_depend_on_where_the_checkout_lives(reference, monkeypatch, tmp_path):
  """Presets point into the shared-data folder by absolute path; the reference writes it relative."""
  here = reference.generate()
  monkeypatch.setenv("AGENT_R1_SHARED_DATA", str(tmp_path / "elsewhere" / "data"))
  assert reference.generate() == here
  assert "`'../shared/data/smollm2/" in here


# ---- The README and the hand-written docs pages: length, table of contents, links, the commands CI runs.

README = REPO / "README.md"
DOC_PAGES = sorted((REPO / "docs").glob("*.md"))  # the hand-written pages (the measured tables' folders are data)
_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose_lines(path: pathlib.Path) -> list[str]:
  """A markdown file's lines outside fenced code blocks."""
  lines, fenced = [], False
  for line in path.read_text(encoding="utf-8").splitlines():
    if _FENCE.match(line):
      fenced = not fenced
      continue
    if not fenced:
      lines.append(line)
  return lines


def _anchors(path: pathlib.Path) -> set[str]:
  """The anchors GitHub gives a markdown file's headings: lower case, punctuation dropped, spaces to hyphens,
  repeats numbered."""
  seen: dict[str, int] = {}
  anchors = set()
  for line in _prose_lines(path):
    match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
    if not match:
      continue
    slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    anchors.add(slug if count == 0 else f"{slug}-{count}")
  return anchors


def _links(path: pathlib.Path) -> list[str]:
  """Every markdown link target in a file's prose, inline code removed first."""
  text = "\n".join(re.sub(r"`[^`]*`", "", line) for line in _prose_lines(path))
  return _LINK.findall(text)


def test_readme_is_at_most_350_lines():
  lines = README.read_text(encoding="utf-8").splitlines()
  assert len(lines) <= 350, f"README.md has {len(lines)} lines; move detail to docs/ (docs/guide.md, docs/measurements.md)"


def test_readme_table_of_contents_lists_every_section_and_each_anchor_exists():
  lines = _prose_lines(README)
  start = lines.index("## Contents")
  toc = []
  for line in lines[start + 1:]:
    if line.startswith("## "):
      break
    toc += re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)$", line)
  assert toc, "README.md's '## Contents' lists no sections"
  anchors = _anchors(README)
  assert set(toc) <= anchors, f"table-of-contents anchors with no heading: {sorted(set(toc) - anchors)}"
  sections = [re.sub(r"[^\w\- ]", "", line[3:].strip().lower()).replace(" ", "-")
              for line in lines[start + 1:] if line.startswith("## ")]
  assert toc == sections, "the table of contents must list every '## ' section after it, in order"


@pytest.mark.parametrize("path", [README] + DOC_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_to_an_existing_file_and_anchor(path):
  broken = []
  for target in _links(path):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
      continue
    file_part, _, anchor = target.partition("#")
    resolved = (path.parent / file_part).resolve() if file_part else path
    if not resolved.exists():
      broken.append(f"{target}: no such file")
    elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
      broken.append(f"{target}: no heading with anchor #{anchor}")
  assert not broken, f"{path.relative_to(REPO)}: {broken}"


def test_the_readme_quick_start_is_what_ci_runs():
  readme = README.read_text(encoding="utf-8")
  ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
  for command in ("pip install -e . -r requirements-test.txt", "python -m pytest -q -n auto tests"):
    assert command in readme, command
    assert command in ci.replace("pip install --quiet -e .", "pip install -e ."), command
  assert "git clone <this repository's URL> agent_r1_jax" in readme  # no public URL is recorded: a placeholder
  assert "python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py --workdir=" in readme
  assert "python bench/matmul_rate.py" in readme and (REPO / "bench" / "matmul_rate.py").is_file()


def test_module_paths_named_in_the_readme_and_docs_exist():
  """`trainer/loop.py`, `agent_r1_jax/warmup/read_gate.py`, `bench/sft.py`: a path the docs name is a file here
  (relative to the repository, the package or docs/), so a moved module cannot leave the docs pointing at its old
  place."""
  path_re = re.compile(r"(?<![\w/.-])((?:[a-z_][a-z0-9_]*/)+[a-z_][a-z0-9_]*\.(?:py|md|sh|sbatch|ipynb))(?![\w/])")
  missing = []
  for page in [README] + DOC_PAGES:
    for name in set(path_re.findall(page.read_text(encoding="utf-8"))):
      if not any((root / name).exists() for root in (REPO, REPO / "agent_r1_jax", REPO / "docs")):
        missing.append(f"{page.relative_to(REPO)}: {name}")
  assert not missing, missing


def test_readme_wall_times_and_machine_rates_carry_their_date():
  """A paragraph of the README that quotes a wall time, a memory size or a machine's matmul rate says when it was
  measured (the machine is named beside the rate); older figures and their stories live in docs/measurements.md."""
  paragraphs = "\n".join(_prose_lines(README)).split("\n\n")
  undated = [p for p in paragraphs
             if re.search(r"GFLOP/s|\d+(\.\d+)? (minutes|GB)\b|\d h \d+ min", p)
             and not re.search(r"\b20\d\d-\d\d-\d\d\b", p)]
  assert not undated, undated


def test_license_and_citation():
  import tomllib  # pylint: disable=import-outside-toplevel
  import yaml  # pylint: disable=import-outside-toplevel

  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  license_text = (REPO / "LICENSE").read_text(encoding="utf-8")
  assert project["license"] == "Apache-2.0"
  assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
  assert "END OF TERMS AND CONDITIONS" in license_text
  cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
  assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
  assert {"message", "title", "authors"} <= set(cff)
  assert str(cff["version"]) == project["version"] and cff["license"] == project["license"]
  paper = next(r for r in cff["references"] if "2511.14460" in r.get("url", ""))
  assert paper["title"] == "Agent-R1: Training Powerful LLM Agents with End-to-End Reinforcement Learning"
  assert paper["type"] == "article" and paper["year"] == 2025 and paper["authors"]
  for person in paper["authors"]:
    assert person.get("family-names") or person.get("name")
