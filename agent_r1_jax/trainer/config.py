"""The trainer's configuration: one `ml_collections.ConfigDict` per algorithm x preset, and its checks.

`configs/<algo>_multihopqa.py` calls `base_config(algo, preset)`; every field is overridable from the
command line (`--config.rollout.max_turns=3`). Presets:

  tiny          the embedded offline default: the synthetic multi-hop world, a small Qwen2-architecture
                model trained from scratch (supervised warm-up on the scripted expert, then RL); CPU-sized.
  tiny-mixed    the tiny preset on a world with the paper's question types: one-hop, bridge, 3-hop, 4-hop and
                comparison questions, namesake entities that retrieval confuses, 5 turns; per-type EM.
  qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-3b
                real Qwen2.5-Instruct checkpoints from a local `--config.model.path`, prepared multi-hop QA
                data, and the paper's hyper-parameters (batch 128 prompts, max 5 turns, 1024 new tokens per
                turn, 8192-token context, tool output cut to 2048 characters, lr 1e-6, KL 0.001, critic lr
                1e-5 constant, PPO's actor frozen for the first 5 steps while the critic trains
                (`trainer.critic_warmup`), gamma = lambda = 1, clip 0.2, retrieval top-5).
  smollm2-135m  a real pretrained instruct model on real data, sized for a CPU: SmolLM2-135M-Instruct (the
                shared GGUF file, converted on first use) on HotpotQA questions from the shared data (the IRCoT
                500 to train, the distractor-setting 300 held out, questions in both left out), BM25 over their
                context paragraphs, the paper's reward; a short supervised warm-up on supporting-fact
                searches first teaches the call format (the raw model writes no tool calls).

Algorithms differ only in these fields (the trainer never branches on the algorithm's name):

  algo                   adv_estimator                 critic  KL                         samples/prompt
  ppo                    gae                           yes     k1 in the reward (0.001)   1
  grpo                   grpo                          no      low_var_kl loss (0.001)    5
  reinforce_pp           reinforce_plus_plus           no      k1 in the reward (0.001)   1
  reinforce_pp_baseline  reinforce_plus_plus_baseline  no      low_var_kl loss (0.001)    5
  rloo                   rloo                          no      low_var_kl loss (0.001)    5
"""

from __future__ import annotations

import pathlib
from typing import Any

from ml_collections import config_dict

from agent_r1_jax import rl
from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.data.prompts import INSTRUCTION
from agent_r1_jax.learner.checks import check_learner_fields
from agent_r1_jax.sizing.checks import check_sizing_fields
from agent_r1_jax.trainer.choice_checks import check_choice_fields
from agent_r1_jax.trainer.presets import apply_preset
from agent_r1_jax.trainer.wandb_logging import check_logging_fields
from agent_r1_jax.warmup.checks import check_warmup_fields

ALGORITHMS: dict[str, dict] = {
    "ppo": dict(adv_estimator="gae", use_critic=True, n_samples=1, kl="reward"),
    "grpo": dict(adv_estimator="grpo", use_critic=False, n_samples=5, kl="loss"),
    "reinforce_pp": dict(adv_estimator="reinforce_plus_plus", use_critic=False, n_samples=1, kl="reward"),
    "reinforce_pp_baseline": dict(adv_estimator="reinforce_plus_plus_baseline", use_critic=False, n_samples=5,
                                  kl="loss"),
    "rloo": dict(adv_estimator="rloo", use_critic=False, n_samples=5, kl="loss"),
}

PRESETS = ("tiny", "tiny-mixed", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "smollm2-135m")
REAL_PRESETS = {"qwen2.5-0.5b": "qwen2_5_0_5b", "qwen2.5-1.5b": "qwen2_5_1_5b", "qwen2.5-3b": "qwen2_5_3b"}


