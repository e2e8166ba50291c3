"""A random tiny policy that reliably calls tools: for rollout integration tests and benchmarks.

An untrained model almost never writes a well-formed `<tool_call>`, so a rollout of it exercises one turn.
`add_token_chain` edits a random `Qwen2ForCausalLM` so that, after certain tokens, chosen next tokens get a
large logit bonus, while every logit keeps the random network's context-dependent part:

  embed[a]          <- s * u_a                       (u_a orthonormal in R^D, one per source token a)
  lm_head[:, b]     += sum_a bonus[a][b] * u_a / sqrt(D)

The residual stream of a token a is s * u_a plus the blocks' (small) outputs, so after the final RMSNorm
(weight 1) h ~= sqrt(D) * u_a and logits_b ~= h . W_random[:, b] + bonus[a][b]. With a bonus of ~12 the
chain is followed with probability ~1 - V * exp(-12), and branch points (two successors with close bonuses)
make sampled rows diverge. The log-probs stay those of a real forward pass, so sampler-vs-learner checks
remain meaningful.

`byte_tokenizer` builds the matching tokenizer: one id per byte plus the Qwen2.5 special tokens and any
extra single-id pieces (e.g. the JSON head of a tool call), so a tool call is a short chain of distinct ids.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                 "<tool_response>", "</tool_response>", "<think>", "</think>", "<answer>", "</answer>")


def byte_tokenizer(specials: Sequence[str] = QWEN_SPECIALS, pieces: Sequence[str] = ()):
  """A `PreTrainedTokenizerFast` with one id per byte, the given special tokens and extra single-id pieces.

  Byte-level with no merges, so decode(encode(s)) == s and decoding a concatenation of id runs equals the
  concatenation of their decodings. `<|endoftext|>` (if present) is the pad token, `<|im_end|>` the EOS.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top

  vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(list(specials))
  if pieces:
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in pieces])
  kwargs = {}
  if "<|endoftext|>" in specials:
    kwargs["pad_token"] = "<|endoftext|>"
  if "<|im_end|>" in specials:
    kwargs["eos_token"] = "<|im_end|>"
  return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def add_token_chain(model, bonus: Mapping[int, Mapping[int, float]], *, seed: int = 0,
                    embed_scale: float | None = None, block_gain: float = 1.0) -> None:
  """Edits `model` (a `Qwen2ForCausalLM` with an untied head) in place; see the module docstring.

  Args:
    model: the policy; `model.model.embed` [V, D] and `model.lm_head` [D, V] are rewritten.
    bonus: `bonus[a][b]` is the logit added to token b whenever the current token is a.
    seed: for the orthonormal codes u_a.
    embed_scale: s, the norm of a source token's embedding (default sqrt(D): RMS 1, like the blocks' input).
    block_gain: multiplies every weight matrix of the decoder blocks; > 1 makes the logits depend more on
      the context (4 moves a chained token's log-prob from ~-1e-3 to ~-0.05 at hidden 64), so a position or
      cache error shows up in log-prob comparisons.
  """
  if model.config.tie_word_embeddings:
    raise ValueError("add_token_chain needs an untied LM head (config.tie_word_embeddings=False)")
  vocab, dim = model.model.embed[...].shape
  sources = sorted(bonus)
  if len(sources) > dim:
    raise ValueError(f"{len(sources)} source tokens need hidden_size >= {len(sources)}, got {dim}")
  bad = [t for a in sources for t in (a, *bonus[a]) if not 0 <= t < vocab]
  if bad:
    raise ValueError(f"token ids {bad} are outside the vocabulary [0, {vocab})")
  rng = np.random.default_rng(seed)
  codes, _ = np.linalg.qr(rng.standard_normal((dim, len(sources))))  # [D, S], orthonormal columns
  scale = math.sqrt(dim) if embed_scale is None else embed_scale
  embed = np.array(model.model.embed[...], np.float32)
  head = np.array(model.lm_head[...], np.float32)
  for k, a in enumerate(sources):
    embed[a] = scale * codes[:, k]
    for b, value in bonus[a].items():
      head[:, b] += value * codes[:, k] / math.sqrt(dim)
  if block_gain != 1.0:
    blocks = nnx.state(model.model.layers, nnx.Param)
    nnx.update(model.model.layers, jax.tree.map(lambda w: w * block_gain if w.ndim >= 2 else w, blocks))
  dtype = model.model.embed[...].dtype
  model.model.embed[...] = jnp.asarray(embed, dtype)
  model.lm_head[...] = jnp.asarray(head, dtype)


def chain_bonus(ids: Sequence[int], value: float) -> dict[int, dict[int, float]]:
  """`{ids[i]: {ids[i+1]: value}}`: follow `ids` in order (each id may appear once as a source)."""
  if len(set(ids[:-1])) != len(ids) - 1:
    raise ValueError(f"a chain's source ids must be distinct, got {list(ids)}")
  return {int(a): {int(b): value} for a, b in zip(ids[:-1], ids[1:])}


def merge_bonus(*parts: Mapping[int, Mapping[int, float]]) -> dict[int, dict[int, float]]:
  """Union of bonus tables; a source appearing in several parts gets all their successors (a branch)."""
  out: dict[int, dict[int, float]] = {}
  for part in parts:
    for a, succ in part.items():
      out.setdefault(int(a), {}).update({int(b): float(v) for b, v in succ.items()})
  return out

