"""What each preset sets on top of `config.base_config`'s defaults (the presets are listed in `config`'s docstring).

`apply_preset(c, preset)` is called by `base_config`; each `apply_*` below documents why its values are what they
are.
"""

from __future__ import annotations

from ml_collections import config_dict

from agent_r1_jax import paths


def apply_preset(c: config_dict.ConfigDict, preset: str) -> None:
  """Applies `preset` ("tiny", "tiny-mixed", "smollm2-135m" or a real Qwen2.5 preset) to `c` in place."""
  if preset == "tiny":
    apply_tiny(c)
  elif preset == "tiny-mixed":
    apply_tiny(c)
    apply_tiny_mixed(c)
  elif preset == "smollm2-135m":
    apply_smollm2(c)
  else:
    apply_real(c, preset)


def apply_tiny(c: config_dict.ConfigDict) -> None:
  """CPU-sized settings of the offline default (synthetic world, from-scratch model).

  Attention over the sequence dominates a CPU step, so the task is kept short: two-hop bridge questions
  (search, read, search, read, answer: at most 3 turns), a prompt without the tool-schema block and the
  instruction line (the from-scratch model learns the call format from warm-up, not from English), and the
  top-2 passages per search. The world has twice the default entities so 1,600 training questions exist.

  The model starts from random weights, so warm-up first gives it what pretraining gives a real LM: the copy
  drill (`data.synthetic.copy_drill`: repeat a list of fresh random names, 600 steps of 32; AdamW's b2 = 0.95,
  with which the drill's loss falls several times faster than with 0.999) and one-hop reading episodes in two
  fresh worlds (`data.synthetic.reading`: other names, other facts, so the answer has to be copied out of the
  observation; 800 per world, uniform over the world's facts), 300 per world also in the
  naive-RAG format (passages in the user turn). Then it imitates the scripted expert in stages of growing
  length (first turns; two-turn prefixes; whole episodes), the whole episodes joined by 1,600 two-hop episodes
  in each of four more fresh worlds whose first turn carries no loss (`reading.multi_hop_reading`: practice of
  the read after the second observation that leaves the decision to search alone). The expert is the paper's
  starting point in miniature: on 60% of the two-hop questions it answers from "memory" without searching
  (`sft.expert_guess_at="start"`), like an instruct model that under-uses its tools, so the warmed-up policy
  guesses and RL has to discover that searching pays. Last, the read check (`warmup.read_gate`): if fewer than
  0.9 of 200 validation episodes' final values are read right (teacher-forced), up to two more rounds of 400
  whole-episode steps with a fresh AdamW peaking at 1e-3; a warm-up that reads trains exactly as without it.
  Rollouts sample at temperature 0.7 (the learner scores them at the same temperature). Batches are padded to
  multiples of 16 tokens (`trainer.length_multiple`): the prompts are ~30 tokens. Measured figures, with their
  machines and dates: docs/measurements.md, "The default run".
  """
  c.model.hidden_size = 128
  c.model.intermediate_size = 384
  c.data.synthetic.update(dict(hop_mix=(("bridge", 1.0),), num_train=1600, num_validation=200, num_test=200,
                               num_countries=10, num_cities=60, num_people=480, num_films=300, num_bands=120,
                               num_companies=160, num_universities=40))
  c.data.tools_in_prompt = False
  c.data.instruction = ""
  c.rollout.max_turns = 3
  c.rollout.max_prompt_length = 64
  c.rollout.max_new_tokens_per_turn = 48
  c.rollout.max_response_length = 384
  c.rollout.max_context_length = 448
  c.rollout.max_observation_tokens = 128
  c.rollout.temperature = 0.7
  # Episodes stream through one slot per row (the base config's slot engine); chunks of 16 tokens were the fastest
  # at this size (bench/rollout.py).
  c.rollout.decode_chunk = 16
  c.env.max_tool_response_length = 600
  c.tool.top_k = 2
  c.actor.lr = 1e-4
  c.actor.warmup_steps = 2
  c.actor.num_mini_batches = 1
  c.actor.micro_batch_size_per_device = 8
  c.critic.lr = 1e-4
  c.critic.micro_batch_size_per_device = 8
  # 40 rollout rows per step for every algorithm: 8 prompts x 5 samples, or 40 prompts x 1 sample.
  c.trainer.batch_size = 40 // c.rollout.n_samples
  c.trainer.total_steps = 15
  c.trainer.eval_every = 5
  c.trainer.save_every = 5
  c.trainer.length_multiple = 16
  # Steps 5, 10, 15 are kept, and step 0 (after warm-up) as in every run: evaluate's base_tool_call reads it.
  c.trainer.max_to_keep = 4
  c.trainer.eval_batch_size = 64
  c.trainer.eval_num_examples = 64
  c.sft.enabled = True
  # 800 whole-episode steps over 4 fresh multi-hop worlds: with 550 steps over 2 (or over 4), world seed 2
  # misread the answer after the second observation (held-out EM 0.45 after RL; docs/tiny_recipe.md).
  c.sft.stages = "copy:600:32,1:200:32,2:150:32,all:800:16"
  c.sft.reading_worlds = 2
  c.sft.reading_questions = 800
  # Uniform over facts, not in the task's relation mix: a third of the reads are then years, and with the task's
  # 0.09 (or a half-and-half blend's 0.20) whether the warm-up learns to read a year at all rode on rounding
  # (held-out EM 0.67-0.72 when it did not; docs/experiments.md, "A blended mix").
  c.sft.reading_relations = "uniform"
  # Whether the warm-up learns to read a birth year and a birthplace out of "X was born in CITY in YEAR" still
  # rides on the seed (one of five runs read 0.59 of the values, the others 0.89-1.00), and RL does not teach it
  # after; one extra round of 400 steps took that run to 0.98 (docs/experiments.md, "The read check").
  c.sft.min_read_accuracy = 0.9
  c.sft.read_check_questions = 200
  c.sft.extra_stage = "all:400:16"
  c.sft.extra_rounds = 2
  c.sft.extra_lr = 1e-3
  c.sft.rag_questions = 300
  c.sft.multi_hop_worlds = 4
  c.sft.multi_hop_questions = 1600
  c.sft.lr = 3e-3
  c.sft.adam_b2 = 0.95
  c.sft.expert_guess_rate = 0.6
  c.sft.expert_guess_at = "start"
  c.mesh = config_dict.ConfigDict(dict(data=1, fsdp=1, tensor=1))


