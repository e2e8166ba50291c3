"""The real SmolLM2-135M-Instruct tokenizer, read from the shared GGUF once per test process (about 12 s).

Imported by the tests that need it (`from smollm2_tokenizer import smollm2_tokenizer`); the fixture skips with
the reason when the shared data or the `gguf` package is absent.
"""

from __future__ import annotations

import functools
import pathlib

import pytest

GGUF_DIR = pathlib.Path("smollm2")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@functools.lru_cache(maxsize=None)
def _load(directory: str):
  import transformers  # pylint: disable=import-outside-toplevel
  return transformers.AutoTokenizer.from_pretrained(directory, gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def smollm2_tokenizer(shared_data: pathlib.Path):
  """The tokenizer transformers builds from the GGUF's metadata (vocabulary 49,152; no tool support in its
  chat template; `<tool_call>` / `</tool_call>` are five ordinary tokens each)."""
  path = shared_data / GGUF_DIR / GGUF_NAME
  if not path.is_file():
    pytest.skip(f"SmolLM2 GGUF not found at {path}")
  pytest.importorskip("gguf", reason="reading a tokenizer from a GGUF file needs the gguf package")
  return _load(str(path.parent))
