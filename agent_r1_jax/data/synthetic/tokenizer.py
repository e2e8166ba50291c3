"""A small byte-level BPE tokenizer for the synthetic world, saved as a standard Hugging Face tokenizer.

Byte-level BPE (the Qwen2 scheme: bytes mapped to printable characters, regex pre-split, no normalisation)
decodes every id sequence back to the exact text, so corpus passages and trajectories round-trip. The Qwen
control tokens are single ids: `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (EOS) as special tokens,
and `<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`, `<think>`, `</think>`, `<answer>`,
`</answer>` as non-special added tokens (so they survive `skip_special_tokens=True`, as `<tool_call>` does in
the real Qwen2.5 tokenizer). The chat template renders the Qwen2.5 layout, including the `# Tools` system block
listing the tool schemas inside `<tools></tools>` and tool results as a user turn of `<tool_response>` blocks,
so the synthetic and real paths share one code path (`AutoTokenizer.from_pretrained`, `apply_chat_template`).
"""

from __future__ import annotations

import json
import pathlib
from typing import Iterable, Sequence

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
              "<answer>", "</answer>")
ALL_CONTROL_TOKENS = SPECIAL_TOKENS + TAG_TOKENS
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Written for this project; its output matches the Qwen2.5-Instruct template for system/user/assistant/tool
# conversations (a test compares the two renderings), except the default system text when none is given.
CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_text = messages[0].content -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_text = '" + DEFAULT_SYSTEM_PROMPT + "' -%}{%- set turns = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' + (fn.arguments | tojson) "
    "+ '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or turns[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or turns[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def render_chat(messages: Sequence[dict], tools: Sequence[dict] | None = None,
                add_generation_prompt: bool = False) -> str:
  """Renders `CHAT_TEMPLATE` without a tokenizer (used to build the tokenizer's own training text)."""
  import jinja2  # pylint: disable=import-outside-toplevel

  env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
  env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
  return env.from_string(CHAT_TEMPLATE).render(messages=list(messages), tools=list(tools) if tools else None,
                                               add_generation_prompt=add_generation_prompt)


def train_tokenizer(texts: Iterable[str], out_dir: str | pathlib.Path, *, vocab_size: int = 4096,
                    min_frequency: int = 2) -> pathlib.Path:
  """Trains a byte-level BPE on `texts` and saves an HF tokenizer directory.

  Args:
    texts: training text (passages, questions, prompts, trajectories).
    out_dir: directory to write (`tokenizer.json`, `tokenizer_config.json` with `chat_template`,
      `chat_template.jinja`, `special_tokens_map.json` as transformers writes them).
    vocab_size: upper bound on the vocabulary (control tokens and the 256 byte symbols included); training
      stops earlier when no pair occurs `min_frequency` times.

  Returns:
    `out_dir` as a path.
  """
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel

  if vocab_size < 256 + len(ALL_CONTROL_TOKENS):
    raise ValueError(f"vocab_size={vocab_size} is too small: byte-level BPE needs at least "
                     f"{256 + len(ALL_CONTROL_TOKENS)} (256 bytes + control tokens)")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                special_tokens=list(ALL_CONTROL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(texts, trainer)
  # The trainer registers every control token as special; tags become ordinary added tokens (same ids).
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])

  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
      additional_special_tokens=["<|im_start|>", "<|im_end|>"], clean_up_tokenization_spaces=False,
      model_max_length=32768)
  fast.chat_template = CHAT_TEMPLATE
  fast.save_pretrained(str(out_dir))
  # Make the directory self-describing for every transformers version: class name and template in the config.
  config_path = out_dir / "tokenizer_config.json"
  config = json.loads(config_path.read_text())
  config.update({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
                 "add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>",
                 "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False,
                 "split_special_tokens": False})
  config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
  return out_dir
