"""Policies to evaluate: a training workdir's orbax checkpoint or a Hugging Face checkpoint directory.

A `Policy` is what the rollout driver needs from a model: the NNX `graphdef`, its parameters (`nnx.State`),
the architecture, and a factory of samplers for a rollout's limits (built exactly as the trainer builds its
own, `trainer.build.build_sampler`). Samplers are cached per (graphdef, cache length), so two policies of
one architecture (the trained policy and its base) share compiled programs.

From a workdir only the actor's parameters are read: the checkpoint's `state` item is restored partially
(orbax `PyTreeRestore(partial_restore=True)`) onto the shapes and shardings of the architecture the config
describes, so optimizer moments, critic and reference weights are never loaded. Before anything is read the
checkpoint's parameter shapes are compared with that architecture, and a mismatch raises one
`IncompatibleCheckpointError` naming the config fields that differ.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Callable

import jax
from flax import nnx
from ml_collections import config_dict

from agent_r1_jax.models import Qwen2Config, load_hf_checkpoint
from agent_r1_jax.rollout import RolloutConfig
from agent_r1_jax.trainer import build
from agent_r1_jax.trainer.checkpointing import IncompatibleCheckpointError

SamplerFactory = Callable[[RolloutConfig], Any]
_ARCH_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "tie_word_embeddings")


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
  """`trainer.build.build_sampler` per (graphdef, cache length): one sampler, one set of compiled programs."""

  def __init__(self, c: config_dict.ConfigDict, tokenizer: Any, mesh: Any):
    self._c, self._tokenizer, self._mesh = c, tokenizer, mesh
    self._samplers: dict[tuple[Any, int], Any] = {}

  def factory(self, graphdef: Any) -> SamplerFactory:
    def make(rcfg: RolloutConfig) -> Any:
      key = (graphdef, rcfg.cache_length)
      if key not in self._samplers:
        self._samplers[key] = build.build_sampler(self._c, graphdef, self._tokenizer, rcfg, self._mesh)
      return self._samplers[key]
    return make


def read_workdir_config(workdir: str | pathlib.Path) -> config_dict.ConfigDict:
  """The run's config as the trainer wrote it to `workdir/config.json`."""
  path = pathlib.Path(workdir) / "config.json"
  if not path.is_file():
    raise ValueError(f"{path} not found: --workdir must be a directory written by `python -m agent_r1_jax.train` "
                     f"(it holds config.json and checkpoints/); for a Hugging Face directory use --hf_checkpoint")
  return config_dict.ConfigDict(json.loads(path.read_text()))


def checkpoint_steps(workdir: str | pathlib.Path) -> list[int]:
  """Finished checkpoint steps under `workdir/checkpoints`, ascending (orbax writes `<step>/` when complete)."""
  root = pathlib.Path(workdir) / "checkpoints"
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit() and (p / "state").is_dir())


