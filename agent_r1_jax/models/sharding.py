"""Device mesh and logical-axis sharding rules.

Every parameter carries logical axis names in its nnx metadata (`out_sharding`, e.g. `("embed", "mlp")`);
activations are constrained with logical names too. `LOGICAL_RULES` maps each logical name to mesh axes:

  parameters: `embed` -> fsdp (FSDP/ZeRO-3 style), `heads`/`kv_heads`/`mlp`/`vocab` -> tensor (Megatron
  style tensor parallelism), `head_dim`/`norm` replicated.
  activations: `batch` -> (data, fsdp), `act_heads`/`act_kv_heads`/`act_mlp`/`act_vocab` -> tensor,
  `length`/`act_embed` replicated.

A dimension that a mesh axis does not divide falls back to fewer axes (e.g. 2 KV heads on tensor=4 stay
replicated), so any preset runs on any mesh shape; the choice is made per array from its shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

LOGICAL_RULES: LogicalRules = (
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    # activations and KV cache
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("layers", None),
    ("cache_length", None),
)

# Sampling's weights: whole on every device of the fsdp axis (tensor parallelism stays). A decode step feeds one
# token per row through every weight, so weights left FSDP-sharded would be all-gathered again on every step.
SAMPLING_RULES: LogicalRules = tuple((name, None if name == "embed" else axes) for name, axes in LOGICAL_RULES)


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A `(data, fsdp, tensor)` mesh with Auto axis types; one size may be -1 (= fill the devices).

  Raises:
    ValueError: sizes that do not multiply to the number of devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh sizes must be positive with at most one -1, got data={data}, "
                     f"fsdp={fsdp}, tensor={tensor}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices are not divisible by the fixed mesh sizes "
                       f"(product {known}); change data/fsdp/tensor")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = "
                     f"{math.prod(sizes)} != {len(devices)} available devices")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3,
                       devices=devices)


def logical_to_spec(shape: Sequence[int], names: Sequence[str | None], mesh: Any,
                    rules: LogicalRules = LOGICAL_RULES) -> PartitionSpec:
  """PartitionSpec for an array of `shape` whose dims carry logical `names`.

  For each dim the rule's mesh axes are kept in order while their product divides the dim and the axis
  exists in `mesh`, has size > 1 and is not already used by an earlier dim.
  """
  if len(shape) != len(names):
    raise ValueError(f"shape {tuple(shape)} and logical names {tuple(names)} differ in rank")
  table = dict(rules)
  mesh_sizes = dict(mesh.shape)
  used: set[str] = set()
  out = []
  for dim, name in zip(shape, names):
    axes = table.get(name) if name is not None else None
    if axes is None:
      out.append(None)
      continue
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    kept, prod = [], 1
    for axis in axes:
      size = mesh_sizes.get(axis, 1)
      if size == 1 or axis in used:
        continue
      if dim % (prod * size):
        break
      kept.append(axis)
      prod *= size
    used.update(kept)
    out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return PartitionSpec(*out)


def variable_names(variable: nnx.Variable) -> tuple[str | None, ...]:
  """Logical axis names stored on an nnx Variable (empty tuple for a scalar)."""
  names = variable.get_metadata().get("out_sharding")
  if names is None:
    raise ValueError(f"variable of shape {variable.shape} has no logical axis names")
  return tuple(names)


def state_shardings(state: nnx.State, mesh: Mesh,
                    rules: LogicalRules = LOGICAL_RULES) -> nnx.State:
  """A `NamedSharding` for every variable of an (abstract or concrete) model state, same structure."""

  def one(var):
    return var.replace(NamedSharding(mesh, logical_to_spec(var.shape, variable_names(var),
                                                           mesh, rules)))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def constrain(x: jax.Array, names: Sequence[str | None],
              rules: LogicalRules = LOGICAL_RULES) -> jax.Array:
  """`with_sharding_constraint` by logical names under the ambient mesh (`jax.set_mesh`); else no-op."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or math.prod(mesh.shape.values()) == 1:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(x.shape, names, mesh, rules))


def constrain_state(state: nnx.State, rules: LogicalRules) -> nnx.State:
  """Every variable of `state` constrained to the sharding `rules` give it under the ambient mesh (inside a
  jitted function; a no-op without a mesh)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or math.prod(mesh.shape.values()) == 1:
    return state

  def one(var):
    spec = logical_to_spec(var.shape, variable_names(var), mesh, rules)
    return var.replace(jax.lax.with_sharding_constraint(var.get_value(), spec))

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def place(x: Any, sharding: NamedSharding) -> jax.Array:
  """`x` (identical on every process) as a global array with `sharding`.

  One process: `jax.device_put`. Several processes: each builds only its addressable shards from the host
  value (`make_array_from_callback`); `device_put` of a single-device array onto a sharding that spans other
  processes' devices yields arrays whose replicated shards orbax and `addressable_shards` cannot read.
  """
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_model(model: nnx.Module, mesh: Mesh, rules: LogicalRules = LOGICAL_RULES) -> nnx.Module:
  """Moves every parameter of `model` onto its rule-derived sharding on `mesh` (in place)."""
  graphdef, state = nnx.split(model)
  shardings = state_shardings(state, mesh, rules)
  state = jax.tree.map(place, state, shardings)
  nnx.update(model, state)
  return model


def describe(state: nnx.State) -> dict[str, tuple[tuple[int, ...], str]]:
  """`{path: (shape, sharding spec)}` for logging/inspection of where parameters live."""
  out = {}
  for path, var in nnx.to_flat_state(state):
    value = var.get_value()
    spec = getattr(getattr(value, "sharding", None), "spec", None)
    out["/".join(map(str, path))] = (tuple(np.shape(value)), str(spec))
  return out
