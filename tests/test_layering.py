"""The package import graph: imports flow downward through the layers of DESIGN's layout, and nothing cycles.

Every `import` / `from ... import` of an `agent_r1_jax` name is read from the source with `ast` (those inside
functions too: a deferred import is still a dependency), mapped to its top-level package, and checked against
`LAYERS`: a package may import its own modules and the packages of lower layers, never one of its own layer or
above. The checker is run first on small trees written in the test, with an upward import and a cycle, so a
checker that finds nothing cannot pass.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "agent_r1_jax"

# Lowest first. A package imports only packages of strictly lower layers (and itself).
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"paths", "workdir", "distributed", "cli_config"},  # plumbing: directories, multi-host start, CLI checks
    {"rl", "rewards", "models", "retrieval"},     # pure math and scoring; the model; retrieval indexes
    {"tools"},                                    # tools (wiki_search -> retrieval)
    {"envs", "sampling"},                         # tool environments; the jitted sampler
    {"data"},                                     # data sets, the synthetic world and its expert
    {"rollout"},                                  # episode drivers and trajectory batches
    {"learner"},                                  # jitted updates, optimizer, micro-batching, building a run
    {"sizing", "warmup"},                         # the dry run; the supervised warm-up
    {"trainer"},                                  # the RL step loop
    {"evaluation"},                               # the paper's Table 3 over any policy
    {"experiments"},                              # multi-run studies
    {"train", "evaluate"},                        # the CLIs
))


def package_imports(root: pathlib.Path) -> dict[str, dict[str, set[str]]]:
  """{package: {imported package: files importing it}} over every module under `root` (the `agent_r1_jax`
  folder); a module directly under `root` is its own package (`train`, `paths`, ...)."""
  graph: dict[str, dict[str, set[str]]] = {}
  for path in sorted(root.rglob("*.py")):
    relative = path.relative_to(root)
    source = relative.parts[0] if len(relative.parts) > 1 else relative.stem
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = ([f"{node.module}.{alias.name}" for alias in node.names] if node.module == root.name
                 else [node.module])
      elif isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      else:
        continue
      for name in names:
        parts = name.split(".")
        if parts[0] == root.name and len(parts) > 1 and parts[1] != source:
          graph.setdefault(source, {}).setdefault(parts[1], set()).add(str(relative))
  return graph


def layering_violations(graph: dict[str, dict[str, set[str]]], layers: tuple[frozenset[str], ...]) -> list[str]:
  """Each import of a package of the importer's own layer or above, and each package no layer names."""
  rank = {package: i for i, layer in enumerate(layers) for package in layer}
  problems = []
  for source, targets in sorted(graph.items()):
    for target, files in sorted(targets.items()):
      unknown = [p for p in (source, target) if p not in rank]
      if unknown:
        problems.append(f"{unknown} not in any layer (imported by {sorted(files)})")
      elif rank[target] >= rank[source]:
        problems.append(f"{source} (layer {rank[source]}) imports {target} (layer {rank[target]}) in {sorted(files)}")
  return problems


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
  """The package cycles of `graph` (each found once from its DFS back edge), by depth-first search."""
  found, state = [], {}  # state: 1 on the current path, 2 finished

  def visit(node: str, path: list[str]) -> None:
    state[node] = 1
    for target in sorted(graph.get(node, {})):
      if state.get(target) == 1:
        found.append(path[path.index(target):] + [target])
      elif target not in state:
        visit(target, path + [target])
    state[node] = 2

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])
  return found


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  root = tmp_path / "agent_r1_jax"
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  return root


def test_the_checker_finds_an_upward_import_a_deferred_one_and_a_cycle(tmp_path):
  """Controls: a model importing the trainer (inside a function), and learner <-> sizing importing each other."""
  root = _tree(tmp_path, {
      "models/qwen2.py": "def f():\n  from agent_r1_jax.trainer import loop\n",
      "trainer/loop.py": "from agent_r1_jax.models import qwen2\n",
      "learner/build.py": "from agent_r1_jax import sizing\n",
      "sizing/dry_run.py": "import agent_r1_jax.learner.build\n",
  })
  graph = package_imports(root)
  assert graph == {"models": {"trainer": {"models/qwen2.py"}}, "trainer": {"models": {"trainer/loop.py"}},
                   "learner": {"sizing": {"learner/build.py"}}, "sizing": {"learner": {"sizing/dry_run.py"}}}
  problems = layering_violations(graph, LAYERS)
  assert any(p.startswith("models (layer 1) imports trainer") for p in problems)
  assert any(p.startswith("learner (layer 6) imports sizing") for p in problems)
  assert not any(p.startswith("trainer") or p.startswith("sizing") for p in problems)  # downward: allowed
  assert sorted(map(tuple, cycles(graph))) == [("learner", "sizing", "learner"), ("models", "trainer", "models")]


def test_the_packages_import_downward_only():
  graph = package_imports(PACKAGE)
  assert {"learner", "sizing", "warmup", "trainer"} <= set(graph)  # the split packages are read
  assert layering_violations(graph, LAYERS) == []


def test_the_package_graph_has_no_cycles():
  assert cycles(package_imports(PACKAGE)) == []


@pytest.mark.parametrize("package", ["learner", "sizing", "warmup"])
def test_the_packages_under_the_trainer_never_import_it(package):
  """The split's point: the learner, the dry run and the warm-up stand without the step loop."""
  assert "trainer" not in package_imports(PACKAGE).get(package, {})