def _key_name(entry: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def _flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """`{"model/layers/0/attn/q_kernel": shape}` for an `nnx.State` or orbax's metadata tree of it.

  The NNX state reaches each array through a Variable's `.value` attribute, the saved tree through a
  `"value"` dict key; both spell it as a trailing `/value`, dropped here.
  """
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = "/".join(_key_name(k) for k in path)
    out[name[:-len("/value")] if name.endswith("/value") else name] = tuple(leaf.shape)
  return out


def _abstract_params(c: config_dict.ConfigDict, arch: Qwen2Config, mesh: Any) -> tuple[Any, nnx.State]:
  """The actor's graphdef and its state as `ShapeDtypeStruct`s on the trainer's shardings (no memory)."""
  return build.abstract_params(c, arch, mesh, head="lm")


def _check_shapes(saved: Any, target: Any, where: pathlib.Path, c: config_dict.ConfigDict,
                  arch: Qwen2Config) -> None:
  """Raises IncompatibleCheckpointError when the saved actor's parameter shapes differ from `target`'s."""
  have, want = _flat_shapes(saved), _flat_shapes(target)
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  wrong = sorted(k for k in set(have) & set(want) if have[k] != want[k])
  if not (missing or extra or wrong):
    return
  details = [f"{k}: checkpoint {have[k]}, config {want[k]}" for k in wrong[:4]]
  details += [f"{k}: only in the config" for k in missing[:2]] + [f"{k}: only in the checkpoint" for k in extra[:2]]
  fields = ", ".join(f"{k}={getattr(arch, k)}" for k in _ARCH_FIELDS)
  raise IncompatibleCheckpointError(
      f"the policy checkpoint {where} does not match the model config ({fields}): "
      + "; ".join(details) + f" ({len(wrong) + len(missing) + len(extra)} parameters differ). Evaluate with the "
      f"config the run was trained with (drop --config to use the workdir's config.json, or fix the "
      f"--config.model.* fields{' / model.path' if c.model.path else ''})")


def restore_actor(workdir: str | pathlib.Path, c: config_dict.ConfigDict, arch: Qwen2Config, mesh: Any,
                  step: int | None = None) -> tuple[Any, nnx.State, int]:
  """The actor parameters of checkpoint `step` (default: the latest) of a training workdir.

  Returns:
    `(graphdef, params, step)`.

  Raises:
    ValueError: no such checkpoint; IncompatibleCheckpointError: its shapes do not fit `arch`.
  """
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  steps = checkpoint_steps(workdir)
  if not steps:
    raise ValueError(f"no checkpoint under {pathlib.Path(workdir) / 'checkpoints'}; train first or pass "
                     f"--hf_checkpoint")
  step = steps[-1] if step is None else int(step)
  if step not in steps:
    raise ValueError(f"checkpoint step {step} not found under {pathlib.Path(workdir) / 'checkpoints'}; "
                     f"available steps: {steps}")
  path = (pathlib.Path(workdir) / "checkpoints" / str(step) / "state").resolve()
  graphdef, target = _abstract_params(c, arch, mesh)
  saved = ocp.PyTreeCheckpointHandler().metadata(path).tree  # shapes and dtypes only, nothing is read
  if "actor" not in saved:
    raise ValueError(f"{path} holds no 'actor' parameters (keys {sorted(saved)}); it is not an agent_r1_jax "
                     f"training checkpoint")
  _check_shapes(saved["actor"], target, path, c, arch)
  with ocp.PyTreeCheckpointer() as checkpointer:
    item = {"actor": target}
    restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
        item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
  return graphdef, restored["actor"], step


def workdir_policy(workdir: str | pathlib.Path, c: config_dict.ConfigDict, tokenizer: Any, mesh: Any,
                   samplers: SamplerCache, step: int | None = None) -> Policy:
  """The trained actor of a workdir (latest checkpoint unless `step`)."""
  arch = build.model_config(c, vocab_size=len(tokenizer))
  graphdef, params, step = restore_actor(workdir, c, arch, mesh, step)
  return Policy(name=f"{pathlib.Path(workdir)} step {step}", graphdef=graphdef, params=params, arch=arch,
                make_sampler=samplers.factory(graphdef))


def hf_policy(path: str | pathlib.Path, c: config_dict.ConfigDict, tokenizer: Any, mesh: Any,
              samplers: SamplerCache) -> Policy:
  """A Hugging Face checkpoint directory; its vocabulary must cover the task's tokenizer (checked first)."""
  if not pathlib.Path(path).is_dir():
    raise ValueError(f"Hugging Face checkpoint directory {path} not found")
  arch = Qwen2Config.from_pretrained_dir(path)
  if len(tokenizer) > arch.vocab_size:
    raise IncompatibleCheckpointError(
        f"the checkpoint {path} has vocab_size={arch.vocab_size} but the task's tokenizer has {len(tokenizer)} "
        f"tokens; evaluate it with the tokenizer it was trained with (--config.model.tokenizer_path, or the "
        f"config of the run that produced it)")
  model = load_hf_checkpoint(path, dtype=c.model.param_dtype, compute_dtype=c.model.compute_dtype, mesh=mesh,
                             remat=c.model.remat, attention_chunk_size=c.model.attention_chunk_size)
  graphdef, params = nnx.split(model)
  return Policy(name=str(path), graphdef=graphdef, params=params, arch=arch, make_sampler=samplers.factory(graphdef))
