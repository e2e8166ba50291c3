"""grpo on multi-hop QA with the `wiki_search` tool.

    python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py[:PRESET] --workdir=DIR

PRESET is `tiny` (default: offline synthetic world, CPU-sized), `qwen2.5-0.5b`, `qwen2.5-1.5b` or
`qwen2.5-3b` (the paper's setting; needs --config.model.path and prepared data). Field reference:
agent_r1_jax/trainer/config.py.
"""

from agent_r1_jax.trainer.config import base_config


def get_config(preset: str = ""):
  return base_config("grpo", preset or None)