def base_config(algorithm: str, preset: str | None = None) -> config_dict.ConfigDict:
  """The full config of `algorithm` at `preset` (default `tiny`)."""
  preset = preset or "tiny"
  if algorithm not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {algorithm!r}; use one of {sorted(ALGORITHMS)}")
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; use one of {PRESETS} (e.g. --config=configs/"
                     f"{algorithm}_multihopqa.py:tiny)")
  algo = ALGORITHMS[algorithm]
  c = config_dict.ConfigDict()
  c.algorithm_name = algorithm
  c.preset = preset
  c.seed = 0
  # Compile every program of a step at this config's shapes (no weights), print their memory and cost, then exit.
  c.dry_run = False
  c.dry_run_memory_gb = 16.0                    # per-device budget of the verdict (16: TPU v5e, 80: H100)
  # A TPU slice to compile the dry run for with libtpu (e.g. "v5e:2x4"); "": XLA:CPU's estimate on this host.
  c.dry_run_topology = ""
  c.dry_run_report = ""                         # path of the dry run's JSON report ("": print only)
  # Real presets refuse to train on the host CPU (a jaxlib without the accelerator); True allows it.
  c.allow_cpu = False
  # Start RL from another run's step-0 policy (its workdir) or a Hugging Face directory instead of warming up:
  # the actor and the reference start from it, a critic's backbone too (its value head fresh).
  c.init_from = config_dict.placeholder(str)

  # ---- model -------------------------------------------------------------------------------------------
  c.model = config_dict.ConfigDict()
  c.model.path = config_dict.placeholder(str)     # local HF checkpoint dir (real presets)
  c.model.tokenizer_path = config_dict.placeholder(str)  # defaults to model.path / the synthetic tokenizer
  # A GGUF checkpoint converted on first use into <cache>/models/<stem> when model.path is unset (trainer/assets.py).
  c.model.gguf_path = config_dict.placeholder(str)
  c.model.shape_preset = REAL_PRESETS.get(preset, "")  # for dry_run without weights
  c.model.param_dtype = "float32"
  c.model.compute_dtype = "float32"
  c.model.remat = False
  # The learner's forward (no KV cache) as one lax.scan over the stacked blocks: one layer's gathered weights
  # live at a time (the real presets turn it on; the same math either way).
  c.model.scan_layers = False
  # Response positions per LM-head block in the learner (0: all at once): no pass holds [rows, R, V] logits.
  c.model.logits_chunk_size = 256
  # Attention of longer calls in blocks of this many queries and keys (0: dense): no [B, H, T, S] scores.
  c.model.attention_chunk_size = 512
  # The slot engine's KV cache: "dense" (every slot at the full context), "paged" (pages of kv_page_size tokens
  # taken as an episode grows, read by the platform's kernel: models.paged_attention) or "auto" (paged on TPU and
  # GPU, dense on CPU: sampling.paging.PagingConfig.from_config). Dense by default until the TPU compiler's dry run
  # shows the paged engine fitting every preset's slice at no slower a step (docs/guide.md, the paged KV cache).
  # The lockstep engine always runs the dense cache.
  c.model.kv_cache = "dense"
  # Tokens per page of the paged cache (a row's context rounds up to whole pages).
  c.model.kv_page_size = 64
  # The kernel reading the pages: "auto" (TPU: ragged_paged; GPU: pallas_gpu_decode; CPU: xla) or one of
  # models.paged_attention.BACKENDS.
  c.model.paged_attention = "auto"
  # Shape of the from-scratch model of the tiny preset (vocabulary comes from the tokenizer).
  c.model.hidden_size = 256
  c.model.intermediate_size = 768
  c.model.num_hidden_layers = 4
  c.model.num_attention_heads = 4
  c.model.num_key_value_heads = 2
  c.model.rope_theta = 10000.0
  c.model.tie_word_embeddings = True

  # ---- data --------------------------------------------------------------------------------------------
  c.data = config_dict.ConfigDict()
  c.data.source = "synthetic"                   # "synthetic" | "multihopqa"
  c.data.prepared_dir = config_dict.placeholder(str)  # output of agent_r1_jax.data.prepare_multihopqa
  c.data.train_split = "train"
  c.data.val_sources = ("hotpotqa", "2wikimultihopqa", "musique")
  # The evaluation sets the paper tables' "EM avg." column, its interval and the paired differences average
  # over (experiments/paper_tables.py); () = every evaluated set. The paper's Avg. is the mean over its three
  # multi-hop sets; every evaluated set keeps its own EM column either way.
  c.data.average_over = ()
  c.data.shuffle_seed = 0
  # The chat template's `# Tools` block (the schemas, as Qwen2.5-Instruct expects them). A model trained from
  # scratch learns the call format from its warm-up data, not from this constant text.
  c.data.tools_in_prompt = True
  c.data.instruction = INSTRUCTION              # the line after `Question: ...` in the user turn
  # Release files prepared on first use into <cache>/datasets/<name> (train split, validation_hotpotqa, and a
  # corpus of every split's paragraphs) when data.prepared_dir is unset (trainer/assets.py).
  c.data.prepare = config_dict.ConfigDict(dict(name="multihopqa_local", hotpotqa_train=config_dict.placeholder(str),
                                               hotpotqa_dev=config_dict.placeholder(str)))
  c.data.synthetic = config_dict.ConfigDict(dict(
      seed=0, num_train=1200, num_validation=200, num_test=200, namesake_rate=0.0))

  # ---- tools / env -------------------------------------------------------------------------------------
  c.tool = config_dict.ConfigDict()
  c.tool.tools = ("wiki_search",)
  c.tool.retriever = "bm25"                     # "bm25" | "dense" | "http"
  c.tool.corpus_path = config_dict.placeholder(str)  # JSONL corpus (synthetic: generated)
  c.tool.index_path = config_dict.placeholder(str)   # dense index directory
  c.tool.encoder_path = config_dict.placeholder(str)  # dense query encoder directory
  c.tool.server_url = config_dict.placeholder(str)   # http retriever
  c.tool.top_k = 5
  c.tool.timeout_s = 30.0
  # The `python` tool (tool.tools=("python",)): a sandbox per snippet ("none": unisolated, unsafe); its guarantees,
  # cgroup_parent and accept_missing ("cgroup", "seccomp"): tools/python_tool.py and docs/guide.md, "The python tool".
  c.tool.python = config_dict.ConfigDict(dict(isolation="namespaces", time_limit_s=5.0, memory_limit_mb=512,
                                              disk_limit_mb=16, max_processes=32, max_output_chars=4096, cpus=1.0,
                                              cgroup_parent="", accept_missing=""))
  c.env = config_dict.ConfigDict()
  c.env.max_tool_response_length = 2048         # characters of tool output before chat framing
  c.env.parallel_tool_calls = False
  c.env.assistant_prefix = ""

  # ---- rollout -----------------------------------------------------------------------------------------
  c.rollout = config_dict.ConfigDict()
  c.rollout.n_samples = algo["n_samples"]
  c.rollout.max_turns = 5
  c.rollout.max_prompt_length = 1024
  c.rollout.max_new_tokens_per_turn = 1024
  c.rollout.max_response_length = 7168
  c.rollout.max_context_length = 8192
  c.rollout.max_observation_tokens = config_dict.placeholder(int)  # token cap of one observation
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  c.rollout.cache_dtype = "float32"
  # The lockstep engine's rows one device samples at a time (0: all of the step's rows at once): a step whose KV
  # cache would not fit a chip samples its prompts in successive waves of max_rows_per_device x (mesh.data x
  # mesh.fsdp) rows. The slot engine bounds its cache with slots_per_device instead (this must stay 0 there).
  c.rollout.max_rows_per_device = 0
  # How episodes are sampled, in training and evaluation: "slots" (episodes stream through fixed decode slots; a
  # row's tool call runs while others decode; sampling keyed by episode and position, so the slot count changes no
  # trajectory) or "lockstep" (every row decodes each turn to its end, then the tools run for all rows: the
  # reference the slot engine is tested against, greedy trajectories equal).
  c.rollout.engine = "slots"
  # The slot engine's decode slots per batch device (0: as many as the step's rows per device; an evaluation holds
  # its batch's rows per device, at most this when set: sizing.rollout_sizing.slot_engine_options).
  c.rollout.slots_per_device = 0
  # Pages of model.kv_page_size tokens in each batch device's pool (paged cache; the null page included). 0: enough
  # for every slot at the full context, so no episode ever waits for pages; fewer hold more slots in the same HBM
  # (a turn waits for its pages; `--config.dry_run_topology` sizes it).
  c.rollout.pages_per_device = 0
  # Tokens each slot-engine decode call samples per slot at most (a turn spans as many calls as it needs).
  c.rollout.decode_chunk = 32
  # Threads running the slot engine's tool calls (the environment must accept concurrent calls when > 1).
  c.rollout.tool_workers = 8

  # ---- algorithm ---------------------------------------------------------------------------------------
  c.algorithm = config_dict.ConfigDict()
  c.algorithm.adv_estimator = algo["adv_estimator"]
  c.algorithm.use_critic = algo["use_critic"]
  c.algorithm.gamma = 1.0
  c.algorithm.lam = 1.0
  c.algorithm.norm_by_std = True
  c.algorithm.whiten = True
  c.algorithm.use_kl_in_reward = algo["kl"] == "reward"
  c.algorithm.kl_penalty = "kl"
  c.algorithm.kl_ctrl = "fixed"
  c.algorithm.kl_coef = 0.001
  c.algorithm.target_kl = 0.1
  c.algorithm.kl_horizon = 10000.0
  c.algorithm.loss_mask = "action"              # "action" | "response" (paper Table 4 ablation)
  c.algorithm.advantage_mask = "action"         # "action" | "response"
  c.algorithm.reward_style = "paper"            # "paper" | "partial_credit"
  # H of the seq-mean-token-sum-norm aggregation (actor and critic); None: rollout.max_response_length, so a
  # row's loss does not depend on how wide the batch it was trimmed with is.
  c.algorithm.loss_agg_horizon = config_dict.placeholder(int)

  # ---- actor / critic optimisation ---------------------------------------------------------------------
  c.actor = config_dict.ConfigDict()
  c.actor.lr = 1e-6
  c.actor.warmup_steps = 0
  c.actor.lr_schedule = "constant"
  c.actor.weight_decay = 0.01
  c.actor.grad_clip = 1.0
  c.actor.clip_ratio_low = 0.2
  c.actor.clip_ratio_high = 0.2
  c.actor.clip_ratio_c = 3.0
  c.actor.entropy_coef = 0.0
  c.actor.loss_agg_mode = "token-mean"
  c.actor.use_kl_loss = algo["kl"] == "loss"
  c.actor.kl_loss_coef = 0.001
  c.actor.kl_loss_type = "low_var_kl"
  c.actor.ppo_epochs = 1
  c.actor.num_mini_batches = 2
  # On-policy update (1 epoch, 1 mini-batch, no KL in the reward): old log-probs from its own forward, no extra pass.
  c.actor.reuse_onpolicy_logprobs = True
  # Rows per device in one micro-batch of every learner pass (log-probs, update); a micro-batch spans
  # micro_batch_size_per_device * (mesh.data * mesh.fsdp) rows.
  c.actor.micro_batch_size_per_device = 8
  c.critic = config_dict.ConfigDict()
  c.critic.lr = 1e-5
  c.critic.warmup_steps = 0                     # lr warm-up (optimizer steps); the released PPO script has none
  c.critic.weight_decay = 0.01
  c.critic.grad_clip = 1.0
  c.critic.clip_range_value = 0.5
  c.critic.loss_agg_mode = "token-mean"
  c.critic.micro_batch_size_per_device = 8

  # ---- loop --------------------------------------------------------------------------------------------
  c.trainer = config_dict.ConfigDict()
  # Prompts per step over all processes (rows = batch_size * n_samples); each process samples its share.
  c.trainer.batch_size = 128
  c.trainer.total_steps = 200
  c.trainer.critic_warmup = 0                   # first steps that update only the critic, actor frozen (PPO)
  c.trainer.eval_every = 20
  c.trainer.save_every = 20
  c.trainer.max_to_keep = 3
  c.trainer.eval_batch_size = 128               # prompts per evaluation rollout over all processes (each plays 1/P)
  c.trainer.eval_num_examples = 500             # per validation source
  c.trainer.progress_bar = True
  c.trainer.export_hf = True
  # Learner batches are cut to their longest row rounded up to this multiple (0: always the rollout limits).
  c.trainer.length_multiple = 64

  # ---- supervised warm-up (tiny preset: the model starts from scratch) ----------------------------------
  c.sft = config_dict.ConfigDict()
  c.sft.enabled = False
  # Stages "turns:steps:batch_size,...": trajectories cut after their first `turns` assistant turns (`all`:
  # whole), shortest first; `copy` stages train on the copy drill. See warmup/sft.py.
  c.sft.stages = "all:200:32"
  c.sft.lr = 1e-3
  c.sft.warmup_steps = 20
  c.sft.weight_decay = 0.0
  c.sft.adam_b2 = 0.999                         # AdamW's second-moment decay
  # Response positions per LM-head block of the warm-up loss (0: all at once; the tiny recipe is tuned at 0).
  c.sft.logits_chunk_size = 0
  # > 0: each batch is cut from a length-sorted window of that many batches of one pool (warmup/sft.py,
  # `BatchStream`), so it pads to its own examples' length; 0: batches of random examples.
  c.sft.length_group = 0
  c.sft.expert_guess_rate = 0.0                 # the expert guesses instead of searching with this probability
  c.sft.expert_guess_at = "each_hop"            # ... at every hop, or only at the "start" (see synthetic/expert.py)
  # Warm-up also answers one-hop questions in this many fresh worlds (other names and facts, see
  # data.synthetic.reading), `sft.reading_questions` per world: reading practice with nothing to memorise.
  c.sft.reading_worlds = 0
  c.sft.reading_questions = 1000
  # Which relations the fresh-world questions ask about: "uniform" over every fact of the fresh world, or
  # "task": in the proportions the task's training questions read them, hop by hop (more employers read from
  # a person's passage, no release years; see data.synthetic.reading.task_relation_mix).
  c.sft.reading_relations = "uniform"
  # With "task": this share s of the weights is spread over the relations as the uniform draw would, the rest
  # kept in the task's proportions: w_r = (1 - s) task_r + s uniform_r, so every relation the world states is
  # practised (data.synthetic.reading.blended_relation_mix).
  c.sft.reading_uniform_share = 0.0
  # ... and as many naive-RAG examples per fresh world (passages in the user turn, one answering turn; see
  # data.rag): the format of evaluate's naive_rag baseline, which an instruct model reads untaught.
  c.sft.rag_questions = 0
  # Multi-hop episodes in `sft.multi_hop_worlds` other fresh worlds, `sft.multi_hop_questions` per world, the
  # expert searching every hop, the first turn as context (data.synthetic.reading.multi_hop_reading): practice
  # of the read after the last observation that leaves the decision to search to the task world's episodes.
  c.sft.multi_hop_worlds = 0
  c.sft.multi_hop_questions = 800
  # The read check (synthetic task only; real data warms up without it; warmup/read_gate.py): after the
  # stages, the teacher-forced final read on the first `sft.read_check_questions` validation questions; while
  # fewer than `sft.min_read_accuracy` of them are right, up to `sft.extra_rounds` more rounds of
  # `sft.extra_stage`, each with a fresh AdamW and cosine cycle peaking at `sft.extra_lr`. 0: no check.
  c.sft.min_read_accuracy = 0.0
  c.sft.read_check_questions = 200              # validation questions whose expert episodes the check reads
  c.sft.extra_stage = "all:400:16"              # stages of one extra round (`sft.stages` syntax, no `copy`)
  c.sft.extra_rounds = 2                        # most extra rounds before RL starts anyway (0: only report)
  c.sft.extra_lr = 1e-3                         # peak lr of each extra round's warm-up + cosine cycle
  # Optimizer steps between the warm-up's own checkpoints (DIR/warmup_checkpoints; 0: only at each phase's end and on
  # SIGTERM / SIGINT); a rerun of an interrupted warm-up resumes from the latest (trainer/warmup_checkpoints.py).
  c.sft.save_every = 200

  # ---- mesh --------------------------------------------------------------------------------------------
  c.mesh = config_dict.ConfigDict(dict(data=1, fsdp=-1, tensor=1))

  # ---- logging (metrics.jsonl and TensorBoard are always written; trainer/wandb_logging.py) ----------------
  c.logging = config_dict.ConfigDict()
  # Weights & Biases project that receives the run's config, per-step metrics, summary and curves (None or empty:
  # no W&B). Needs the `wandb` extra: pip install -e ".[wandb]". WANDB_MODE=offline logs to local files.
  c.logging.wandb_project = config_dict.placeholder(str)
  c.logging.wandb_entity = config_dict.placeholder(str)    # W&B user or team (None: the login's default entity)
  c.logging.wandb_run_name = config_dict.placeholder(str)  # W&B display name of the run (None: W&B picks one)
  # W&B tags: a tuple or list of strings, or one comma-separated string (--config.logging.wandb_tags=grpo,tiny).
  c.logging.wandb_tags = config_dict.FieldReference((), field_type=object)

  apply_preset(c, preset)
  return c