def apply_tiny_mixed(c: config_dict.ConfigDict) -> None:
  """The tiny preset on a world with the paper's question types (`data/synthetic/world.py`).

  The mix is the paper's three data sets' in miniature: bridge and comparison questions (HotpotQA), three-hop
  compositions (2WikiMultihopQA), two- to four-hop chains (MuSiQue), and a few one-hop ones; a quarter of the films
  and companies have a namesake (a sequel, a subsidiary) whose passage also comes back for the original's name.
  A four-hop question needs four searches before the answer, so episodes get the paper's 5 turns and the response
  room for four observations of two passages. Held-out EM is reported per type (`eval/<source>/em_<type>`).
  The paper tables average this world's test split alone (`data.average_over`): it stands for the paper's three
  multi-hop sets, whose mean is the paper's Avg.; the one-hop set (one question per test question, which one
  retrieval answers) keeps its column but would give the easiest type half the average's weight, and it is
  near its ceiling from the warm-up on (0.86-0.92), which halves every difference between algorithms.
  """
  c.data.synthetic.update(dict(hop_mix=(("one_hop", 0.1), ("bridge", 0.35), ("compositional", 0.2),
                                        ("four_hop", 0.1), ("comparison", 0.25)), namesake_rate=0.25))
  c.data.average_over = ("synthetic_multihop",)
  c.rollout.max_turns = 5
  c.rollout.max_response_length = 768
  c.rollout.max_context_length = 832
  # 10 RL steps, not the tiny preset's 15: greedy validation EM peaks by step 6-10 and drifts down after it in
  # every row (mean of 15 seed runs of the five algorithms, generator version 1: 0.36 at step 6, 0.33 at 15), and
  # each row's held-out EM was higher at step 10 than at step 15 (+0.007 to +0.028, three seeds each;
  # docs/experiments.md, "Generator version 2 and 10 RL steps"). It also leaves the tables' 36 seed runs two thirds of the time.
  c.trainer.total_steps = 10
  # Dense attention up to 1,024 positions (every row here; warm-up rows reach 925): at [16, 925] the 512-blocks
  # (a map over query blocks, a scan over key blocks, rematerialised) made a warm-up step 2.77x slower on a 2-core
  # 70 GFLOP/s CPU (bench/sft.py --attention_chunks=512,0, both in one run); dense scores are 16 x 4 x 925^2
  # floats, 219 MB per layer.
  c.model.attention_chunk_size = 1024
  # The warm-up, for this world (docs/experiments.md, "The mixed world's warm-up reads"): a two-turn stage of 800
  # steps over four fresh reading worlds, not 150 over two. After 150 steps the policy read no value of a one-hop
  # episode (4/200), after 800 every value that follows its own key word ("directed by", "studied at"), and the
  # whole-episode stage after it learns those after a second "in" ("born in CITY in YEAR"): one-hop reads in a
  # fresh world 175/200 after the warm-up (39/200 with the tiny stages), with the expert's 60% guesses kept, so
  # the policy still under-uses its tool and RL has the search to discover. Extra rounds lowered the read on this
  # world (0.825, 0.820, 0.785 in a guess-free warm-up), so the check only reports.
  c.sft.stages = "copy:600:32,1:200:32,2:800:32,all:800:16"
  c.sft.reading_worlds = 4
  c.sft.reading_questions = 1500
  c.sft.extra_rounds = 0


