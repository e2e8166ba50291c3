"""Multi-turn rollouts: the host-side episode driver and the fixed-shape `TrajectoryBatch` it produces."""

from agent_r1_jax.rollout.batch import EpisodeStop, TrajectoryBatch
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.rollout.driver import cap_observation, run_episodes, run_episodes_in_waves

__all__ = ["EpisodeStop", "RolloutConfig", "TrajectoryBatch", "cap_observation", "run_episodes",
           "run_episodes_in_waves"]
