"""One policy out of a saved run: a training workdir's orbax checkpoint or a Hugging Face directory.

The evaluation reads the policy it scores through `restore_actor`; a run started with `--config.init_from`
reads its starting policy through `load_initial_actor`. Only the actor's parameters are read from a workdir:
the checkpoint's `state` item is restored partially (orbax `PyTreeRestore(partial_restore=True)`) onto the
shapes and shardings of the architecture the config describes, so optimizer moments, critic and reference
weights are never loaded. Before anything is read the checkpoint's parameter shapes are compared with that
architecture, and a mismatch raises one `IncompatibleCheckpointError` naming the config fields that differ.
A workdir may be local or in Cloud Storage (`gs://bucket/run`, `agent_r1_jax.workdir`); a Hugging Face directory
must be local.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
from flax import nnx
from ml_collections import config_dict

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.models import Qwen2Config, load_hf_checkpoint
from agent_r1_jax.learner import build
from agent_r1_jax.trainer.checkpointing import IncompatibleCheckpointError

_ARCH_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "tie_word_embeddings")
# Every `Qwen2Config` field that changes the forward function: a source differing in any of them has weights made
# for other math (the rest, max_position_embeddings and the bos / eos ids, are informational).
_MATH_FIELDS = _ARCH_FIELDS + ("rms_norm_eps", "rope_theta", "attention_bias")


def read_workdir_config(workdir: str | os.PathLike) -> config_dict.ConfigDict:
  """The run's config as the trainer wrote it to `workdir/config.json`."""
  path = workdir_lib.workdir_path(workdir) / "config.json"
  if not path.is_file():
    raise ValueError(f"{path} not found: --workdir must be a directory written by `python -m agent_r1_jax.train` "
                     f"(it holds config.json and checkpoints/); for a Hugging Face directory use --hf_checkpoint")
  return config_dict.ConfigDict(json.loads(path.read_text()))


def checkpoint_steps(workdir: str | os.PathLike) -> list[int]:
  """Finished checkpoint steps under `workdir/checkpoints`, ascending. Orbax finalizes a local `<step>/` by
  renaming its temporary directory, a bucket's by writing `commit_success.txt` into it last; a step that was
  being written when the run died is left out either way."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  root = workdir_lib.workdir_path(workdir) / "checkpoints"
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir()
                if p.name.isdigit() and (p / "state").is_dir() and ocp.utils.is_checkpoint_finalized(p))


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


def _check_shapes(saved: Any, target: Any, where: os.PathLike, c: config_dict.ConfigDict,
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
      + "; ".join(details) + f" ({len(wrong) + len(missing) + len(extra)} parameters differ). Use the "
      f"model config the run was trained with (its workdir's config.json: drop --config when evaluating it), "
      f"or fix the --config.model.* fields{' / model.path' if c.model.path else ''}")


def restore_actor(workdir: str | os.PathLike, c: config_dict.ConfigDict, arch: Qwen2Config, mesh: Any,
                  step: int | None = None) -> tuple[Any, nnx.State, int]:
  """The actor parameters of checkpoint `step` (default: the latest) of a training workdir.

  Returns:
    `(graphdef, params, step)`.

  Raises:
    ValueError: no such checkpoint; IncompatibleCheckpointError: its shapes do not fit `arch`.
  """
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  root = workdir_lib.absolute(workdir) / "checkpoints"
  steps = checkpoint_steps(workdir)
  if not steps:
    raise ValueError(f"no checkpoint under {root}; train first or pass --hf_checkpoint")
  step = steps[-1] if step is None else int(step)
  if step not in steps:
    raise ValueError(f"checkpoint step {step} not found under {root}; available steps: {steps}")
  path = root / str(step) / "state"
  graphdef, target = build.abstract_params(c, arch, mesh, head="lm")
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


def load_initial_actor(source: str | os.PathLike, c: config_dict.ConfigDict, arch: Qwen2Config,
                       mesh: Any) -> nnx.State:
  """The starting policy `--config.init_from=source` names, on this run's shardings.

  Args:
    source: a training workdir (its step-0 checkpoint: the policy right after that run's warm-up) or a Hugging
      Face checkpoint directory (`config.json` + safetensors, e.g. a run's `hf_export/`).
    c: this run's config; arch: its architecture, which the source must match; mesh: where to place it.

  Raises:
    ValueError: `source` is neither, or a workdir without its step-0 checkpoint;
    IncompatibleCheckpointError: the source's parameter shapes do not fit `arch`.
  """
  path = workdir_lib.workdir_path(source if workdir_lib.is_remote(source) else pathlib.Path(source).expanduser())
  if (path / "checkpoints").is_dir():
    steps = checkpoint_steps(path)
    if 0 not in steps:
      raise ValueError(f"init_from={source}: the run has no step-0 checkpoint (steps {steps}; runs keep step 0 "
                       f"whatever trainer.max_to_keep, so this one predates that or lost it); write it with "
                       f"--config.trainer.total_steps=0 in a new workdir")
    try:
      return restore_actor(path, c, arch, mesh, step=0)[1]
    except IncompatibleCheckpointError as e:
      raise IncompatibleCheckpointError(f"init_from={source}: {e}") from None
  if (path / "config.json").is_file() and any(path.glob("*.safetensors*")):
    if workdir_lib.is_remote(path):
      raise ValueError(f"init_from={source} is a Hugging Face directory in a bucket: copy it to a local directory "
                       f"(gcloud storage cp -r {source} DIR) and pass that")
    saved = Qwen2Config.from_pretrained_dir(path)
    differ = [f"{k}: {getattr(saved, k)} there, {getattr(arch, k)} here" for k in _MATH_FIELDS
              if getattr(saved, k) != getattr(arch, k)]
    if differ:
      raise IncompatibleCheckpointError(f"init_from={source} is another architecture than this run's model "
                                        f"({'; '.join(differ)}); set --config.model.* to match it, or "
                                        f"--config.model.path={source} to take its whole architecture")
    model = load_hf_checkpoint(path, dtype=c.model.param_dtype, compute_dtype=c.model.compute_dtype, mesh=mesh,
                               remat=c.model.remat, scan_layers=c.model.scan_layers,
                               attention_chunk_size=c.model.attention_chunk_size)
    return nnx.split(model)[1]
  raise ValueError(f"init_from={source} is neither a training workdir (config.json + checkpoints/0) nor a "
                   f"Hugging Face checkpoint directory (config.json + model.safetensors)")
