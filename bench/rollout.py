"""Wall-time split of a multi-turn rollout: device generation vs tool time vs host overhead.

Issue 6, "Done means" 4: a 64-row x 5-turn rollout of a small random Qwen2 (made to call `search` every
turn with `add_token_chain`: a random-length "thinking" walk, then a tool call whose query is one of a few
words) against the real `NousToolEnv` + BM25 `WikiSearchTool`. The first rollout compiles; the following
ones are timed. Prints, per timed rollout and as a median:

  generation  sampler calls (prefill, decode segments, observation appends) -- device time on this host
  tools       env.batch_step: parsing the calls and the batched BM25 search
  host        everything else: decode of segments, tokenization of observations, numpy bookkeeping
  host / total, against the target of < 15%.

    python bench/rollout.py                    # defaults: 64 rows, 5 turns
    python bench/rollout.py --rows 16 --turns 3 --repeats 1
    python bench/rollout.py --smoke            # 4 rows, 2 turns, a 1 x 32 model, one timed run: that it runs

Uses the shared wiki sample as the corpus when present (`../shared/data/wiki_corpus/...`), else
synthetic passages. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import numpy as np
from flax import nnx

from agent_r1_jax import paths
from agent_r1_jax.envs import NousToolEnv
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.retrieval import BM25Index, Passage, load_corpus
from agent_r1_jax.rollout import EpisodeStop, RolloutConfig, run_episodes
from agent_r1_jax.sampling import Sampler, SamplingParams
from agent_r1_jax.tools import WikiSearchTool

# The tool-calling random policy the rollout tests use (tests/scripted_policy.py).
sys.path.insert(0, str(paths.REPO_ROOT / "tests"))
from scripted_policy import add_token_chain, byte_tokenizer, chain_bonus, merge_bonus  # noqa: E402

CALL_HEAD = '{"name": "search", "arguments": {"query": "'
CALL_TAIL = '"}}'
THINK_LETTERS = "bcdfghkmqtuvwxz"  # the thinking walk; disjoint from the query words' letters
QUERIES = ("paris", "lyon")  # letters distinct within and across words: each letter has one successor


def policy_bonus(tok, *, think_exit_prob: float = 1 / 16, value: float = 12.0) -> dict[int, dict[int, float]]:
  """Every turn: `<think>` walk over THINK_LETTERS, `</think>`, then a search call for one of QUERIES."""
  one = lambda s: tok.convert_tokens_to_ids(s)  # noqa: E731
  ids = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
  letters = [ids(c)[0] for c in THINK_LETTERS]
  k = len(letters)
  exit_logit = value + float(np.log(think_exit_prob * k / (1 - think_exit_prob)))
  walk = {a: {**{b: value for b in letters}, one("</think>"): exit_logit} for a in letters}
  tables = [{ids("\n")[0]: {one("<think>"): value}}, {one("<think>"): {b: value for b in letters}}, walk,
            {one("</think>"): {one("<tool_call>"): value}}, {one("<tool_call>"): {ids(CALL_HEAD)[0]: value}},
            {ids(CALL_HEAD)[0]: {ids(q[0])[0]: value for q in QUERIES}}]
  for q in QUERIES:
    tables.append(chain_bonus(ids(q) + ids(CALL_TAIL) + [one("</tool_call>")], value))
  return merge_bonus(*tables)


def corpus() -> list[Passage]:
  path = paths.shared_data_dir() / "wiki_corpus" / "flashrag_wiki18_sample_1000.jsonl"
  if path.is_file():
    return load_corpus(path)
  rng = np.random.default_rng(0)
  words = ["paris", "lyon", "river", "city", "france", "museum", "bridge", "tower", "history", "war"]
  return [Passage(str(i), f"Doc {i}", " ".join(rng.choice(words, 60))) for i in range(1000)]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--turns", type=int, default=5)
  parser.add_argument("--new-tokens-per-turn", type=int, default=96)
  parser.add_argument("--response-length", type=int, default=1536)
  parser.add_argument("--prompt-length", type=int, default=64)
  parser.add_argument("--hidden", type=int, default=128)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--top-k", type=int, default=3)
  parser.add_argument("--tool-chars", type=int, default=200, help="env cut of each passage list (characters)")
  parser.add_argument("--repeats", type=int, default=2, help="timed rollouts after the compiling one")
  parser.add_argument("--smoke", action="store_true",
                      help="4 rows x 2 turns of 32 new tokens, a 1 x 32 model, one timed run: checks that it runs")
  args = parser.parse_args()
  if args.smoke:
    args.rows, args.turns, args.new_tokens_per_turn, args.response_length = 4, 2, 32, 512
    args.hidden, args.layers, args.repeats = 32, 1, 1

  tok = byte_tokenizer(pieces=(CALL_HEAD, CALL_TAIL))
  config = Qwen2Config(vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=args.hidden // 4)
  model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
  add_token_chain(model, policy_bonus(tok))
  graphdef, params = nnx.split(model)
  rollout_config = RolloutConfig(max_prompt_length=args.prompt_length, max_response_length=args.response_length,
                                 max_turns=args.turns, max_new_tokens_per_turn=args.new_tokens_per_turn)
  stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>")]
  sampler = Sampler(graphdef, max_cache_length=rollout_config.cache_length, stop_token_ids=stops,
                    pad_id=tok.pad_token_id)
  t0 = time.perf_counter()
  passages = corpus()
  env = NousToolEnv([WikiSearchTool(BM25Index(passages), top_k=args.top_k)],
                    max_tool_response_length=args.tool_chars)
  print(f"corpus: {len(passages)} passages, BM25 built in {time.perf_counter() - t0:.2f}s; model "
        f"{args.layers}x{args.hidden}, vocab {len(tok)}; backend {jax.default_backend()} "
        f"({jax.device_count()} devices)")
  prompts = [f"<|im_start|>user\nQuestion {i}: where is it?<|im_end|>\n<|im_start|>assistant\n"
             for i in range(args.rows)]
  sampling = SamplingParams(temperature=1.0)

  runs = []
  for r in range(args.repeats + 1):
    batch = run_episodes(sampler, params, env, tok, prompts, rollout_config, sampling, jax.random.key(r))
    t = batch.timings
    label = "compile+run" if r == 0 else f"timed run {r}"
    print(f"{label:12s} total {t['total']:7.2f}s | generation {t['generation']:7.2f}s | tools "
          f"{t['tools']:6.2f}s | host {t['host']:6.3f}s ({100 * t['host'] / t['total']:.1f}%: detokenize "
          f"{t['detokenize']:.3f}s, tokenize {t['tokenize']:.3f}s)")
    if r > 0:
      runs.append(t)
  stops_seen = {EpisodeStop(s).name: int(np.sum(batch.stop_reason == s)) for s in np.unique(batch.stop_reason)}
  print(f"last batch: turns/row {batch.num_turns.mean():.2f}, tool calls/row {batch.num_tool_calls.mean():.2f}, "
        f"action tokens/row {batch.action_mask.sum(1).mean():.1f}, observation tokens/row "
        f"{(batch.response_mask - batch.action_mask).sum(1).mean():.1f}, stops {stops_seen}")
  if runs:
    med = {k: statistics.median(t[k] for t in runs) for k in runs[0]}
    share = med["host"] / med["total"]
    print(f"median of {len(runs)} timed runs: total {med['total']:.2f}s = generation "
          f"{100 * med['generation'] / med['total']:.1f}% + tools {100 * med['tools'] / med['total']:.1f}% + "
          f"host {100 * share:.1f}%  (target host < 15%: {'met' if share < 0.15 else 'NOT met'})")
    # The host share depends on how fast the device generates; the absolute cost carries over.
    turns = int(batch.num_turns.max())
    print(f"host overhead per turn: {1000 * med['host'] / turns:.1f} ms for {args.rows} rows; it stays under "
          f"15% as long as generation takes more than {med['host'] / 0.15 - med['host'] - med['tools']:.2f}s "
          f"per rollout")


if __name__ == "__main__":
  main()
