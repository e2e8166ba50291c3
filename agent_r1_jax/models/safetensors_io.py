"""Minimal safetensors reader/writer over numpy memory maps (any dtype, including bfloat16).

The `safetensors` package's numpy backend cannot represent bfloat16, and real Qwen2.5 checkpoints are
bfloat16, so this module parses the format directly: an 8-byte little-endian header size, a JSON header
`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`, then the raw bytes.
Tensors are memory-mapped, so slicing one reads only the pages that slice touches.
"""

from __future__ import annotations

import json
import pathlib
import struct

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}


class SafetensorsFormatError(ValueError):
  """A file that is not a well-formed safetensors file."""


class SafetensorsFile:
  """Read-only view of one `.safetensors` file: `names()`, `shape(n)`, `dtype(n)`, `array(n)`."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    try:
      with open(self.path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
      raise SafetensorsFormatError(f"{self.path}: not a readable safetensors file ({e})") from None
    if not isinstance(header, dict):
      raise SafetensorsFormatError(f"{self.path}: safetensors header is not a JSON object")
    self.metadata = header.pop("__metadata__", None) or {}
    self._header = header
    self._data_start = 8 + size
    file_size = self.path.stat().st_size
    for name, info in header.items():
      if info.get("dtype") not in DTYPES:
        raise SafetensorsFormatError(f"{self.path}: tensor {name!r} has unsupported dtype "
                                     f"{info.get('dtype')!r}")
      begin, end = info["data_offsets"]
      expected = int(np.prod(info["shape"], dtype=np.int64)) * DTYPES[info["dtype"]].itemsize
      if end - begin != expected or self._data_start + end > file_size:
        raise SafetensorsFormatError(f"{self.path}: tensor {name!r} byte range [{begin}, {end}) "
                                     f"does not match shape {info['shape']} {info['dtype']} "
                                     "or runs past the end of the file (truncated?)")
    self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r") if header else None

  def names(self) -> list[str]:
    return list(self._header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._header[name]["shape"])

  def dtype(self, name: str) -> np.dtype:
    return DTYPES[self._header[name]["dtype"]]

  def array(self, name: str) -> np.ndarray:
    """A memory-mapped (lazy) array; index it to read only the needed bytes."""
    info = self._header[name]
    begin, end = info["data_offsets"]
    raw = self._mmap[self._data_start + begin:self._data_start + end]
    return raw.view(DTYPES[info["dtype"]]).reshape(info["shape"])


def write_safetensors(path: str | pathlib.Path, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
  """Writes `tensors` (C-contiguous numpy arrays of a supported dtype) to `path`."""
  header: dict = {"__metadata__": dict(metadata or {})}
  offset = 0
  arrays = []
  for name, arr in tensors.items():
    arr = np.ascontiguousarray(arr)
    if arr.dtype not in _NAMES:
      raise ValueError(f"tensor {name!r}: dtype {arr.dtype} cannot be stored in safetensors")
    header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + arr.nbytes]}
    offset += arr.nbytes
    arrays.append(arr)
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # the format asks for 8-byte alignment of the data section
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in arrays:
      f.write(arr.tobytes())
