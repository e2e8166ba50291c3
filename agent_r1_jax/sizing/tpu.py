"""TPU topologies for compiling without the hardware (`--config.dry_run_topology`).

libtpu (`pip install -e ".[tpu]"`) compiles for a named TPU slice on any host: `topology_devices("v5e:2x4")`
gives the slice's devices, abstract ones that no array can live on but that `jax.jit(...).lower(...).compile()`
accepts in shardings, so XLA:TPU itself lays out, schedules and sizes every program. JAX keeps running on the
host's own backend.

A name is `<generation>:<chips per dimension>` as libtpu spells it: `v5e:2x2` (4 chips), `v5e:2x4`, `v6e:2x4`,
`v4:2x2x1`, `v5p:2x2x1`, `tpu7x:2x2x1` (4 chips, 8 devices: one per TensorCore).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
from typing import Any

import jax
import jax.numpy as jnp

from agent_r1_jax.sizing import roofline

EXAMPLES = ("v5e:2x2", "v5e:2x4", "v5e:4x8", "v6e:2x4", "v4:2x2x1", "v5p:2x2x1", "tpu7x:2x2x1")
# Generations whose two TensorCores per chip run as one "megacore" device (libtpu's chip config of that name).
_MEGACORE = ("v4", "v5p")
_SHARE_LIBTPU = "ALLOW_MULTIPLE_LIBTPU_LOAD"
_HOST_BOUNDS = (2, 2, 1)      # libtpu's default chips per host; smaller slices (v5e:1x1) need smaller bounds
_DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p",
                 "TPU v6 lite": "v6e", "TPU v6e": "v6e", "TPU7x": "v7x"}
# A size as XLA prints it in an out-of-memory message: "15.75G", "512.00M", "2.00T", "100B".
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s?(?:([KMGT])i?B?|B)(?![A-Za-z])")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _generation(name: str) -> str:
  return re.split(r"[:_=]", name, maxsplit=1)[0].lower()


def _host_bounds(name: str) -> tuple[int, int, int] | None:
  """Chips per host for a slice smaller than libtpu's default host (e.g. `v5e:1x1`), else None (the default)."""
  match = re.fullmatch(r"[A-Za-z0-9 ]+[:_=](\d+(?:x\d+)*)", name)
  if match is None:
    return None
  dims = [int(d) for d in match.group(1).split("x")] + [1] * 3
  bounds = tuple(min(d, b) for d, b in zip(dims[:3], _HOST_BOUNDS))
  return None if bounds == _HOST_BOUNDS else bounds


def _invalid(name: str, why: str) -> ValueError:
  return ValueError(f"dry_run_topology={name!r}: {why}; name a TPU slice as libtpu spells it, "
                    f"<generation>:<chips per dimension>, e.g. --config.dry_run_topology={EXAMPLES[1]} "
                    f"(valid: {', '.join(EXAMPLES)})")


@contextlib.contextmanager
def _shared_libtpu():
  """libtpu admits one process per host (`/tmp/libtpu_lockfile`) unless ALLOW_MULTIPLE_LIBTPU_LOAD=1. A
  compile-only topology touches no chip, so another process holding the lock (a run on the TPU VM, a second
  dry run) must not stop it; the variable is set while libtpu initializes and restored after."""
  before = os.environ.get(_SHARE_LIBTPU)
  os.environ[_SHARE_LIBTPU] = "1"
  try:
    yield
  finally:
    if before is None:
      os.environ.pop(_SHARE_LIBTPU, None)
    else:
      os.environ[_SHARE_LIBTPU] = before


def topology_devices(name: str) -> list[Any]:
  """The devices of TPU slice `name`, compile-only (libtpu's chip config `megacore` for v4 and v5p, else
  `default`). Raises one ValueError naming what to change when libtpu is missing or rejects the name."""
  if importlib.util.find_spec("libtpu") is None:
    raise ValueError(f"dry_run_topology={name!r} compiles with libtpu, which is not installed: "
                     f'pip install -e ".[tpu]" (or leave dry_run_topology empty for the XLA:CPU estimate)')
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  bounds = _host_bounds(name)
  try:
    with _shared_libtpu():
      topology = topologies.get_topology_desc(
          platform="tpu", topology_name=name, num_slices=1,
          chip_config_name="megacore" if _generation(name) in _MEGACORE else "default",
          **({} if bounds is None else {"chips_per_host_bounds": bounds}))
  except Exception as e:  # libtpu's own message says what it rejected
    raise _invalid(name, f"libtpu rejects it ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
  devices = list(topology.devices)
  if not devices:
    raise _invalid(name, "libtpu gives it no devices")
  return devices


def chip_of(devices: list[Any]) -> roofline.Chip:
  """The `roofline.CHIPS` entry of `devices`' kind (e.g. 'TPU v5 lite' -> v5e); one ValueError if unknown."""
  kind = devices[0].device_kind
  if kind not in _DEVICE_KINDS:
    raise ValueError(f"no published figures for TPU device kind {kind!r} (known: {sorted(_DEVICE_KINDS)}); "
                     f"add it to sizing/roofline.py CHIPS and sizing/tpu.py _DEVICE_KINDS")
  return roofline.CHIPS[_DEVICE_KINDS[kind]]


def parse_sizes(message: str) -> list[int]:
  """Every size in an XLA message, in bytes, in order: "... temporaries (60.10G) exceeds available HBM
  (15.75G)" -> [60.10 * 2**30, 15.75 * 2**30] (XLA's K, M, G, T are binary)."""
  return [round(float(number) * _UNITS[unit]) for number, unit in _SIZE.findall(message)]


def out_of_memory(error: BaseException) -> bool:
  """Whether a compile error is the compiler refusing a program too large for the device's HBM."""
  return "RESOURCE_EXHAUSTED" in str(error)


def compiler_hbm_bytes(devices: list[Any], fallback: int) -> int:
  """HBM bytes the TPU compiler lets one device use, asked of the compiler itself: a program holding a 1 TiB
  array on one device is refused with "... exceeds available HBM (15.75G)" (v5e), which this parses. Falls
  back to `fallback` (the chip table's figure) when the message says otherwise."""
  one = jax.sharding.NamedSharding(jax.sharding.Mesh(devices[:1], ("probe",)), jax.sharding.PartitionSpec())
  huge = jax.ShapeDtypeStruct((1 << 40,), jnp.int8, sharding=one)
  try:
    jax.jit(lambda x: x).lower(huge).compile()
  except jax.errors.JaxRuntimeError as e:
    sizes = parse_sizes(str(e).splitlines()[0])
    if out_of_memory(e) and len(sizes) >= 2 and 0 < sizes[1] < huge.size:
      return sizes[1]
  return fallback


def slice_chips(devices: list[Any], chip: roofline.Chip) -> int:
  """Chips in the slice: its devices over the devices each chip makes."""
  return math.ceil(len(devices) / chip.devices_per_chip)
