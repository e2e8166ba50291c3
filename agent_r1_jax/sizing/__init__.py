"""Sizing a run before renting the hardware (`--config.dry_run=True`): every program of one RL step compiled at
the configured shapes, without weights, for this host or a TPU slice.

  dry_run         the dry run: compile each program, measure it, print and write the report
  report          one program's per-device memory and costs, the run's table, checks, verdict and JSON
  hlo_flops       matmul FLOPs of a compiled program read from its HLO, every loop expanded, or flagged unknown
  hlo_loops       a loop's exact trip count, proven from its HLO where XLA left none, or unknown
  hlo_text        the optimized HLO text as computations of instructions
  flops           the analytic FLOPs of a learner micro-batch
  memory          the state resident beside a program, as the compiler lays it out; a decode step's bytes
  paged_sizing    the paged KV cache: pages and episodes per chip against the dense cache's, decode's bytes
  rpa_cost        what one call of the TPU Ragged Paged Attention kernel reads and computes (cost_analysis can't)
  roofline        chips' published figures and a program's roofline time
  tpu             TPU topologies for compiling without the hardware (libtpu)
  rollout_sizing  how a step's rollout rows map onto slots and waves
  checks          the sizing sections of a config (dry run, rollout engine, the batch's split over devices)

Built on `learner` (the programs it compiles are the learner's and the sampler's); the CLI
(`agent_r1_jax.train`) chooses it or training.
"""
