"""TPU chips' published figures and the roofline estimate of a program's time on one of them.

`CHIPS` holds, per chip generation, what Google Cloud's TPU pages publish per chip (HBM capacity, HBM bandwidth,
bf16 peak), how many JAX devices libtpu makes of one chip (the chip config `sizing.tpu` asks for: v4 and v5p
as one "megacore" device; TPU7x as two devices, one per TensorCore), and the HBM the TPU compiler lets one
device use (what it prints in "exceeds available HBM (15.75G)", read from libtpu 0.0.42; the dry run asks the
compiler again and uses its answer, this figure is the fallback). The published capacity is not what a
program may use: a v5e chip has 16 GiB and the compiler allows 15.75 GiB of it.

`estimate_seconds` is the roofline bound of a program whose `Compiled.cost_analysis()` counts `flops` and
`bytes_accessed`: the longer of computing at peak and moving its bytes at full bandwidth.
"""

from __future__ import annotations

import dataclasses

_GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation: published per-chip figures and what one JAX device of it gets."""
  name: str                   # "v5e", ...
  hbm_bytes: int              # published HBM capacity per chip
  hbm_bandwidth: float        # published HBM bandwidth per chip, bytes/s
  peak_flops: float           # published bf16 peak per chip, FLOP/s
  devices_per_chip: int       # JAX devices libtpu makes of one chip
  compiler_hbm_bytes: int     # HBM the TPU compiler lets one device use (libtpu 0.0.42)

  @property
  def device_bandwidth(self) -> float:
    """HBM bytes/s of one device: the chip's bandwidth split over its devices."""
    return self.hbm_bandwidth / self.devices_per_chip

  @property
  def device_peak_flops(self) -> float:
    """bf16 FLOP/s of one device: the chip's peak split over its devices."""
    return self.peak_flops / self.devices_per_chip

  def describe(self) -> str:
    split = f", {self.devices_per_chip} devices per chip" if self.devices_per_chip > 1 else ""
    return (f"TPU {self.name} (published per chip: {self.hbm_bytes / _GIB:.0f} GiB HBM, "
            f"{self.hbm_bandwidth / 1e9:.0f} GB/s, {self.peak_flops / 1e12:.0f} TFLOP/s bf16{split})")


CHIPS: dict[str, Chip] = {
    # Google Cloud TPU docs, "TPU v4": "Peak compute per chip 275 teraflops (bf16 or int8); HBM2 capacity and
    # bandwidth 32 GiB, 1200 GBps"; two TensorCores per chip, one megacore device.
    "v4": Chip("v4", 32 * _GIB, 1200e9, 275e12, 1, int(30.75 * _GIB)),
    # "TPU v5e": "Peak compute per chip (bf16) 197 TFLOPs; HBM2 capacity and bandwidth 16 GB, 819 GBps". The
    # compiler allows 15.75 GiB, so the 16 is GiB.
    "v5e": Chip("v5e", 16 * _GIB, 819e9, 197e12, 1, int(15.75 * _GIB)),
    # "TPU v5p": "Peak compute per chip (bf16) 459 TFLOPs; HBM2e capacity and bandwidth 95 GB, 2765 GBps" (95 GiB
    # in the "TPU7x (Ironwood)" page's comparison table); two TensorCores per chip, one megacore device.
    "v5p": Chip("v5p", 95 * _GIB, 2765e9, 459e12, 1, int(95.74 * _GIB)),
    # "TPU v6e": "Peak compute per chip (bf16) 918 TFLOPs; HBM capacity per chip 32 GB; HBM bandwidth per chip
    # 1638 GBps" (32 GiB in the TPU7x page's table; the compiler allows 31.25 GiB).
    "v6e": Chip("v6e", 32 * _GIB, 1638e9, 918e12, 1, int(31.25 * _GIB)),
    # "TPU7x (Ironwood)": "Peak compute per chip (BF16) 2307 TFLOPs; HBM capacity per chip 192 GiB; HBM bandwidth
    # per chip 7380 GB/s; two TensorCores per chip", which libtpu exposes as two devices of 96 GiB each.
    "v7x": Chip("v7x", 192 * _GIB, 7380e9, 2307e12, 2, int(94.75 * _GIB)),
}


def estimate_seconds(flops: float, bytes_accessed: float, chip: Chip, iterations: int = 1) -> float:
  """Roofline time of a program on one device of `chip`:

      t = iterations * max(flops / P, bytes_accessed / B)

  with P the device's bf16 peak FLOP/s and B its HBM bandwidth in bytes/s. `flops` and `bytes_accessed` are
  per iteration (`cost_analysis` counts a loop body once), so a loop of n iterations passes `iterations=n`.
  A lower bound: it assumes perfect overlap of compute and memory traffic and ignores collectives.
  """
  return iterations * max(flops / chip.device_peak_flops, bytes_accessed / chip.device_bandwidth)
