"""Policies to evaluate: a training workdir's orbax checkpoint or a Hugging Face checkpoint directory.

A `Policy` is what the rollout driver needs from a model: the NNX `graphdef`, its parameters (`nnx.State`),
the architecture, and a factory of samplers for a rollout's limits (built exactly as the trainer builds its
own, `trainer.build_sampler`). Samplers are cached per (graphdef, cache length), so two policies of
one architecture (the trained policy and its base) share compiled programs.

From a workdir only the actor's parameters are read (`trainer.restore_actor`, which `--config.init_from`
uses too); a checkpoint of another architecture raises one `IncompatibleCheckpointError`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

from flax import nnx
from ml_collections import config_dict

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.models import Qwen2Config, load_hf_checkpoint
from agent_r1_jax.rollout import RolloutConfig
from agent_r1_jax.trainer import (IncompatibleCheckpointError, build_sampler, checkpoint_steps, model_config,
                                  read_workdir_config, restore_actor)

__all__ = ["Policy", "SamplerCache", "checkpoint_steps", "hf_policy", "read_workdir_config", "restore_actor",
           "workdir_policy"]

SamplerFactory = Callable[[RolloutConfig], Any]


@dataclasses.dataclass
class Policy:
  """A model the evaluation can roll out.

  Attributes:
    name: a human-readable description (where the weights came from), shown in the outputs.
    graphdef: the model's NNX graph definition.
    params: its parameters (`nnx.State`), passed to every sampler call.
    arch: the architecture.
    make_sampler: `rollout_config -> sampler` obeying the sampling contract (prefill / decode / continue_).
  """
  name: str
  graphdef: Any
  params: Any
  arch: Qwen2Config | None
  make_sampler: SamplerFactory


class SamplerCache:
  """`trainer.build_sampler` per (graphdef, cache length): one sampler, one set of compiled programs."""

  def __init__(self, c: config_dict.ConfigDict, tokenizer: Any, mesh: Any):
    self._c, self._tokenizer, self._mesh = c, tokenizer, mesh
    self._samplers: dict[tuple[Any, int], Any] = {}

  def factory(self, graphdef: Any) -> SamplerFactory:
    def make(rcfg: RolloutConfig) -> Any:
      key = (graphdef, rcfg.cache_length)
      if key not in self._samplers:
        self._samplers[key] = build_sampler(self._c, graphdef, self._tokenizer, rcfg, self._mesh)
      return self._samplers[key]
    return make


def workdir_policy(workdir: str | pathlib.Path, c: config_dict.ConfigDict, tokenizer: Any, mesh: Any,
                   samplers: SamplerCache, step: int | None = None) -> Policy:
  """The trained actor of a workdir (latest checkpoint unless `step`)."""
  arch = model_config(c, vocab_size=len(tokenizer))
  graphdef, params, step = restore_actor(workdir, c, arch, mesh, step)
  return Policy(name=f"{workdir_lib.workdir_path(workdir)} step {step}", graphdef=graphdef, params=params, arch=arch,
                make_sampler=samplers.factory(graphdef))


def hf_policy(path: str | pathlib.Path, c: config_dict.ConfigDict, tokenizer: Any, mesh: Any,
              samplers: SamplerCache) -> Policy:
  """A Hugging Face checkpoint directory; its vocabulary must cover the task's tokenizer (checked first)."""
  if workdir_lib.is_remote(path):
    raise ValueError(f"Hugging Face checkpoint directory {path} is in a bucket: copy it to a local directory "
                     f"(gcloud storage cp -r {path} DIR) and pass that")
  if not pathlib.Path(path).is_dir():
    raise ValueError(f"Hugging Face checkpoint directory {path} not found")
  arch = Qwen2Config.from_pretrained_dir(path)
  if len(tokenizer) > arch.vocab_size:
    raise IncompatibleCheckpointError(
        f"the checkpoint {path} has vocab_size={arch.vocab_size} but the task's tokenizer has {len(tokenizer)} "
        f"tokens; evaluate it with the tokenizer it was trained with (--config.model.tokenizer_path, or the "
        f"config of the run that produced it)")
  model = load_hf_checkpoint(path, dtype=c.model.param_dtype, compute_dtype=c.model.compute_dtype, mesh=mesh,
                             remat=c.model.remat, scan_layers=c.model.scan_layers,
                             attention_chunk_size=c.model.attention_chunk_size)
  graphdef, params = nnx.split(model)
  return Policy(name=str(path), graphdef=graphdef, params=params, arch=arch, make_sampler=samplers.factory(graphdef))