def validate(c: config_dict.ConfigDict) -> None:
  """Raises one ValueError naming the field to change; called before anything is built. The trainer checks its
  own sections (the algorithm's choices, data, tools, the loop, logging) and each package below it its own:
  `learner.checks` (actor, critic, loss horizon, chunking), `sizing.checks` (dry run, rollout engine, the batch's
  split over the devices) and `warmup.checks` (`sft.*`)."""
  check_choice_fields(c)
  if c.init_from and not (workdir_lib.workdir_path(c.init_from).is_dir() if workdir_lib.is_remote(c.init_from)
                          else pathlib.Path(c.init_from).expanduser().is_dir()):
    raise ValueError(f"init_from={c.init_from} is not a directory: point it at a training run's workdir (its "
                     f"step-0 policy) or a Hugging Face checkpoint directory")
  if not isinstance(c.trainer.total_steps, int) or c.trainer.total_steps < 0:
    raise ValueError(f"trainer.total_steps must be an integer >= 0 (0: warm up, evaluate and save step 0 only), "
                     f"got {c.trainer.total_steps!r}")
  if c.preset in REAL_PRESETS and not c.model.path and not c.dry_run:
    raise ValueError(
        f"preset {c.preset!r} trains a real Qwen2.5 checkpoint and needs --config.model.path=/path/to/"
        f"{c.preset} (a local Hugging Face directory with config.json and model.safetensors); nothing is "
        f"downloaded. For the offline default run the tiny preset: --config=configs/"
        f"{c.algorithm_name}_multihopqa.py:tiny")
  if c.data.source == "multihopqa" and not c.data.prepared_dir and not c.dry_run:
    raise ValueError("data.source='multihopqa' needs --config.data.prepared_dir (the output folder of "
                     "`python -m agent_r1_jax.data.prepare_multihopqa`)")
  check_logging_fields(c)
  estimator = rl.get_estimator(c.algorithm.adv_estimator)  # what it needs, as registered
  if estimator.needs_group_ids and c.rollout.n_samples < 2:
    raise ValueError(f"{estimator.name} compares samples of the same prompt: set "
                     f"rollout.n_samples >= 2 (got {c.rollout.n_samples})")
  if estimator.needs_values and not c.algorithm.use_critic:
    raise ValueError(f"adv_estimator={estimator.name!r} needs a critic's values: set algorithm.use_critic=True")
  if c.trainer.critic_warmup and not c.algorithm.use_critic:
    raise ValueError(f"trainer.critic_warmup={c.trainer.critic_warmup} freezes the actor while a critic trains, "
                     f"but {c.algorithm.adv_estimator} has no critic: set trainer.critic_warmup=0")
  if c.rollout.max_context_length < c.rollout.max_prompt_length + 1:
    raise ValueError("rollout.max_context_length must exceed rollout.max_prompt_length")
  check_sizing_fields(c)
  check_learner_fields(c)
  check_warmup_fields(c)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
  """{"a.b": value} of a nested dict."""
  out = {}
  for key, value in d.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def differences(c: config_dict.ConfigDict) -> dict[str, tuple[Any, Any]]:
  """{field: (the preset's value, this config's)} for every field in which `c` differs from
  `base_config(c.algorithm_name, c.preset)`: the command line's overrides and the paths resolved since."""
  preset = _flat(base_config(c.algorithm_name, c.preset).to_dict())
  ours = _flat(c.to_dict())
  return {k: (preset.get(k), v) for k, v in sorted(ours.items()) if preset.get(k) != v}


def describe_differences(c: config_dict.ConfigDict) -> str:
  """One line: the algorithm, the preset and every field that differs from it (`differences`)."""
  changed = differences(c)
  fields = ", ".join(f"{k}={new!r} (preset: {old!r})" for k, (old, new) in changed.items())
  return f"config: {c.algorithm_name} at preset {c.preset}" + (f"; differs in {fields}" if fields else
                                                               ", as the preset sets it")
