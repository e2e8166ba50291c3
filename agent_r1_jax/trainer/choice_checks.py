"""The trainer's config fields whose value must be one of a fixed set of names or a registry's entries (`algorithm.*`,
`data.*`, `tool.*`), checked by name; the learner's own choices are `learner.checks`'.

`config.validate` calls `check_choice_fields` first, so a mistyped algorithm, estimator, mask, tool or data source
is one ValueError naming the field and its valid values before anything is built.
"""

from __future__ import annotations

from ml_collections import config_dict

from agent_r1_jax import rl
from agent_r1_jax.data.sources import DATA_SOURCES
from agent_r1_jax.learner.checks import check_choice
from agent_r1_jax.rewards import known_data_sources
from agent_r1_jax.rewards.multihopqa import STYLES as REWARD_STYLES

MASK_CHOICES = ("action", "response")
TASK_SOURCES = ("synthetic", "multihopqa")


def check_choice_fields(c: config_dict.ConfigDict) -> None:
  """Every field whose value names a registry entry or a fixed choice, each against its valid names."""
  # Imported here: the tools import bm25s, which runs a JAX computation at import time, and this module is
  # loaded (with the config file) before `jax.distributed.initialize`, which must precede any backend.
  from agent_r1_jax.tools import registered_tools  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools.python_tool import ISOLATION_MODES  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools.sandbox import GUARANTEES  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools.wiki_search import RETRIEVER_BACKENDS  # pylint: disable=import-outside-toplevel
  for name, value, choices in (
      ("algorithm.loss_mask", c.algorithm.loss_mask, MASK_CHOICES),
      ("algorithm.advantage_mask", c.algorithm.advantage_mask, MASK_CHOICES),
      ("algorithm.adv_estimator", c.algorithm.adv_estimator, rl.ADVANTAGE_ESTIMATORS),
      ("algorithm.kl_penalty", c.algorithm.kl_penalty, rl.KL_PENALTIES),
      ("algorithm.kl_ctrl", c.algorithm.kl_ctrl, rl.KL_CONTROLLERS),
      ("algorithm.reward_style", c.algorithm.reward_style, REWARD_STYLES),
      ("data.source", c.data.source, TASK_SOURCES),
      ("tool.retriever", c.tool.retriever, RETRIEVER_BACKENDS),
      ("tool.python.isolation", c.tool.python.isolation, ISOLATION_MODES)):
    check_choice(name, value, choices)
  for tool in c.tool.tools:
    check_choice("every entry of tool.tools", tool, registered_tools())
  for guarantee in filter(None, (name.strip() for name in c.tool.python.accept_missing.split(","))):
    check_choice("every comma-separated entry of tool.python.accept_missing", guarantee, GUARANTEES)
  if c.data.source == "multihopqa":
    for source in c.data.val_sources:
      check_choice("every entry of data.val_sources", source, DATA_SOURCES)
    unscored = sorted(set(DATA_SOURCES) - set(known_data_sources()))
    if unscored:
      raise ValueError(f"no reward function is registered for data source(s) {unscored}")
