"""Data: multi-hop QA preparation and loading, prompts, SFT tokenization, and the synthetic world.

  from agent_r1_jax.data import load_split, example_iterator, render_prompt
  train = load_split(data_dir, "multihopqa", "train")           # prepared with prepare_multihopqa
  it = example_iterator(train, batch_size=32, seed=0)           # grain; it.get_state() / it.set_state()

The synthetic world (the offline default) lives in `agent_r1_jax.data.synthetic`.
"""

from agent_r1_jax.data.loader import example_dataset, example_iterator
from agent_r1_jax.data.prompts import (INSTRUCTION, build_messages, encode_prompt, render_prompt,
                                       search_tool_schema, user_message)
from agent_r1_jax.data.sft import SFTExample, collate, tokenize_segments, tokenize_trajectory
from agent_r1_jax.data.tfds_store import ExampleSource, list_splits, load_split, write_dataset

__all__ = ["INSTRUCTION", "ExampleSource", "SFTExample", "build_messages", "collate", "encode_prompt",
           "example_dataset", "example_iterator", "list_splits", "load_split", "render_prompt",
           "search_tool_schema", "tokenize_segments", "tokenize_trajectory", "user_message", "write_dataset"]
