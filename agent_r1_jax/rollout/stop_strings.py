"""Stop strings -> the token-id sequences the sampler stops on, for a given tokenizer.

A turn ends on `<|im_end|>`, on `</tool_call>` when a turn holds one call, and on `<|endoftext|>`
(`turn_stop_sequences`). In Qwen2.5's vocabulary each is one special id; in others (SmolLM2's, for one)
`</tool_call>` is several ordinary tokens, `</ tool _ call >`, and the sampler must stop when the last
tokens of a segment spell it (`sampling.stop_sequences`).

Which sequences spell a string: the string's standalone tokenization c = (c_1, ..., c_L) (`encode(text)`
without special tokens) is how a byte-level BPE writes it at a pre-token boundary, e.g. after a newline:
`...}}\\n</tool_call>` ends in exactly c. Inside running text the boundary pieces can merge with their
neighbours (SmolLM2: `} </tool_call>` ends in `Ġ</ tool _ call >`, `</tool_call>.` in `... call >.`), so with
`variants=True` (default) a multi-token string also stops on

  (f, c_2, ..., c_{L-1}, l)  for every ordinary vocabulary piece f ending with c_1's piece and every piece l
  starting with c_L's piece,

compared in the tokenizer's piece alphabet (`convert_ids_to_tokens`; byte-level BPEs spell each byte as one
symbol, so "ends with" there is "ends with" on the text). That covers the in-context spellings the
tokenizer itself produces when the string's interior pieces do not merge (they are word / punctuation runs
of their own). A spelling outside this set (a non-canonical split the model happens to sample) does not stop
the segment on device; the env still parses the turn as text, so it is read correctly, only the segment runs
on to the next stop or its budget. A one-token string (a special token) is that token alone: nothing merges
into a special token.
"""

from __future__ import annotations

from typing import Any, Sequence

TURN_END = "<|im_end|>"
TOOL_CALL_CLOSE = "</tool_call>"
END_OF_TEXT = "<|endoftext|>"


def turn_stop_strings(parallel_tool_calls: bool) -> tuple[str, ...]:
  """The strings a sampled turn ends on: the turn end, and `</tool_call>` when a turn holds one call (with
  parallel calls the model closes the turn itself after writing every call)."""
  return (TURN_END,) if parallel_tool_calls else (TURN_END, TOOL_CALL_CLOSE)


def token_sequences(tokenizer: Any, text: str, *, variants: bool = True) -> tuple[tuple[int, ...], ...]:
  """The id sequences that spell `text` at the end of a segment: its standalone tokenization first, then
  (multi-token strings, `variants=True`) the boundary-merged spellings described in the module docstring.

  Raises ValueError when `text` encodes to nothing.
  """
  canonical = tuple(int(i) for i in tokenizer.encode(text, add_special_tokens=False))
  if not canonical:
    raise ValueError(f"the tokenizer encodes the stop string {text!r} to no tokens")
  if len(canonical) == 1 or not variants:
    return (canonical,)
  pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
  special = set(int(i) for i in getattr(tokenizer, "all_special_ids", ()))
  special |= set(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}))
  first, last = pieces[canonical[0]], pieces[canonical[-1]]
  ordinary = lambda i, p: isinstance(p, str) and i not in special  # noqa: E731
  firsts = [canonical[0]] + [i for i, p in enumerate(pieces)
                             if ordinary(i, p) and p != first and p.endswith(first)]
  lasts = [canonical[-1]] + [i for i, p in enumerate(pieces)
                             if ordinary(i, p) and p != last and p.startswith(last)]
  middle = canonical[1:-1]
  return tuple((f, *middle, l) for f in firsts for l in lasts)


def turn_stop_sequences(tokenizer: Any, parallel_tool_calls: bool, *, end_of_text: bool = True,
                        variants: bool = True) -> tuple[tuple[int, ...], ...]:
  """Every id sequence a turn stops on (`turn_stop_strings`, plus `<|endoftext|>` when `end_of_text`), in
  order, duplicates dropped: what `Sampler(stop_sequences=...)` takes."""
  texts = turn_stop_strings(parallel_tool_calls) + ((END_OF_TEXT,) if end_of_text else ())
  seqs = [s for text in texts for s in token_sequences(tokenizer, text, variants=variants)]
  return tuple(dict.fromkeys(seqs))


def standalone_ids(tokenizer: Any, texts: Sequence[str] = (TURN_END, TOOL_CALL_CLOSE)
                   ) -> dict[str, tuple[int, ...]]:
  """Each string's standalone tokenization (the first of its `token_sequences`): what `validation.check_sampler`
  looks for among a sampler's stop sequences."""
  return {text: token_sequences(tokenizer, text, variants=False)[0] for text in texts}


__all__ = ["END_OF_TEXT", "TOOL_CALL_CLOSE", "TURN_END", "standalone_ids", "token_sequences",
           "turn_stop_sequences", "turn_stop_strings"]