def apply_real(c: config_dict.ConfigDict, preset: str) -> None:
  """The paper's setting on a real Qwen2.5-Instruct checkpoint.

  PPO as the released script runs it: for the first 5 steps only the critic learns (the actor is frozen,
  `trainer.critic_warmup = 5`) at a constant lr of 1e-5 (`critic.warmup_steps = 0`); the critic starts from
  the policy's checkpoint with a fresh value head.
  """
  c.data.source = "multihopqa"
  c.model.compute_dtype = "bfloat16"
  c.model.remat = True
  c.model.scan_layers = True
  c.rollout.cache_dtype = "bfloat16"
  # A token cap on one observation, for the sampler's static shapes: 2048 characters of retrieved English
  # are ~500 tokens, so it does not bind in practice, but it bounds the widest extend program.
  c.rollout.max_observation_tokens = 1024
  c.actor.micro_batch_size_per_device = 1
  c.critic.micro_batch_size_per_device = 1
  if c.algorithm.use_critic:
    c.trainer.critic_warmup = 5


def apply_smollm2(c: config_dict.ConfigDict) -> None:
  """SmolLM2-135M-Instruct on real HotpotQA, sized for a 2-core CPU (see the module docstring).

  Every step samples 16 episodes (16 prompts, or 4 x 4 samples for the group estimators: 4, not the paper's 5,
  so the rows split over 1, 2, 4 or 8 devices) of up to 3 turns of 64 tokens, with two retrieved passages cut to
  800 characters per observation; the learner runs float32 on micro-batches of 2 rows per device. The warm-up
  trains 30 steps of 8 first turns (the search call), then 30 steps of 4 whole episodes (reading, answering).
  """
  shared = paths.shared_data_dir()
  c.data.source = "multihopqa"
  c.data.val_sources = ("hotpotqa",)
  c.data.prepare.name = "hotpotqa_shared"
  c.data.prepare.hotpotqa_train = str(shared / "hotpotqa" / "ircot_hotpotqa_dev_subsampled_500.jsonl")
  c.data.prepare.hotpotqa_dev = str(shared / "hotpotqa" / "rpt_hotpot_dev_distractor_300a.jsonl")
  c.model.gguf_path = str(shared / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")
  c.tool.top_k = 2
  c.env.max_tool_response_length = 800
  c.rollout.update(dict(max_turns=3, max_new_tokens_per_turn=64, max_prompt_length=448, max_observation_tokens=256,
                        max_response_length=768, max_context_length=1216))
  if c.rollout.n_samples > 1:
    c.rollout.n_samples = 4
  # Steps 0 (the warmed-up policy), 4, 8, 12 are kept, so a later run or evaluation can start from step 0.
  c.trainer.update(dict(batch_size=16 // c.rollout.n_samples, total_steps=12, eval_every=12, save_every=4,
                        max_to_keep=4, eval_batch_size=32, eval_num_examples=200))
  c.actor.update(dict(lr=1e-5, num_mini_batches=1, micro_batch_size_per_device=2))
  c.critic.micro_batch_size_per_device = 2
  c.sft.update(dict(enabled=True, stages="1:30:8,all:30:4", lr=5e-5, warmup_steps=5, logits_chunk_size=128))
