"""The host's account of a paged KV cache (`models.paged_kv_cache`): which pages each slot holds.

Each batch device has its own pool of `pages_per_device` pages; page 0 is the null page (never handed out), so
`pages_per_device - 1` are free at the start. A slot (cache row) lives on one device and takes pages from that
device's pool only: row r of a process's n slots is on its local device r // slots_per_device. A slot's pages are
listed in order in its row of `table` (`[n, pages_per_row]`, NULL_PAGE past the pages it holds), and a context of
L tokens needs ceil(L / page_size) of them.

Pages are taken when a slot grows (`grow`), returned when it shrinks or empties (`shrink`, `release`); freed
pages go on top of their device's free stack and are handed out first, so after a few episodes a slot's pages
are in no particular order (which the kernels do not care about: they follow the table).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from agent_r1_jax.models.paged_attention import BACKENDS, default_backend, layout_of
from agent_r1_jax.models.paged_kv_cache import NULL_PAGE


@dataclasses.dataclass(frozen=True)
class PagingConfig:
  """A paged cache's shape and kernel.

  Attributes:
    page_size: tokens per page.
    pages_per_device: pages in each batch device's pool, the null page included; 0: enough for every slot of the
      device at the full cache length (never waits; the dense cache's footprint).
    backend: the kernel reading the pages (`models.paged_attention.BACKENDS`), or "auto" (by platform).
  """

  page_size: int = 64
  pages_per_device: int = 0
  backend: str = "auto"

  def __post_init__(self):
    for name in ("page_size", "pages_per_device"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < (1 if name == "page_size" else 0):
        raise ValueError(f"paging {name} must be an integer >= {1 if name == 'page_size' else 0}, got {value!r}")
    if self.backend != "auto" and self.backend not in BACKENDS:
      raise ValueError(f"paged attention backend must be 'auto' or one of {list(BACKENDS)}, got {self.backend!r}")

  @classmethod
  def from_config(cls, c, platform: str | None = None) -> PagingConfig | None:
    """The run config's paging (`model.kv_cache`, `model.kv_page_size`, `model.paged_attention`,
    `rollout.pages_per_device`), or None for the dense cache; one ValueError naming a bad field.

    `model.kv_cache="auto"` pages on TPU and GPU (`platform`, default JAX's default backend), where the pages are
    read by a kernel that touches only the pages attended and a chip holds more episodes; on CPU it is dense: there
    the XLA gather path reads every page of a row's table (the dense cache's bytes) plus the gather's copy."""
    if c.model.kv_cache not in ("auto", "paged", "dense"):
      raise ValueError(f"model.kv_cache must be 'auto', 'paged' or 'dense', got {c.model.kv_cache!r}")
    accelerator = (platform or jax.default_backend()) in ("tpu", "gpu", "cuda", "rocm")
    if c.model.kv_cache == "dense" or (c.model.kv_cache == "auto" and not accelerator):
      return None
    try:
      return cls(page_size=c.model.kv_page_size, pages_per_device=c.rollout.pages_per_device,
                 backend=c.model.paged_attention)
    except ValueError as e:
      raise ValueError(f"{e} (set --config.model.kv_page_size, --config.rollout.pages_per_device or "
                       "--config.model.paged_attention)") from None

  def resolved_backend(self, platform: str | None = None) -> str:
    return default_backend(platform) if self.backend == "auto" else self.backend

  @property
  def layout(self) -> str:
    return layout_of(self.resolved_backend())

  def pages_per_row(self, max_length: int) -> int:
    return -(-max_length // self.page_size)

  def device_pages(self, slots_per_device: int, max_length: int) -> int:
    """The pool size per device: `pages_per_device`, or (0) every slot at `max_length` plus the null page."""
    return self.pages_per_device or slots_per_device * self.pages_per_row(max_length) + 1


class PagePool:
  """Free pages per local device and the pages each of this process's n slots holds (see the module docstring)."""

  def __init__(self, config: PagingConfig, *, slots: int, slots_per_device: int, max_length: int):
    self.page_size = config.page_size
    self.pages_per_row = config.pages_per_row(max_length)
    self.pages_per_device = config.device_pages(slots_per_device, max_length)
    if self.pages_per_device - 1 < self.pages_per_row:
      raise ValueError(f"a device's pool of {self.pages_per_device} pages (the null page included) cannot hold one "
                       f"episode at the full cache length ({self.pages_per_row} pages of {self.page_size} tokens): "
                       f"raise pages_per_device to at least {self.pages_per_row + 1}")
    self.slots_per_device = slots_per_device
    devices = slots // slots_per_device
    # Stacks: the next page handed out is the last one; ascending ids at the start.
    self._free = [list(range(self.pages_per_device - 1, NULL_PAGE, -1)) for _ in range(devices)]
    self.table = np.full((slots, self.pages_per_row), NULL_PAGE, np.int32)
    self.held = np.zeros(slots, np.int64)

  def pages_for(self, tokens: int) -> int:
    return -(-int(tokens) // self.page_size)

  def free(self, slot: int) -> int:
    """Free pages on `slot`'s device."""
    return len(self._free[slot // self.slots_per_device])

  def shortfall(self, slot: int, tokens: int) -> int:
    """Pages `slot` still lacks to hold `tokens` tokens beyond what its device has free (0: `grow` would succeed)."""
    return max(self.pages_for(tokens) - int(self.held[slot]) - self.free(slot), 0)

  def grow(self, slot: int, tokens: int) -> None:
    """`slot` holds pages for at least `tokens` tokens (pages taken from its device's free stack)."""
    need = self.pages_for(tokens)
    if need > self.pages_per_row:
      raise ValueError(f"slot {slot}: {tokens} tokens exceed the cache's {self.pages_per_row * self.page_size}")
    if self.shortfall(slot, tokens):
      raise RuntimeError(f"slot {slot} needs {need - self.held[slot]} more pages for {tokens} tokens, but its "
                         f"device has {self.free(slot)} free (pages_per_device={self.pages_per_device})")
    stack = self._free[slot // self.slots_per_device]
    for i in range(int(self.held[slot]), need):
      self.table[slot, i] = stack.pop()
    self.held[slot] = max(need, self.held[slot])

  def shrink(self, slot: int, tokens: int) -> None:
    """`slot` keeps only the pages its first `tokens` tokens occupy; the rest go back to its device."""
    keep = self.pages_for(tokens)
    stack = self._free[slot // self.slots_per_device]
    for i in range(int(self.held[slot]) - 1, keep - 1, -1):
      stack.append(int(self.table[slot, i]))
      self.table[slot, i] = NULL_PAGE
    self.held[slot] = min(keep, self.held[slot])

  def release(self, slot: int) -> None:
    """Every page of `slot` back to its device."""
    self.shrink(slot, 0)

  def in_use(self) -> float:
    """Fraction of the non-null pages held by slots, over this process's devices."""
    return float(self.held.sum()) / (len(self._free) * (self.pages_per_device - 1))


__all__ = ["PagePool", "PagingConfig"]
