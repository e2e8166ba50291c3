"""Writes `docs/configuration.md`, the reference of every run-config field, from the code so it cannot drift.

    python docs/make_config_reference.py           # rewrite docs/configuration.md
    python docs/make_config_reference.py --check   # exit 1 when the file is not what the code generates

Values come from `base_config(algorithm, preset)` itself; a field's description is the comment written next to
(or in the comment block just above) its assignment in `agent_r1_jax/trainer/config.py`, unless `FIELD_NOTES`
below says more. A field with neither, or a note for a field that no longer exists, is an error:
`tests/test_docs.py` runs `--check`, so adding a field without saying what it does fails the tests.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import re
import sys
import tokenize

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent_r1_jax import paths  # noqa: E402  (imported after the path insert)
from agent_r1_jax.trainer import config as config_lib  # noqa: E402

CONFIG_SOURCE = REPO / "agent_r1_jax" / "trainer" / "config.py"
OUTPUT = REPO / "docs" / "configuration.md"
DEFAULT_ALGORITHM, DEFAULT_PRESET = "grpo", "tiny"

# What the fields without a comment in config.py (or with a terse one) are for.
FIELD_NOTES = {
    "algorithm_name": "The algorithm whose config this is (set by the config file; `ppo`, `grpo`, ...).",
    "preset": "The preset applied on top of the defaults (`--config=configs/<algo>_multihopqa.py:<preset>`).",
    "seed": "Seed of everything random in a run: parameter init, sampling keys, data order, warm-up batches.",
    "model.shape_preset": "Named architecture of a real preset, so `dry_run` can size it without weights.",
    "model.param_dtype": "dtype of parameters and optimizer state.",
    "model.compute_dtype": "dtype of activations and matmuls (`bfloat16` on accelerators); logits, log-probs "
                           "and losses stay float32.",
    "model.remat": "Recompute each decoder layer's activations in the backward pass (less memory, ~1/3 more "
                   "compute).",
    "model.hidden_size": "Width of the from-scratch model (tiny preset).",
    "model.intermediate_size": "MLP width of the from-scratch model.",
    "model.num_hidden_layers": "Decoder layers of the from-scratch model.",
    "model.num_attention_heads": "Query heads of the from-scratch model.",
    "model.num_key_value_heads": "Key/value heads of the from-scratch model (grouped-query attention).",
    "model.rope_theta": "RoPE base frequency of the from-scratch model.",
    "model.tie_word_embeddings": "The from-scratch model's LM head reuses the input embedding.",
    "data.source": "`synthetic` (the generated world, the offline default) or `multihopqa` (prepared HotpotQA, "
                   "2WikiMultihopQA, MuSiQue).",
    "data.prepared_dir": "Output directory of `python -m agent_r1_jax.data.prepare_multihopqa` (TFDS "
                         "ArrayRecord splits and the corpus).",
    "data.instruction": "The line after `Question: ...` in the user turn (empty: none).",
    "model.path": "Local Hugging Face checkpoint directory (real presets; `qwen2`/`llama` model types).",
    "model.tokenizer_path": "Tokenizer directory (default: `model.path`, or the synthetic world's tokenizer).",
    "dry_run_memory_gb": "Per-device memory budget of the XLA:CPU dry run's verdict (16: TPU v5e, 80: H100); "
                         "with `dry_run_topology` the budget is the HBM XLA:TPU allows one device instead.",
    "dry_run_topology": "A TPU slice the dry run compiles for with XLA:TPU (libtpu, `pip install -e "
                        "\".[tpu]\"`), named as libtpu names it: `v5e:2x2`, `v5e:2x4`, `v5e:4x8`, `v6e:2x4`, "
                        "`v4:2x2x1`, `v5p:2x2x1`, `tpu7x:2x2x1`; empty: XLA:CPU's estimate on this host. The "
                        "mesh must span the slice: a `-1` size fills it, fixed sizes must multiply to its device "
                        "count (else one error naming `--config.mesh.fsdp=-1`; the tiny preset's 1-device mesh "
                        "needs it). Needs `dry_run=True`.",
    "dry_run_report": "Path the dry run writes its figures to as JSON (topology, chip, budget, mesh, per program: "
                      "bytes, FLOPs, fits, compile and roofline seconds); empty: print only. Needs "
                      "`dry_run=True`.",
    "env.max_tool_response_length": "Characters of one tool output kept, before the chat framing.",
    "rollout.max_observation_tokens": "Tokens of one observation kept (None: only the response budget limits "
                                      "it).",
    "algorithm.loss_mask": "Tokens the policy loss, entropy and KL average over: `action` (sampled tokens only) "
                           "or `response` (tool output too: the paper's Table 4 ablation).",
    "algorithm.advantage_mask": "Positions advantages and returns run over: `action` (observations skipped, "
                                "the recursion carried across them) or `response` (the Table 4 ablation).",
    "algorithm.reward_style": "`paper` (EM if the format is right, else format - 1) or `partial_credit` (the "
                              "released code's: credit per well-formed tool turn and substring answers; "
                              "rewards/multihopqa.py).",
    "tool.retriever": "Search backend of `wiki_search`: `bm25`, `dense` (ScaNN + a query encoder) or `http` "
                      "(a retrieval server).",
    "tool.corpus_path": "JSONL corpus of passages (synthetic task: the generated one).",
    "tool.index_path": "Dense (ScaNN) index directory.",
    "tool.encoder_path": "Dense query-encoder checkpoint directory.",
    "tool.server_url": "URL of the retrieval server (`python -m agent_r1_jax.retrieval.server`).",
    "critic.warmup_steps": "Critic lr warm-up (optimizer steps); the released PPO script has none.",
    "trainer.critic_warmup": "First RL steps that update only the critic, the actor frozen (PPO; the paper: 5).",
    "trainer.eval_num_examples": "Examples per validation source in each evaluation.",
    "sft.adam_b2": "Warm-up AdamW's second-moment decay.",
    "sft.expert_guess_rate": "Probability that the synthetic expert guesses instead of searching "
                             "(data/synthetic/expert.py).",
    "sft.expert_guess_at": "Where it may guess: at `each_hop`, or only at the `start` (then it either answers "
                           "without the tool or searches every hop).",
    "sft.rag_questions": "Naive-RAG examples per fresh world (passages in the user turn, one answering turn): "
                         "the format of evaluate's naive_rag baseline.",
    "data.train_split": "Split of `data.prepared_dir` that RL samples questions from.",
    "data.val_sources": "Held-out data sets evaluated during and after training (multi-hop QA).",
    "data.shuffle_seed": "Seed of the training-question order (a grain sampler; resumes exactly).",
    "data.prepare.name": "Name of the data set prepared from `hotpotqa_train` / `hotpotqa_dev` (its cache "
                         "directory).",
    "data.prepare.hotpotqa_train": "HotpotQA file to train on (official JSON, IRCoT or Hugging Face JSONL).",
    "data.prepare.hotpotqa_dev": "HotpotQA file held out for evaluation.",
    "data.synthetic.seed": "Seed of the generated world (names, facts, questions): another seed, another world.",
    "data.synthetic.num_train": "Training questions of the generated world.",
    "data.synthetic.num_validation": "Validation questions (evaluated during training).",
    "data.synthetic.num_test": "Held-out test questions (evaluated before and after RL).",
    "data.synthetic.hop_mix": "Fractions of one_hop / bridge / compositional (3 hops) / four_hop / comparison "
                              "questions (normalised).",
    "data.synthetic.namesake_rate": "Share of films given a sequel and of companies given a subsidiary, whose "
                                    "passages name the original (retrieval returns them for its name).",
    "data.synthetic.num_countries": "Countries of the generated world (each has a capital city).",
    "data.synthetic.num_cities": "Cities of the generated world.",
    "data.synthetic.num_people": "People of the generated world.",
    "data.synthetic.num_films": "Films of the generated world.",
    "data.synthetic.num_bands": "Bands of the generated world.",
    "data.synthetic.num_companies": "Companies of the generated world.",
    "data.synthetic.num_universities": "Universities of the generated world (\"University of <city>\").",
    "tool.tools": "Registered tools the policy may call (`wiki_search`, `python`, or your own; "
                  "docs/extending.md).",
    "tool.top_k": "Passages returned per search.",
    "tool.timeout_s": "Timeout of one call to the HTTP retriever.",
    "tool.python.isolation": "`namespaces`: every snippet in fresh Linux namespaces (tools/sandbox.py); "
                             "`none`: unisolated (unsafe, logged loudly).",
    "tool.python.time_limit_s": "Wall-clock limit of one snippet.",
    "tool.python.memory_limit_mb": "Address-space limit of each of a snippet's processes; with `disk_limit_mb`, the "
                                   "memory of all of them and their files together (the snippet's cgroup).",
    "tool.python.disk_limit_mb": "Size of the snippet's writable temp dir and of its /dev/shm.",
    "tool.python.max_processes": "Processes (and threads) one snippet may run at once, all of them together.",
    "tool.python.cpus": "CPU cores of bandwidth for all of a snippet's processes together (its cgroup's quota).",
    "tool.python.cgroup_parent": "Where snippet cgroups are made: relative to the trainer's own cgroup, or absolute "
                                 "from the hierarchy's root; an unprivileged user names a cgroup delegated to it. "
                                 "Empty: `<trainer's cgroup>/agent_r1_jax_snippets`.",
    "tool.python.accept_missing": "Comma-separated guarantees (`cgroup`, `seccomp`) the tool may run without on a "
                                  "host that cannot give them; any other missing one makes it refuse to start.",
    "tool.python.max_output_chars": "Characters of a snippet's output kept in the observation.",
    "env.parallel_tool_calls": "Execute every `<tool_call>` of a turn (True) or only the first (False).",
    "env.assistant_prefix": "Text the env writes at the start of every assistant turn after an observation "
                            "(e.g. `<think>`; empty: none).",
    "rollout.n_samples": "Episodes sampled per prompt (the group of GRPO, RLOO and REINFORCE++-baseline).",
    "rollout.max_turns": "Assistant turns per episode at most.",
    "rollout.max_prompt_length": "Prompt tokens (P): prompts are left-padded to it.",
    "rollout.max_new_tokens_per_turn": "Tokens the policy may sample in one turn.",
    "rollout.max_response_length": "Response tokens (R) of an episode: every turn and observation after the "
                                   "prompt.",
    "rollout.max_context_length": "KV-cache length: prompt plus response never exceed it.",
    "rollout.temperature": "Sampling temperature of training rollouts (evaluation is greedy).",
    "rollout.top_p": "Nucleus sampling threshold (1: off).",
    "rollout.top_k": "Top-k sampling (0: off).",
    "rollout.cache_dtype": "dtype of the KV cache.",
    "algorithm.adv_estimator": "Advantage estimator (`gae`, `grpo`, `reinforce_plus_plus`, "
                               "`reinforce_plus_plus_baseline`, `rloo`, or a registered one).",
    "algorithm.use_critic": "Train a value model (PPO's GAE needs one).",
    "algorithm.gamma": "Discount over action tokens (observation tokens are skipped, not discounted).",
    "algorithm.lam": "GAE lambda.",
    "algorithm.norm_by_std": "GRPO divides each group's centred scores by their standard deviation.",
    "algorithm.whiten": "Whiten advantages over the batch's action tokens (PPO, REINFORCE++).",
    "algorithm.use_kl_in_reward": "Subtract `kl_coef * KL(pi || pi_ref)` from the token rewards (PPO, "
                                  "REINFORCE++).",
    "algorithm.kl_penalty": "KL estimator in the reward: `kl` (k1), `abs`, `mse` (k2), `low_var_kl` (k3).",
    "algorithm.kl_ctrl": "KL-in-reward coefficient: `fixed` or `adaptive` (towards `target_kl`).",
    "algorithm.kl_coef": "KL-in-reward coefficient (its start for the adaptive controller).",
    "algorithm.target_kl": "Adaptive controller's target KL.",
    "algorithm.kl_horizon": "Adaptive controller's horizon (rows).",
    "actor.lr": "Actor learning rate (AdamW).",
    "actor.warmup_steps": "Linear learning-rate warm-up (optimizer steps).",
    "actor.lr_schedule": "`constant` or `cosine` after the warm-up.",
    "actor.weight_decay": "AdamW weight decay.",
    "actor.grad_clip": "Global gradient-norm clip.",
    "actor.clip_ratio_low": "PPO ratio clip below: ratio >= 1 - clip_ratio_low.",
    "actor.clip_ratio_high": "PPO ratio clip above: ratio <= 1 + clip_ratio_high.",
    "actor.clip_ratio_c": "Dual-clip bound for negative advantages (> 1).",
    "actor.entropy_coef": "Entropy bonus coefficient (over action tokens).",
    "actor.loss_agg_mode": "How token losses become one number: `token-mean`, `seq-mean-token-sum`, "
                           "`seq-mean-token-mean`, `seq-mean-token-sum-norm`.",
    "actor.use_kl_loss": "Add `kl_loss_coef * KL(pi || pi_ref)` to the actor loss (GRPO, RLOO, "
                         "REINFORCE++-baseline).",
    "actor.kl_loss_coef": "KL-loss coefficient.",
    "actor.kl_loss_type": "KL estimator of the loss (`low_var_kl` is k3).",
    "actor.ppo_epochs": "Passes over each step's batch.",
    "actor.num_mini_batches": "Optimizer steps per epoch (the batch split in this many mini-batches).",
    "critic.lr": "Critic learning rate (constant).",
    "critic.weight_decay": "Critic AdamW weight decay.",
    "critic.grad_clip": "Critic gradient-norm clip.",
    "critic.clip_range_value": "Value clip around the rollout-time values.",
    "critic.loss_agg_mode": "Aggregation of the value loss (as `actor.loss_agg_mode`).",
    "critic.micro_batch_size_per_device": "Rows per device in one micro-batch of the critic's passes.",
    "trainer.total_steps": "RL steps (0: warm up, evaluate and save step 0 only).",
    "trainer.save_every": "Checkpoint every this many steps (and at the last one).",
    "trainer.max_to_keep": "Checkpoints kept (step 0 is kept besides them).",
    "trainer.eval_every": "Validation every this many steps (and at the last one).",
    "trainer.eval_batch_size": "Prompts per evaluation rollout.",
    "trainer.progress_bar": "tqdm bars for the warm-up and the RL steps.",
    "trainer.export_hf": "Write the final policy as a Hugging Face checkpoint (`workdir/hf_export`).",
    "sft.enabled": "Run the supervised warm-up before RL.",
    "sft.lr": "Peak warm-up learning rate (linear warm-up, cosine decay to 0 at its last step).",
    "sft.warmup_steps": "Warm-up steps of that schedule.",
    "sft.weight_decay": "Warm-up AdamW weight decay.",
    "sft.reading_questions": "One-hop reading questions per fresh world.",
    "sft.multi_hop_questions": "Multi-hop reading episodes per fresh world.",
    "mesh.data": "Devices of the pure data-parallel axis (-1: all that remain).",
    "mesh.fsdp": "Devices parameters are sharded over (ZeRO-3 style; -1: all that remain).",
    "mesh.tensor": "Devices of the tensor-parallel axis (attention heads, MLP).",
}

_ASSIGNMENT = re.compile(r"^\s*c\.([\w.]+)\s*=")


def _comments_by_line(source: str) -> dict[int, str]:
  """Line number -> the text of the comment on it (tokenize: a `#` inside a string is not a comment)."""
  out = {}
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      out[token.start[0]] = token.string.lstrip("#").strip()
  return out


def source_order(source: str) -> dict[str, int]:
  """`{dotted field or group: line of its first assignment}` in `source`."""
  out = {}
  for number, line in enumerate(source.splitlines(), start=1):
    match = _ASSIGNMENT.match(line)
    if match:
      out.setdefault(match.group(1), number)
  return out


def in_source_order(fields, order: dict[str, int]) -> list[str]:
  """`fields` in the order config.py assigns them (a field set inside a group's dict sorts with the group)."""
  def key(field):
    parts = field.split(".")
    for k in range(len(parts), 0, -1):
      if ".".join(parts[:k]) in order:
        return order[".".join(parts[:k])], field
    return 10**9, field
  return sorted(fields, key=key)


def source_descriptions(source: str) -> dict[str, str]:
  """`{dotted field or group: description}` from the comments of `c.<field> = ...` lines in `source`.

  A field's description is the block of whole-line comments just above its assignment (up to a blank line or
  a `# ---- section` rule), then its trailing comment. A group assigned a ConfigDict of several fields
  (`c.tool.python = ConfigDict(dict(...))`) describes each of them unless they have their own note.
  """
  lines = source.splitlines()
  comments = _comments_by_line(source)
  out = {}
  for number, line in enumerate(lines, start=1):
    match = _ASSIGNMENT.match(line)
    if not match:
      continue
    above = []
    k = number - 1
    while k >= 1 and lines[k - 1].strip().startswith("#") and not lines[k - 1].strip().startswith("# ----"):
      above.insert(0, comments[k])
      k -= 1
    trailing = comments.get(number) if not line.strip().startswith("#") else None
    text = " ".join(above + ([trailing] if trailing else []))
    if text:
      out[match.group(1)] = text
  return out


def flatten(c, prefix: str = "") -> dict[str, object]:
  """`{dotted field: value}` of a ConfigDict, nested dicts flattened."""
  out = {}
  for key in sorted(c.keys()):
    value = c[key]
    if hasattr(value, "keys") and not isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def describe(field: str, descriptions: dict[str, str]) -> str | None:
  """The note of `field`, else its comment, else the comment of the group it belongs to."""
  if field in FIELD_NOTES:
    return FIELD_NOTES[field]
  if field in descriptions:
    return descriptions[field]
  parts = field.split(".")
  for k in range(len(parts) - 1, 0, -1):
    if ".".join(parts[:k]) in descriptions:
      return descriptions[".".join(parts[:k])]
  return None


def _type_name(c, field: str) -> str:
  node = c
  parts = field.split(".")
  for part in parts[:-1]:
    node = node[part]
  field_type = node.get_type(parts[-1])
  name = getattr(field_type, "__name__", str(field_type))
  return f"{name} or None" if node[parts[-1]] is None else name


def _portable(value: object) -> object:
  """`value` with the machine's absolute paths written as the repository-relative ones users see.

  Presets point at files under `paths.shared_data_dir()`, an absolute path that differs between checkouts;
  the reference must be the same text wherever it is generated.
  """
  if not isinstance(value, str):
    return value
  return value.replace(str(paths.shared_data_dir()), "../shared/data").replace(str(REPO), ".")


def _value(value: object) -> str:
  text = repr(_portable(value))
  if len(text) > 48:
    text = text[:45] + "..."
  return "`" + text.replace("|", "\\|") + "`"


def _cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def generate() -> str:
  """The full text of docs/configuration.md."""
  source = CONFIG_SOURCE.read_text()
  descriptions = source_descriptions(source)
  default = config_lib.base_config(DEFAULT_ALGORITHM, DEFAULT_PRESET)
  flat_default = flatten(default)
  fields = {f: flat_default[f] for f in in_source_order(flat_default, source_order(source))}
  presets = {p: flatten(config_lib.base_config(DEFAULT_ALGORITHM, p)) for p in config_lib.PRESETS}
  only_elsewhere = sorted({f for flat in presets.values() for f in flat} - set(fields))
  if only_elsewhere:
    raise SystemExit(f"fields set by a preset but absent from the default config: {only_elsewhere}")
  missing = [f for f in fields if describe(f, descriptions) is None]
  stale = [f for f in FIELD_NOTES if f not in fields]
  if missing or stale:
    raise SystemExit(f"docs/make_config_reference.py: describe these config fields (a comment in "
                     f"trainer/config.py or FIELD_NOTES): {missing}; notes for fields that no longer exist: "
                     f"{stale}")
  lines = [
      "# Configuration reference",
      "",
      "<!-- Generated by `python docs/make_config_reference.py` from `agent_r1_jax/trainer/config.py`; do not "
      "edit by hand (tests/test_docs.py checks it is current). -->",
      "",
      "Every field of a run's config, overridable from the command line (`--config.rollout.max_turns=3`). "
      f"Values are those of `base_config(\"{DEFAULT_ALGORITHM}\", \"{DEFAULT_PRESET}\")`, what "
      "`python -m agent_r1_jax.train` runs by default; the tables after it list what each algorithm and each "
      "preset changes. `config.validate` checks the whole config before anything is built and names the "
      "field to change.",
      "",
      "| field | type | default | what it does |",
      "|---|---|---|---|",
  ]
  for field, value in fields.items():
    lines.append(f"| `{field}` | {_type_name(default, field)} | {_value(value)} | "
                 f"{_cell(describe(field, descriptions))} |")

  algorithms = sorted(config_lib.ALGORITHMS)
  flat = {a: flatten(config_lib.base_config(a, DEFAULT_PRESET)) for a in algorithms}
  differing = [f for f in fields if len({repr(flat[a][f]) for a in algorithms}) > 1]
  lines += ["", f"## What each algorithm sets (preset `{DEFAULT_PRESET}`)", "",
            "The trainer never branches on the algorithm's name; these fields are the whole difference.", "",
            "| field | " + " | ".join(algorithms) + " |", "|---|" + "---|" * len(algorithms)]
  for field in differing:
    lines.append(f"| `{field}` | " + " | ".join(_value(flat[a][field]) for a in algorithms) + " |")

  lines += ["", f"## What each preset sets (algorithm `{DEFAULT_ALGORITHM}`)", "",
            f"Fields whose value differs from the `{DEFAULT_PRESET}` preset's.", ""]
  for preset in config_lib.PRESETS:
    if preset == DEFAULT_PRESET:
      continue
    other = presets[preset]
    changed = [f for f in fields if f in other and repr(other[f]) != repr(fields[f])]
    lines += [f"### `{preset}`", "", f"| field | value | {DEFAULT_PRESET} |", "|---|---|---|"]
    lines += [f"| `{f}` | {_value(other[f])} | {_value(fields[f])} |" for f in changed]
    unused = [f for f in fields if f not in other]
    if unused:
      lines += ["", "Not set (the synthetic world's size): " + ", ".join(f"`{f}`" for f in unused) + "."]
    lines.append("")
  return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
  args = parser.parse_args()
  text = generate()
  if args.check:
    if not OUTPUT.exists() or OUTPUT.read_text() != text:
      print(f"{OUTPUT} is stale: run `python docs/make_config_reference.py`", file=sys.stderr)
      return 1
    return 0
  OUTPUT.write_text(text)
  print(f"wrote {OUTPUT} ({text.count(chr(10))} lines)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
