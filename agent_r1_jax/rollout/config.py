"""Limits of a multi-turn rollout (`RolloutConfig`), checked once at construction."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from agent_r1_jax.sampling.buckets import prompt_bucket


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Static limits of one rollout; every knob a researcher tunes lives here (mirrored in configs/).

  Attributes:
    max_prompt_length: P, the static prompt width; prompts are left-padded to it.
    max_response_length: R, the static response width: all assistant turns and observations of a row.
    max_turns: assistant turns per row (a turn = one sampled segment).
    max_new_tokens_per_turn: the sampler's budget for one segment.
    max_context_length: cap on prompt + response real tokens of a row (the model's context window); the
      effective cap is min(max_context_length, P + R). None means P + R.
    max_observation_tokens: the issue's `max_tool_response_length` counted in tokens: cap on one
      observation as appended to the context; a longer one keeps its first tokens and its last
      `observation_tail_tokens` tokens (the framing that reopens the assistant turn), dropping the middle.
      None means no cap beyond the response budget. (The env separately cuts each tool result to its own
      `max_tool_response_length` characters before framing.)
    observation_tail_tokens: tokens kept from the end of a capped observation; 16 covers the Qwen2.5 closing
      framing `\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n` (10 tokens) plus a short assistant prefix.
    end_of_text_ids: ids that end the whole episode when a turn stops on them (EpisodeStop.EOS), e.g.
      `<|endoftext|>` for models that emit it; each must also be a sampler stop id. The turn-end `<|im_end|>`
      is not one of them: a turn that closes without a tool call is an answer.
  """

  max_prompt_length: int
  max_response_length: int
  max_turns: int
  max_new_tokens_per_turn: int
  max_context_length: int | None = None
  max_observation_tokens: int | None = None
  observation_tail_tokens: int = 16
  end_of_text_ids: tuple[int, ...] = ()

  def __post_init__(self):
    for name in ("max_prompt_length", "max_response_length", "max_turns", "max_new_tokens_per_turn"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"RolloutConfig.{name} must be a positive int, got {value!r}")
    if self.max_context_length is not None and self.max_context_length < 2:
      raise ValueError(f"RolloutConfig.max_context_length must be >= 2 (a prompt token and one action), got "
                       f"{self.max_context_length}")
    if self.max_observation_tokens is not None and self.max_observation_tokens < 1:
      raise ValueError(f"RolloutConfig.max_observation_tokens must be positive or None, got "
                       f"{self.max_observation_tokens}")
    if self.max_observation_tokens is not None and not (
        0 <= self.observation_tail_tokens < self.max_observation_tokens):
      raise ValueError(
          f"RolloutConfig.observation_tail_tokens ({self.observation_tail_tokens}) must be in "
          f"[0, max_observation_tokens={self.max_observation_tokens})")
    object.__setattr__(self, "end_of_text_ids", tuple(int(i) for i in self.end_of_text_ids))

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> RolloutConfig:
    """Builds the limits from a config section (e.g. `config.rollout`, an ml_collections ConfigDict).

    Takes the keys named like this class's fields (unset placeholders count as absent) and leaves the
    rest (samples per prompt, sampling parameters, cache dtype) to the caller.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    values = {}
    for key in section.keys():
      value = section[key]
      if key in names and value is not None:
        values[key] = tuple(value) if key == "end_of_text_ids" else value
    missing = [n for n in ("max_prompt_length", "max_response_length", "max_turns", "max_new_tokens_per_turn")
               if n not in values]
    if missing:
      raise ValueError(f"the rollout config section lacks {missing}; set them (e.g. --config.rollout.{missing[0]}=...)")
    return cls(**values)

  @property
  def context_limit(self) -> int:
    """Effective cap on a row's prompt + response real tokens."""
    full = self.max_prompt_length + self.max_response_length
    return full if self.max_context_length is None else min(self.max_context_length, full)

  @property
  def cache_length(self) -> int:
    """KV-cache slots the sampler needs: the prompt fills its bucket (a power of two >= 16, see
    `sampling.buckets`), then one slot per response token. With P a power of two >= 16 this is P + R."""
    return prompt_bucket(self.max_prompt_length) + self.max_response_length
