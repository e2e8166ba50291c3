"""The task a run trains on: tokenizer, tool environment, train examples, evaluation sets, prompt rendering.

Two sources share one code path (examples in the shared schema `id, data_source, question, answers, ...`,
an HF tokenizer with a Qwen2.5-style chat template, a `NousToolEnv` with the `search` tool):

  synthetic   the seeded multi-hop world (`agent_r1_jax.data.synthetic`): generated and cached on first use;
              train = its train split, periodic evaluation = validation, held-out = test.
  multihopqa  datasets prepared by `python -m agent_r1_jax.data.prepare_multihopqa` under
              `data.prepared_dir`; train = the `multihopqa` train mix, evaluation = each `validation_<source>` split.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping, Sequence

from ml_collections import config_dict

from agent_r1_jax.data import prompts, tfds_store
from agent_r1_jax.data.synthetic.builder import prepare_synthetic_world
from agent_r1_jax.data.synthetic.world import WorldConfig

SYNTHETIC_SOURCE = "synthetic_multihop"


@dataclasses.dataclass
class Task:
  """Everything data-shaped a run needs, built once from the config."""
  tokenizer: Any
  env: Any
  train: Sequence[Mapping[str, Any]]
  validation: dict[str, Sequence[Mapping[str, Any]]]   # data source -> examples (periodic evaluation)
  test: dict[str, Sequence[Mapping[str, Any]]]         # data source -> examples (held-out summary)
  synthetic_files: Any = None                          # SyntheticWorldFiles for the synthetic source
  tools_in_prompt: bool = True                         # list the tool schemas in the system turn
  instruction: str = prompts.INSTRUCTION               # the line after `Question: ...` ("" for none)

  @property
  def tool_schemas(self) -> list[dict]:
    return self.env.tool_schemas

  @property
  def prompt_tool_schemas(self) -> list[dict] | None:
    """The schemas the chat template lists in the prompt (None: the system turn has no `# Tools` block)."""
    return self.tool_schemas if self.tools_in_prompt else None

  def render(self, example: Mapping[str, Any]) -> str:
    """The chat-template prompt of one example (system [+ tools] + `Question: ...`, assistant header)."""
    return prompts.render_prompt(self.tokenizer, example["question"], self.prompt_tool_schemas,
                                 instruction=self.instruction)


def _env_from_tools(tools: list, c: config_dict.ConfigDict):
  # Lazy: bm25s starts a JAX backend at import, and the trainer is imported before jax.distributed.initialize.
  from agent_r1_jax.envs import NousToolEnv  # pylint: disable=import-outside-toplevel
  return NousToolEnv(tools, max_tool_response_length=c.env.max_tool_response_length,
                     parallel_tool_calls=c.env.parallel_tool_calls, assistant_prefix=c.env.assistant_prefix)


def tool_options(c: config_dict.ConfigDict, default_corpus: str | None = None) -> dict[str, dict]:
  """Keyword options per tool key for `agent_r1_jax.tools.build_tools`, from the `tool` config section."""
  search = dict(backend=c.tool.retriever, corpus_path=c.tool.corpus_path or default_corpus,
                index_dir=c.tool.index_path, url=c.tool.server_url, encoder_path=c.tool.encoder_path,
                top_k=c.tool.top_k, timeout_s=c.tool.timeout_s)
  return {"wiki_search": {k: v for k, v in search.items() if v is not None}, "python": c.tool.python.to_dict()}


def synthetic_env(c: config_dict.ConfigDict, files: Any):
  """The run's tool environment (`c.tool`, `c.env`) over a prepared synthetic world's corpus."""
  # Lazy: bm25s starts a JAX backend at import, and the trainer is imported before jax.distributed.initialize.
  from agent_r1_jax.tools import build_tools  # pylint: disable=import-outside-toplevel
  return _env_from_tools(build_tools(list(c.tool.tools), tool_options(c, default_corpus=str(files.corpus_path))), c)


def _synthetic_task(c: config_dict.ConfigDict) -> Task:
  files = prepare_synthetic_world(WorldConfig.create(**c.data.synthetic.to_dict()))
  tokenizer = _load_tokenizer(c.model.tokenizer_path or str(files.tokenizer_dir))
  return Task(tokenizer=tokenizer, env=synthetic_env(c, files), train=files.examples("train"),
              validation={SYNTHETIC_SOURCE: files.examples("validation")},
              test={SYNTHETIC_SOURCE: files.examples("test")}, synthetic_files=files,
              tools_in_prompt=c.data.tools_in_prompt, instruction=c.data.instruction)


def _multihopqa_task(c: config_dict.ConfigDict) -> Task:
  # Lazy: bm25s starts a JAX backend at import, and the trainer is imported before jax.distributed.initialize.
  from agent_r1_jax.tools import build_tools  # pylint: disable=import-outside-toplevel

  root = pathlib.Path(c.data.prepared_dir)
  if not root.is_dir():
    raise ValueError(f"data.prepared_dir={root} does not exist; run `python -m agent_r1_jax.data.prepare_multihopqa "
                     f"--out_dir={root} ...` first")
  splits = tfds_store.list_splits(root, "multihopqa")
  prepared = [s.removeprefix("validation_") for s in splits if s.startswith("validation_")]
  missing = [src for src in c.data.val_sources if src not in prepared]
  if missing:
    raise ValueError(f"data.val_sources names {missing}, which {root} has no validation split for (it has "
                     f"{prepared}): set --config.data.val_sources=\"{tuple(prepared)!r}\" or prepare them with "
                     f"`python -m agent_r1_jax.data.prepare_multihopqa`")
  # Evaluation-only directories may hold validation splits alone; training then fails in the loader with a
  # message naming the empty split.
  train = tfds_store.load_split(root, "multihopqa", c.data.train_split) if c.data.train_split in splits else ()
  validation = {src: tfds_store.load_split(root, "multihopqa", f"validation_{src}") for src in c.data.val_sources}
  if not (c.tool.corpus_path or c.tool.index_path or c.tool.server_url):
    raise ValueError("the multihopqa task needs a retriever: set --config.tool.corpus_path (JSONL corpus, e.g. "
                     "from `prepare_multihopqa --corpus_out`), --config.tool.index_path or --config.tool.server_url")
  tools = build_tools(list(c.tool.tools), tool_options(c))
  tokenizer = _load_tokenizer(c.model.tokenizer_path or c.model.path)
  return Task(tokenizer=tokenizer, env=_env_from_tools(tools, c), train=train, validation=validation,
              test=validation, tools_in_prompt=c.data.tools_in_prompt, instruction=c.data.instruction)


def _load_tokenizer(path: str | None):
  import transformers  # pylint: disable=import-outside-toplevel
  if not path or not pathlib.Path(path).is_dir():
    raise ValueError(f"tokenizer directory {path!r} not found; set --config.model.tokenizer_path (or model.path) "
                     f"to a local Hugging Face tokenizer directory")
  return transformers.AutoTokenizer.from_pretrained(path)


def build_task(c: config_dict.ConfigDict) -> Task:
  """The task of `c.data.source`."""
  if c.data.source == "synthetic":
    return _synthetic_task(c)
  return _multihopqa_task(c)
