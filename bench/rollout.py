"""The slot engine (`run_slot_episodes`) against the lockstep driver (`run_episodes`) on the same episodes.

Issue 32, "Measurement": both engines run the same greedy episodes, side by side in one process, with a tool whose
latency is injected and turn lengths that vary across rows, at two model sizes:

  tiny   the tiny preset's model and rollout: Qwen2 4 x 128 (MLP 384, 4 heads / 2 KV heads, vocabulary 4096, the
         preset's tokenizer bound), 40 rows, 3 turns of at most 48 new tokens, prompt 64, response 384, context 448,
         observations capped at 128 tokens; float32.
  0.5b   Qwen2.5-0.5B's shape (24 x 896, MLP 4864, 14 heads / 2 KV heads, vocabulary 151936), random weights,
         float32 (XLA:CPU has no fast bfloat16 matmul); fewer rows and shorter turns than a real step so that it
         runs on a CPU in minutes: 16 rows, 3 turns of at most 16 new tokens, response 256, one repeat.
Both models have an untied LM head (the steering below needs one; the tiny preset ties it: same FLOPs).

The policy is a random network steered with `add_token_chain` (tests/scripted_policy.py): a turn that starts after
the character c_L of the "call" alphabet writes c_{L-1} ... c_0, `<tool_call>`, one JSON piece, `</tool_call>`
(L + 3 tokens); after a_L of the "answer" alphabet it writes a_{L-1} ... a_0, `<answer>`, one piece, `</answer>`,
`<|im_end|>` (L + 4 tokens), a final answer. Every token and log-prob is still the network's forward pass. The env
reads L off a call and ends its observation with the next turn's steering character, sigma(L): a seeded draw per L
(an answer with probability 1/3, else a call of uniform length). Each row's first turn is a seeded draw too (a call
with probability 3/4). So rows take 1 to 3 turns of 3 to 48 tokens (tiny), and with greedy decoding both engines
produce the same trajectories: the bench asserts that every episode ended in both and flags any difference in the
generated tokens.

Tool latency (injected into the env; an answer turn has none):
  none        no sleep.
  100ms       every tool call takes 100 ms.
  lognormal   every call draws exp(N(ln 100 ms, 1)): median 100 ms, mean 165 ms, 1 call in 100 above 1 s. The k-th
              call with a given text gets the same draw in every run (seeded by the text and k), so both engines
              wait the same calls.
The calls of one `env.batch_step` run concurrently (as the package's tools do: one batched search, a pool of
sandboxes), so a batch takes its slowest call. The lockstep driver makes one batch_step per turn; the slot engine
one per group of turns that end in the same decode chunk, on `--tool-workers` threads (default: one per slot, so
no call waits for a thread).

Per preset and latency: the lockstep driver, and the slot engine with as many slots as rows and with a quarter as
many, each at the preset's decode chunks (tiny: 16, 32 and 64 tokens, 64 being more than a turn's budget; 0.5b: 8
and 16), alternated `--repeats` times after compiling runs; the best of the repeats is kept. The time is the
engine's `timings["total"]` (the env probe skipped and the weights prepared once outside, for both). Printed per
engine:

  episodes/s, tokens/s   finished episodes and generated (action) tokens over that time.
  occupancy       generated tokens / (rows the decode program computes x decode steps run), the same measure for
                  both: the lockstep driver's program computes the batch bucket (40 rows -> 64) for the longest
                  turn of each turn index; the slot engine's N slots for each chunk's longest row. The engine's own
                  `stats["slot_occupancy"]` (fraction of slots decoding, per chunk) is shown beside it.
  tool hidden     (tool time - tools_blocked) / tool time, the engine's figures; tool time sums every call, so
                  calls overlapping each other count as hidden too. `tool wall time ... hidden` is the stricter
                  share of the tools' wall time (the union of the env calls' intervals) that the host spent not
                  blocked on them, i.e. decoding or extending. The lockstep driver hides none.
  peak memory     the largest rollout program's XLA footprint (compiled `memory_analysis()` at the run's shapes:
                  arguments + outputs - donated + temporaries, as the dry run counts it) minus the weights, which
                  are the same in both engines: the KV cache, logits and temporaries. Device memory (on CPU, host
                  memory), not a process RSS. Lockstep: prefill, extend, decode; slots: slot_extend, decode_chunk.
  profile         the device calls (measurement hooks around `Sampler` / `SlotDecoder` methods): decode segments or
                  chunks (steps, milliseconds) and prefills or extends (milliseconds; an extend is waited for so its
                  time is its own; the lockstep driver's extends are inside its `continue_` segments).

Then the ratio lines (slot engine / lockstep driver, measured in this run), a table of them, and the issue's
targets per slot count at its best chunk (reported, not asserted). Timings on a shared machine are noisy: the
engines are alternated so they see the same background load, and the machine's matmul rate and load average are
printed with them.

    python bench/rollout.py                  # tiny and 0.5B shapes (about 25 minutes on 2 cores)
    python bench/rollout.py --skip-0.5b      # tiny only, 3 repeats (about 5 minutes)
    python bench/rollout.py --smoke          # a 1 x 64 model, 4 rows, one repeat, no 0.5B: that it runs

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import threading
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agent_r1_jax import paths
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.rollout import EpisodeStop, RolloutConfig, run_episodes, run_slot_episodes, stop_strings
from agent_r1_jax.sampling import Sampler, SamplingParams, buckets
from agent_r1_jax.sampling import slots as slots_lib

# The steerable random policy the rollout tests use (tests/scripted_policy.py).
sys.path.insert(0, str(paths.REPO_ROOT / "tests"))
from scripted_policy import add_token_chain, byte_tokenizer, chain_bonus, merge_bonus  # noqa: E402

CALL_PIECE = '{"name": "search", "arguments": {"query": "capital"}}'
ANSWER_PIECE = "Paris"
# Printable single-byte characters, split into the two countdown alphabets (call first, answer after).
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&()*+,-./:;=?@[]^_{|}~"
GREEDY = SamplingParams(greedy=True)
LATENCIES = ("none", "100ms", "lognormal")
MEDIAN_S = 0.1
LOG_SIGMA = 1.0


@dataclasses.dataclass(frozen=True)
class Preset:
  name: str
  hidden: int
  intermediate: int
  layers: int
  heads: int
  kv_heads: int
  vocab: int
  rows: int
  turns: int
  new_tokens: int  # per turn
  prompt: int
  response: int
  context: int
  observation_cap: int
  content_chars: tuple[int, int]  # tool result length range (characters = tokens)
  chunks: tuple[int, ...]  # the slot engine's decode chunks to run
  rope_theta: float = 10000.0


TINY = Preset("tiny", hidden=128, intermediate=384, layers=4, heads=4, kv_heads=2, vocab=4096, rows=40, turns=3,
              new_tokens=48, prompt=64, response=384, context=448, observation_cap=128, content_chars=(20, 60),
              chunks=(16, 32, 64))
HALF_B = Preset("0.5b", hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, rows=16,
                turns=3, new_tokens=16, prompt=64, response=256, context=320, observation_cap=96,
                content_chars=(10, 30), chunks=(8, 16), rope_theta=1e6)
SMOKE = Preset("smoke", hidden=64, intermediate=128, layers=1, heads=4, kv_heads=2, vocab=512, rows=4, turns=3,
               new_tokens=16, prompt=64, response=256, context=320, observation_cap=96, content_chars=(10, 30),
               chunks=(8,))


# --------------------------------------------------------------------------------------------------
# The steered policy and its env.


class Workload:
  """Tokenizer, steering tables and the env's successor function for one preset."""

  def __init__(self, preset: Preset, seed: int = 0):
    self.preset = preset
    self.seed = seed
    self.max_call = preset.new_tokens - 3  # a call turn is L + 3 tokens
    self.max_answer = max(preset.new_tokens // 2 - 4, 0)  # an answer turn is L + 4 tokens
    need = self.max_call + 1 + self.max_answer + 1
    if need > len(ALPHABET):
      raise ValueError(f"{preset.new_tokens} new tokens per turn need {need} steering characters, have "
                       f"{len(ALPHABET)}")
    self.call_letters = ALPHABET[:self.max_call + 1]
    self.answer_letters = ALPHABET[self.max_call + 1:need]
    self.tok = byte_tokenizer(pieces=(CALL_PIECE, ANSWER_PIECE))
    if len(self.tok) > preset.vocab:
      raise ValueError(f"the tokenizer has {len(self.tok)} ids, more than the model's vocabulary {preset.vocab}")
    rng = np.random.default_rng(seed)
    self.first = [self._draw(rng, call_prob=0.75) for _ in range(preset.rows)]
    # sigma(L): the turn after a call of length L (a seeded draw per L, so every run and engine agrees).
    self.successor = {L: self._draw(np.random.default_rng([seed, 1, L]), call_prob=2 / 3)
                      for L in range(self.max_call + 1)}
    self.content = {L: self._content(L) for L in range(self.max_call + 1)}

  def _draw(self, rng: np.random.Generator, call_prob: float) -> str:
    if rng.random() < call_prob:
      return self.call_letters[rng.integers(0, self.max_call + 1)]
    return self.answer_letters[rng.integers(0, self.max_answer + 1)]

  def _content(self, L: int) -> str:
    lo, hi = self.preset.content_chars
    n = int(np.random.default_rng([self.seed, 2, L]).integers(lo, hi + 1))
    return (f"Result {L}: " + "Paris is the capital and largest city of France. " * 4)[:n]

  def one(self, text: str) -> int:
    (token,) = self.tok.encode(text, add_special_tokens=False)
    return token

  def bonus(self, value: float = 12.0) -> dict[int, dict[int, float]]:
    one = self.one
    call_tail = [one("<tool_call>"), one(CALL_PIECE), one("</tool_call>")]
    answer_tail = [one("<answer>"), one(ANSWER_PIECE), one("</answer>"), one("<|im_end|>")]
    calls = [one(c) for c in self.call_letters]
    answers = [one(c) for c in self.answer_letters]
    return merge_bonus(chain_bonus(calls[::-1] + call_tail, value), chain_bonus(answers[::-1] + answer_tail, value))

  def prompts(self) -> list[str]:
    return [f"<|im_start|>user\nQuestion {i}: where is it?<|im_end|>\n<|im_start|>assistant\n{steer}"
            for i, steer in enumerate(self.first)]

  def observation(self, L: int) -> str:
    return (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{self.content[L]}\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\n{self.successor[L]}")

  def expected_turns(self, steer: str) -> list[int]:
    """The turn lengths of an episode that starts after `steer` (the env's plan, up to max_turns)."""
    out = []
    for _ in range(self.preset.turns):
      if steer in self.answer_letters:
        return out + [self.answer_letters.index(steer) + 4]
      L = self.call_letters.index(steer)
      out.append(L + 3)
      steer = self.successor[L]
    return out


class SteerEnv:
  """A turn closing `</tool_call>` is a call: its length L (characters before `<tool_call>`) picks the result and the
  next turn's steering character; anything else is the final answer. Tool latency is injected per call (see the
  module docstring); the env records each batch_step's interval."""

  def __init__(self, workload: Workload, latency: str):
    if latency not in LATENCIES:
      raise ValueError(f"latency must be one of {LATENCIES}, got {latency!r}")
    self.workload, self.latency = workload, latency
    self.lock = threading.Lock()
    self.seen: dict[str, int] = {}
    self.intervals: list[tuple[float, float]] = []
    self.calls = 0

  def _delay(self, text: str) -> float:
    if self.latency == "none":
      return 0.0
    if self.latency == "100ms":
      return MEDIAN_S
    with self.lock:
      k = self.seen.get(text, 0)
      self.seen[text] = k + 1
    rng = np.random.default_rng([self.workload.seed, 3, zlib.crc32(text.encode()), k])
    return float(MEDIAN_S * np.exp(LOG_SIGMA * rng.standard_normal()))

  def step(self, text: str) -> tuple[str, list[bool], bool]:
    if not text.endswith("</tool_call>"):
      return "", [], False
    L = len(text.split("<tool_call>")[0])
    return self.workload.observation(L), [True], True

  def batch_step(self, texts):
    start = time.perf_counter()
    delays = [self._delay(t) for t in texts if t.endswith("</tool_call>")]
    if delays and max(delays) > 0:
      time.sleep(max(delays))  # the calls of one batch run concurrently
    out = [self.step(t) for t in texts]
    with self.lock:
      self.intervals.append((start, time.perf_counter()))
      self.calls += len(delays)
    return out

  def wall_seconds(self) -> float:
    """Length of the union of the batch_step intervals: wall time during which some tool call ran."""
    total, end = 0.0, -np.inf
    for a, b in sorted(self.intervals):
      if b > end:
        total += b - max(a, end)
        end = b
    return total


def build(preset: Preset, seed: int = 0):
  workload = Workload(preset, seed)
  config = Qwen2Config(vocab_size=preset.vocab, hidden_size=preset.hidden, intermediate_size=preset.intermediate,
                       num_hidden_layers=preset.layers, num_attention_heads=preset.heads,
                       num_key_value_heads=preset.kv_heads, head_dim=preset.hidden // preset.heads,
                       rope_theta=preset.rope_theta)
  model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(seed))
  add_token_chain(model, workload.bonus())
  graphdef, params = nnx.split(model)
  del model
  rollout = RolloutConfig(max_prompt_length=preset.prompt, max_response_length=preset.response,
                          max_turns=preset.turns, max_new_tokens_per_turn=preset.new_tokens,
                          max_context_length=preset.context, max_observation_tokens=preset.observation_cap)
  sampler = Sampler(graphdef, max_cache_length=rollout.cache_length, pad_id=workload.tok.pad_token_id,
                    stop_sequences=stop_strings.turn_stop_sequences(workload.tok, False))
  return workload, sampler, sampler.prepare(params), rollout


# --------------------------------------------------------------------------------------------------
# Measurement.


@contextlib.contextmanager
def patched(cls, name, wrapper):
  """`cls.name` replaced by `wrapper(original)` inside the block (a measurement hook; restored on exit)."""
  original = getattr(cls, name)
  setattr(cls, name, wrapper(original))
  try:
    yield
  finally:
    setattr(cls, name, original)


class Profile:
  """Device calls of one rollout: decode calls (segments / chunks: the steps each ran, i.e. its longest row's
  count, and seconds) and extends or prefills (seconds, waited for, so a decode's time is its own)."""

  def __init__(self):
    self.steps: list[int] = []
    self.decode_seconds: list[float] = []
    self.append_seconds: list[float] = []

  def _decode(self, original, counts):
    def wrapper(obj, *args, **kwargs):
      start = time.perf_counter()
      state, out = original(obj, *args, **kwargs)  # returns host arrays: the call has finished
      self.decode_seconds.append(time.perf_counter() - start)
      self.steps.append(int(np.max(counts(out), initial=0)))
      return state, out
    return wrapper

  def _append(self, original):
    def wrapper(obj, *args, **kwargs):
      start = time.perf_counter()
      state = original(obj, *args, **kwargs)
      jax.block_until_ready(state.cache)
      self.append_seconds.append(time.perf_counter() - start)
      return state
    return wrapper

  @contextlib.contextmanager
  def slots(self):
    cls = slots_lib.SlotDecoder
    with patched(cls, "decode", lambda f: self._decode(f, lambda chunk: chunk.counts)), \
         patched(cls, "extend", self._append):
      yield self

  @contextlib.contextmanager
  def lockstep(self):
    # continue_ = extend + decode in one call; its extend is timed with its decode.
    with patched(Sampler, "decode", lambda f: self._decode(f, lambda seg: seg.lengths)), \
         patched(Sampler, "continue_", lambda f: self._decode(f, lambda seg: seg.lengths)), \
         patched(Sampler, "prefill", self._append):
      yield self

  def line(self, what: str) -> str:
    steps = sum(self.steps)
    return (f"{len(self.steps)} {what} ({steps} steps) {1000 * np.sum(self.decode_seconds):.0f} ms = "
            f"{1000 * np.sum(self.decode_seconds) / max(steps, 1):.2f} ms/step | {len(self.append_seconds)} "
            f"{'extends' if what == 'chunks' else 'prefill'} {1000 * np.sum(self.append_seconds):.0f} ms")


def turn_runs(batch) -> list[list[int]]:
  """Per row, the lengths of its turns (the action runs between observations)."""
  out = []
  for b in range(batch.action_mask.shape[0]):
    mask = batch.action_mask[b, :batch.response_mask[b].sum()]
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    out.append((edges[1::2] - edges[::2]).tolist())
  return out


@dataclasses.dataclass
class Run:
  slots: int  # 0: the lockstep driver
  chunk: int
  seconds: float
  episodes: int  # rows whose episode ended
  tokens: int  # generated (action) tokens
  program_rows: int  # rows the decode program computes
  profile: Profile
  engine_occupancy: float | None
  tools: float
  blocked: float
  tool_wall: float
  timings: dict

  @property
  def name(self) -> str:
    return "lockstep" if not self.slots else f"{self.slots} slots, chunk {self.chunk}"

  @property
  def occupancy(self) -> float:
    return self.tokens / (self.program_rows * max(sum(self.profile.steps), 1))

  def hidden(self) -> float | None:
    """(tool time - tools_blocked) / tool time (>= 0: waking from a wait can outlast the call by a hair); None
    without tool time to speak of."""
    return max(self.tools - self.blocked, 0.0) / self.tools if self.tools > 1e-3 else None

  def wall_hidden(self) -> float | None:
    return max(self.tool_wall - self.blocked, 0.0) / self.tool_wall if self.tool_wall > 1e-3 else None


def finished(batch) -> int:
  return int(np.sum(batch.stop_reason != EpisodeStop.NONE))


def lockstep_run(workload, sampler, params, rollout, latency) -> tuple[Run, object]:
  env = SteerEnv(workload, latency)
  with Profile().lockstep() as profile:
    batch = run_episodes(sampler, params, env, workload.tok, workload.prompts(), rollout, GREEDY, jax.random.key(0),
                         check_env=False, prepare_params=False)
  t = batch.timings
  run = Run(0, 0, t["total"], finished(batch), int(batch.action_mask.sum()), buckets.batch_bucket(workload.preset.rows),
            profile, None, t["tools"], t["tools"], env.wall_seconds(), t)
  return run, batch


def slot_run(workload, sampler, params, rollout, latency, slots, chunk, workers) -> tuple[Run, object]:
  env = SteerEnv(workload, latency)
  with Profile().slots() as profile:
    batch = run_slot_episodes(sampler, params, env, workload.tok, workload.prompts(), rollout, GREEDY,
                              jax.random.key(0), slots_per_device=slots, decode_chunk=chunk,
                              tool_workers=workers or slots, check_env=False, prepare_params=False)
  t = batch.timings
  run = Run(slots, chunk, t["total"], finished(batch), int(batch.action_mask.sum()), slots, profile,
            batch.stats["slot_occupancy"], t["tools"], t["tools_blocked"], env.wall_seconds(), t)
  return run, batch


def weight_bytes(params) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


def footprint(lowered) -> int:
  """A compiled program's bytes: arguments + outputs - donated + temporaries (as the dry run counts them)."""
  m = lowered.compile().memory_analysis()
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def appends(batch) -> tuple[int, int]:
  """The longest prompt and the longest observation of a rollout (tokens)."""
  prompt = int(batch.prompt_mask.sum(1).max())
  observation = 0
  for b in range(batch.response_mask.shape[0]):
    obs = (batch.response_mask[b] - batch.action_mask[b])[:batch.response_mask[b].sum()]
    edges = np.flatnonzero(np.diff(np.concatenate([[0], obs, [0]])))
    observation = max([observation, *(edges[1::2] - edges[::2]).tolist()])
  return prompt, observation


def peak_memory(sampler, params, batch, width: int, slots: int, chunk: int) -> dict[str, int]:
  """Per program of a rollout at `batch`'s shapes (lockstep when slots = 0): its footprint minus the weights."""
  prompt, observation = appends(batch)
  weights = weight_bytes(params)
  if not slots:
    lowered = sampler.lower(params, rows=batch.action_mask.shape[0], prompt_length=prompt,
                            extend_length=observation, width=width, sampling=GREEDY)
  else:
    # Over every slot, and compacted to the widest gather (half the slots): the gathered rows are extra memory.
    decoder = slots_lib.SlotDecoder(sampler, slots_per_device=slots, decode_chunk=chunk)
    peaks = {}
    for busiest in (None, slots // 2):
      if busiest == 0:
        continue
      lowered = decoder.lower(params, extend_length=max(prompt, observation), sampling=GREEDY, busiest=busiest)
      for name, low in lowered.items():
        peaks[name] = max(peaks.get(name, 0), footprint(low) - weights)
    return peaks
  return {name: footprint(low) - weights for name, low in lowered.items()}


def matmul_gflops(n: int, repeats: int = 5) -> float:
  """GFLOP/s of a jitted n x n float32 matmul on this machine (median of `repeats`)."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
  mm = jax.jit(jnp.matmul)
  mm(a, a).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    mm(a, a).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2.0 * n ** 3 / float(np.median(times)) / 1e9


def mib(x: float) -> str:
  return f"{x / 2 ** 20:.1f} MiB"


def pct(x: float | None) -> str:
  return "n/a" if x is None else f"{100 * x:.0f}%"


# --------------------------------------------------------------------------------------------------
# The bench.


def describe(workload: Workload, batch, rollout: RolloutConfig) -> str:
  runs = turn_runs(batch)
  lengths = [n for r in runs for n in r]
  turns = np.bincount([len(r) for r in runs], minlength=rollout.max_turns + 1)[1:]
  stops = {EpisodeStop(s).name: int(np.sum(batch.stop_reason == s)) for s in np.unique(batch.stop_reason)}
  planned = [workload.expected_turns(s) for s in workload.first]
  plan = "as planned" if planned == runs else f"NOT as planned ({sum(p != r for p, r in zip(planned, runs))} rows)"
  per_turn_max = [max((r[t] for r in runs if len(r) > t), default=0) for t in range(rollout.max_turns)]
  return (f"episodes: {len(runs)} rows, 1/2/3 turns: {'/'.join(str(int(x)) for x in turns)}, turn lengths "
          f"{min(lengths)}-{max(lengths)} (mean {np.mean(lengths):.1f}), generated tokens "
          f"{int(batch.action_mask.sum())}, tool calls {int(batch.num_tool_calls.sum())}, stops {stops}; trajectories "
          f"{plan}. Decode steps: the lockstep driver runs the longest turn of each turn index, {per_turn_max} = "
          f"{sum(per_turn_max)} steps over "
          f"{buckets.batch_bucket(len(runs))} rows (the batch bucket of {len(runs)}); the longest episode is "
          f"{max(sum(r) for r in runs)} tokens, the fewest steps slots can take with one episode each")


def run_preset(preset: Preset, args) -> list[dict]:
  t0 = time.perf_counter()
  workload, sampler, params, rollout = build(preset)
  chunks = args.decode_chunks or preset.chunks
  configs = [(n, c) for n in (preset.rows, max(1, preset.rows // 4)) for c in chunks]
  c = sampler.config
  print(f"\n== {preset.name}: Qwen2 {c.num_hidden_layers} x {c.hidden_size} (MLP {c.intermediate_size}, "
        f"{c.num_attention_heads}/{c.num_key_value_heads} heads, vocabulary {c.vocab_size}, untied head), float32, "
        f"{weight_bytes(params) / 2 ** 20:.0f} MiB of weights; {preset.rows} rows, {preset.turns} turns of <= "
        f"{preset.new_tokens} new tokens, prompt {preset.prompt}, response {preset.response}, context "
        f"{preset.context}, KV cache {sampler.max_cache_length} per row; slot engine: {preset.rows} and "
        f"{max(1, preset.rows // 4)} slots x decode chunks {list(chunks)}, tool threads "
        f"{args.tool_workers or 'one per slot'}; built in {time.perf_counter() - t0:.1f}s", flush=True)

  t0 = time.perf_counter()
  _, ref = lockstep_run(workload, sampler, params, rollout, "none")  # compiles the lockstep programs
  print(describe(workload, ref, rollout))
  # Every extend bucket and compacted width a slot run can need (a prompt or an observation, alone or with longer
  # ones), so that no timed run compiles: which appends share an extend depends on the tools' timing.
  shortest = min(int(ref.prompt_mask.sum(1).min()), preset.content_chars[0])
  widest = buckets.slot_extend_bucket(max(appends(ref)))
  for n, chunk in configs:
    decoder = slots_lib.SlotDecoder(sampler, slots_per_device=n, decode_chunk=chunk)
    state = decoder.init()
    for m in sorted({decoder.compact_width(k) for k in range(1, n + 1)}):  # every compacted width of extend, decode
      tb = buckets.slot_extend_bucket(shortest)
      while tb <= widest:
        state = decoder.extend(params, state, [[0] * tb] * m + [[] for _ in range(n - m)], np.arange(n) < m)
        tb = buckets.slot_extend_bucket(tb + 1)
      budgets = (np.arange(n) < m).astype(np.int64)
      state, _ = decoder.decode(params, state, budgets, budgets > 0, np.arange(n), GREEDY, jax.random.key(0))
    jax.block_until_ready(state.cache)
  for n, chunk in configs:
    slot_run(workload, sampler, params, rollout, "none", n, chunk, args.tool_workers)
  print(f"compiled in {time.perf_counter() - t0:.1f}s", flush=True)

  t0 = time.perf_counter()
  width = rollout.max_new_tokens_per_turn  # the lockstep decode's width (its first turn's budget)
  memory = {(0, 0): peak_memory(sampler, params, ref, width, 0, 0)}
  for n, chunk in configs:
    memory[n, chunk] = peak_memory(sampler, params, ref, width, n, chunk)
  peak = {k: max(v.values()) for k, v in memory.items()}
  print(f"peak memory (compiled programs' memory_analysis: arguments + outputs - donated + temporaries, minus the "
        f"{mib(weight_bytes(params))} of weights; {time.perf_counter() - t0:.1f}s):")
  for (n, chunk), programs in memory.items():
    name = "lockstep" if not n else f"{n} slots, chunk {chunk}"
    print(f"   {name:20s} peak {mib(peak[n, chunk])}: " + ", ".join(f"{p} {mib(b)}" for p, b in programs.items()))

  rows = []
  for latency in args.latencies:
    best: dict[tuple[int, int], Run] = {}
    for _ in range(args.repeats):
      for n, chunk in [(0, 0)] + configs:  # alternated, so every engine sees the same background load
        if n == 0:
          run, _ = lockstep_run(workload, sampler, params, rollout, latency)
        else:
          run, _ = slot_run(workload, sampler, params, rollout, latency, n, chunk, args.tool_workers)
        if (n, chunk) not in best or run.seconds < best[n, chunk].seconds:
          best[n, chunk] = run
    base = best[0, 0]
    print(f"-- {preset.name}, tool latency {latency} (best of {args.repeats}):")
    for key in [(0, 0)] + configs:
      r = best[key]
      # The same greedy episodes: every episode ended in both engines, with the same generated tokens.
      assert r.episodes == base.episodes == preset.rows, (r.name, r.episodes, base.episodes, preset.rows)
      same = "" if r.tokens == base.tokens else f" (NOT the lockstep driver's {base.tokens} tokens)"
      engine_occ = "" if r.engine_occupancy is None else f" (engine stat {r.engine_occupancy:.2f})"
      print(f"   {r.name:20s} {r.seconds:7.3f}s | {r.episodes / r.seconds:7.2f} episodes/s | "
            f"{r.tokens / r.seconds:8.1f} tokens/s{same} | occupancy {r.occupancy:.2f}{engine_occ} | tools "
            f"{r.tools:.2f}s, blocked {r.blocked:.2f}s, hidden {pct(r.hidden())} (tool wall time {r.tool_wall:.2f}s, "
            f"{pct(r.wall_hidden())} hidden) | host {r.timings['host']:.3f}s")
      print(f"   {'':20s} {r.profile.line('segments' if not r.slots else 'chunks')}")
    for n, chunk in configs:
      r = best[n, chunk]
      row = dict(preset=preset.name, latency=latency, slots=n, chunk=chunk, rows=preset.rows,
                 episodes=(r.episodes / r.seconds) / (base.episodes / base.seconds),
                 tokens=(r.tokens / r.seconds) / (base.tokens / base.seconds),
                 occupancy=r.occupancy / base.occupancy, hidden=r.hidden(), memory=peak[n, chunk] / peak[0, 0])
      rows.append(row)
      print(f"ratio {preset.name} {latency:9s} {n:3d}/{preset.rows} slots chunk {chunk:3d}: episodes/s "
            f"{row['episodes']:.2f}x | tokens/s {row['tokens']:.2f}x | occupancy {row['occupancy']:.2f}x | tool time "
            f"hidden {pct(row['hidden'])} (lockstep 0%) | peak memory {row['memory']:.3f}x", flush=True)
  return rows


def targets(rows: list[dict], preset: str) -> str:
  """The issue's targets at `preset`, for each slot count at its best chunk (reported, not asserted)."""
  parts = []
  for full, label in ((True, "as many slots as rows"), (False, "1/4 as many")):
    mine = [r for r in rows if r["preset"] == preset and (r["slots"] == r["rows"]) == full]
    for latency, goal in (("100ms", 2.0), ("none", 1.3)):
      some = [r for r in mine if r["latency"] == latency]
      if some:
        r = max(some, key=lambda r: r["episodes"])
        parts.append(f"{label}, {latency} tools: {r['episodes']:.2f}x (chunk {r['chunk']}) vs >= {goal}x "
                     f"{'met' if r['episodes'] >= goal else 'NOT met'}")
    if mine:
      worst = max(r["memory"] for r in mine)
      goal = "<= 1x (0.1% slack)" if full else "< 1x"
      ok = worst <= 1.001 if full else worst < 1
      parts.append(f"{label}, peak memory {worst:.3f}x vs {goal} {'met' if ok else 'NOT met'}")
  return "; ".join(parts)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=3, help="timed runs of each engine per setting (best kept)")
  parser.add_argument("--repeats-0.5b", dest="repeats_half", type=int, default=1, help="--repeats for the 0.5B shape")
  parser.add_argument("--decode-chunks", default="", help="comma-separated slot-engine chunk sizes (default: the "
                      "preset's: tiny 16,32,64; 0.5b 8,16)")
  parser.add_argument("--tool-workers", type=int, default=0, help="the slot engine's tool threads (0: one per slot)")
  parser.add_argument("--latencies", default=",".join(LATENCIES), help=f"comma-separated subset of {LATENCIES}")
  parser.add_argument("--skip-0.5b", dest="skip_half", action="store_true", help="the tiny preset only")
  parser.add_argument("--only-0.5b", dest="only_half", action="store_true", help="the 0.5B shape only")
  parser.add_argument("--smoke", action="store_true",
                      help="a 1 x 64 model, 4 rows, one repeat, no 0.5B: checks that the bench runs")
  args = parser.parse_args()
  args.latencies = [x for x in args.latencies.split(",") if x]
  bad = [x for x in args.latencies if x not in LATENCIES]
  if bad:
    parser.error(f"unknown latencies {bad}; use {LATENCIES}")
  args.decode_chunks = tuple(int(x) for x in args.decode_chunks.split(",") if x)
  if args.smoke:
    presets = [(SMOKE, 1)]
  else:
    presets = [(p, r) for p, r in ((TINY, args.repeats), (HALF_B, args.repeats_half))
               if not (p is HALF_B and args.skip_half) and not (p is TINY and args.only_half)]

  n = 512 if args.smoke else 2048
  gflops = matmul_gflops(n, repeats=2 if args.smoke else 5)
  print(f"machine: float32 {n}x{n} matmul {gflops:.1f} GFLOP/s (jitted jnp); backend {jax.default_backend()}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
  rows = []
  for preset, repeats in presets:
    args.repeats = repeats
    rows += run_preset(preset, args)

  print(f"\nslot engine / lockstep driver, measured side by side in this run (float32 matmul {gflops:.1f} GFLOP/s; "
        f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}):")
  print("| model | tool latency | slots / rows | chunk | episodes/s | tokens/s | occupancy | tool time hidden | "
        "peak memory |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['preset']} | {r['latency']} | {r['slots']} / {r['rows']} | {r['chunk']} | {r['episodes']:.2f}x | "
          f"{r['tokens']:.2f}x | {r['occupancy']:.2f}x | {pct(r['hidden'])} (lockstep 0%) | {r['memory']:.3f}x |")
  for preset, _ in presets:
    print(f"targets ({preset.name}; reported, not asserted): {targets(rows, preset.name)}")


if __name__ == "__main__":
  main()
