"""The RL trainer: configs, jitted learner updates, the step loop, checkpoints, metrics and evaluation."""
