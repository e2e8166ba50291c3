"""GGUF file -> Hugging Face checkpoint directory (safetensors + config.json + tokenizer files).

    python -m agent_r1_jax.models.convert_gguf --gguf=FILE --out=DIR [--dtype=float32|bfloat16]

The GGUF is read by transformers' own loader (`from_pretrained(dir, gguf_file=name)` for the model and the
tokenizer), which dequantises every weight (Q4_1 blocks etc.) to dense float32 tensors and undoes
llama.cpp's q/k row permutation; nothing here parses GGUF. The dense model is then written with
`save_pretrained` in `dtype`, so both `load_hf_checkpoint(DIR)` and
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` / `AutoTokenizer.from_pretrained(DIR)` read it.
The weights are the quantised values exactly (as dense floats); nothing of the original unquantised model
is recovered.

`convert_gguf` is idempotent: a finished conversion ends by writing `MARKER` (the source file's name and
size, the dtype), so a second call with the same arguments returns at once and an interrupted one (no
marker) is redone from the start.

Needs `torch`, `gguf` and `accelerate` besides transformers (transformers' GGUF loader requires all
three): `pip install -e ".[convert]"`.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
from collections.abc import Sequence

from agent_r1_jax.models.config import Qwen2Config

MARKER = "convert_gguf.json"
DTYPES = ("float32", "bfloat16")
_REQUIRED = ("torch", "gguf", "accelerate")
_PIP = ('pip install -e ".[convert]"  (or: pip install gguf==0.19.0 accelerate==1.15.0 torch==2.13.0; on a '
        'CPU-only machine add --extra-index-url https://download.pytorch.org/whl/cpu for the small torch build)')


class GGUFConversionError(RuntimeError):
  """A GGUF file that transformers could not turn into a dense checkpoint this project loads."""


def convert_gguf(gguf_path: str | pathlib.Path, out_dir: str | pathlib.Path, *,
                 dtype: str = "float32") -> pathlib.Path:
  """Converts `gguf_path` into an HF checkpoint directory `out_dir` (created); returns `out_dir`.

  Skips the work when `out_dir` already holds a finished conversion of the same file (same name and
  size) in the same dtype.

  Raises:
    FileNotFoundError: `gguf_path` is not a file.
    ValueError: `dtype` is not "float32" or "bfloat16".
    ImportError: torch, gguf or accelerate is missing (the message names the pip command).
    ConfigError: the GGUF's architecture is not one `load_hf_checkpoint` computes (Qwen2 / Llama).
    GGUFConversionError: transformers left a weight quantised (not a dense floating tensor).
  """
  gguf_path = pathlib.Path(gguf_path)
  out_dir = pathlib.Path(out_dir)
  if dtype not in DTYPES:
    raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
  if not gguf_path.is_file():
    raise FileNotFoundError(f"{gguf_path}: GGUF file not found")
  stamp = {"gguf": gguf_path.name, "gguf_bytes": gguf_path.stat().st_size, "dtype": dtype}
  if is_converted(out_dir, gguf_path, dtype=dtype):
    return out_dir
  _require_dependencies()
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / MARKER).unlink(missing_ok=True)  # from here on the directory is unfinished
  source, name = str(gguf_path.parent), gguf_path.name
  tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=name)
  # Dense weights even where packed GGUF kernels exist.
  dense = transformers.GgufConfig(gguf_file=name, dequantize=True)
  model = transformers.AutoModelForCausalLM.from_pretrained(source, gguf_file=name, quantization_config=dense)
  _check_dense(model, gguf_path)
  _drop_quantization(model)
  hf_config = model.config.to_dict()
  Qwen2Config.from_hf_dict(hf_config, source=f"{gguf_path} (as read by transformers)")
  model = model.to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
  model.save_pretrained(out_dir)
  tokenizer.save_pretrained(out_dir)
  saved = json.loads((out_dir / "config.json").read_text())
  if "quantization_config" in saved:
    raise GGUFConversionError(f"{out_dir / 'config.json'}: still carries a quantization_config")
  stamp["transformers"] = transformers.__version__
  stamp["architectures"] = saved.get("architectures")
  (out_dir / MARKER).write_text(json.dumps(stamp, indent=2) + "\n")
  return out_dir


def is_converted(out_dir: str | pathlib.Path, gguf_path: str | pathlib.Path, *,
                 dtype: str = "float32") -> bool:
  """True when `out_dir` holds a finished conversion of `gguf_path` (same name and size) in `dtype`."""
  marker = pathlib.Path(out_dir) / MARKER
  gguf_path = pathlib.Path(gguf_path)
  if not marker.is_file() or not gguf_path.is_file():
    return False
  try:
    done = json.loads(marker.read_text())
  except json.JSONDecodeError:
    return False
  return (isinstance(done, dict) and done.get("gguf") == gguf_path.name
          and done.get("gguf_bytes") == gguf_path.stat().st_size and done.get("dtype") == dtype)


def _require_dependencies() -> None:
  missing = [m for m in _REQUIRED if importlib.util.find_spec(m) is None]
  if missing:
    raise ImportError(f"GGUF conversion needs {', '.join(missing)} (transformers' GGUF loader uses torch, "
                      f"gguf and accelerate); install with: {_PIP}")


def _check_dense(model, gguf_path: pathlib.Path) -> None:
  """Every parameter must be a dense floating tensor (no GGUF blocks left packed)."""
  packed = [n for n, p in model.named_parameters() if not p.dtype.is_floating_point]
  if packed:
    raise GGUFConversionError(f"{gguf_path}: transformers kept {len(packed)} weight(s) quantised "
                              f"(e.g. {packed[0]!r}); cannot write a dense checkpoint")


def _drop_quantization(model) -> None:
  """Forgets the GGUF 'quantizer' of a model whose weights are already dense, so `save_pretrained` writes
  a plain checkpoint (transformers refuses to serialise a model that still has one)."""
  quantizer = getattr(model, "hf_quantizer", None)
  if quantizer is not None:
    quantizer.remove_quantization_config(model)


def main(argv: Sequence[str]) -> None:
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  del argv
  f = flags.FLAGS
  if not f.gguf or not f.out:
    raise app.UsageError("--gguf and --out are required")
  try:
    out = convert_gguf(f.gguf, f.out, dtype=f.dtype)
  except (FileNotFoundError, ImportError, ValueError, GGUFConversionError) as e:
    raise SystemExit(f"convert_gguf: {e}") from None
  print(f"converted {f.gguf} -> {out} ({f.dtype})")


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("gguf", None, "GGUF file to convert.")
  flags.DEFINE_string("out", None, "Output Hugging Face checkpoint directory (created).")
  flags.DEFINE_enum("dtype", "float32", list(DTYPES), "dtype of the written weights.")
  app.run(main)
