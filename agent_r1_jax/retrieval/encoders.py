"""Text encoders for dense retrieval (PyTorch `transformers`, CPU or GPU, loaded from a local path).

For token states H [B, T, D] and attention mask m [B, T] an embedding is

  cls pooling  (BGE):  e = H[:, 0]
  mean pooling (E5):   e = sum_t m_t H[:, t] / sum_t m_t

followed by L2 normalisation e / ||e||, so inner product = cosine similarity. Inputs get the model
family's prefixes: BGE puts an instruction before queries only
("Represent this sentence for searching relevant passages: "), E5 uses "query: " / "passage: ".
Passages are embedded from their FlashRAG `contents` string (`"Title"\\ntext`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Protocol, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
  """How a model family pools and prefixes."""

  pooling: str  # "cls" | "mean"
  query_prefix: str = ""
  passage_prefix: str = ""
  normalize: bool = True


ENCODER_SPECS = {
    "bge": EncoderSpec("cls", query_prefix="Represent this sentence for searching relevant passages: "),
    "e5": EncoderSpec("mean", query_prefix="query: ", passage_prefix="passage: "),
}


class QueryEncoder(Protocol):
  """Maps texts to float32 [N, dim] embeddings (queries and passages may be treated differently)."""

  dim: int

  def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
    ...

  def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
    ...


def pool(hidden, mask, pooling: str):
  """Pools torch hidden states [B, T, D] with mask [B, T] to [B, D] (see module docstring)."""
  if pooling == "cls":
    return hidden[:, 0]
  if pooling == "mean":
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
  raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")


class HFEncoder:
  """A BGE / E5 style encoder from a local Hugging Face model directory.

  Args:
    path: directory with config.json, weights and tokenizer files (no downloads are attempted).
    kind: "bge" or "e5" (or pass `spec` for another family).
    max_length: token limit per text (longer texts are truncated).
    batch_size: texts per forward pass.
    device: torch device string.
  """

  def __init__(self, path: str | os.PathLike[str], kind: str = "bge", *, spec: EncoderSpec | None = None,
               max_length: int = 256, batch_size: int = 64, device: str = "cpu"):
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    if spec is None:
      if kind not in ENCODER_SPECS:
        raise ValueError(f"encoder kind must be one of {sorted(ENCODER_SPECS)}, got {kind!r}")
      spec = ENCODER_SPECS[kind]
    if not os.path.isdir(path):
      raise FileNotFoundError(f"encoder directory not found: {path} (download the model there first)")
    self.spec = spec
    self.kind = kind
    self.max_length = int(max_length)
    self.batch_size = int(batch_size)
    self.device = device
    self._torch = torch
    self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    self.model = transformers.AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
    self.dim = int(self.model.config.hidden_size)

  def encode(self, texts: Sequence[str], prefix: str = "", show_progress: bool = False) -> np.ndarray:
    """Embeds `prefix + text` for each text: float32 [N, dim]."""
    texts = [prefix + str(t) for t in texts]
    out = np.zeros((len(texts), self.dim), np.float32)
    starts = range(0, len(texts), self.batch_size)
    if show_progress:
      from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
      starts = tqdm(starts, desc="embedding", unit="batch")
    with self._torch.inference_mode():
      for start in starts:
        batch = self.tokenizer(texts[start:start + self.batch_size], padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt").to(self.device)
        hidden = self.model(**batch).last_hidden_state
        emb = pool(hidden.float(), batch["attention_mask"], self.spec.pooling)
        if self.spec.normalize:
          emb = self._torch.nn.functional.normalize(emb, p=2, dim=-1)
        out[start:start + len(emb)] = emb.cpu().numpy()
    return out

  def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
    return self.encode(texts, self.spec.query_prefix)

  def encode_passages(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
    return self.encode(texts, self.spec.passage_prefix, show_progress=show_progress)
