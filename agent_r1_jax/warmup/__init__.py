"""The supervised warm-up before RL: a model trained from scratch (the tiny presets) or an instruct model that
writes no tool calls (SmolLM2) first learns the episode format from scripted expert episodes.

  run         the warm-up of a run: its stages, then extra rounds while the read check fails (`warm_up`)
  sft         the supervised loop: stages, batches laid out like a learner batch, the masked NLL update
  data        which expert episodes and practice examples a run warms up on
  read_gate   the read check on validation questions, and the extra rounds
  final_read  the teacher-forced final read: does a policy copy out of the last observation what it answers?
  checks      the warm-up's config fields (`sft.*`)

Built on `learner` (optimizer and batch layout); the RL step loop (`trainer`) calls `run.warm_up`.
"""
