"""Multi-turn rollouts: the host-side episode drivers (lockstep `run_episodes`, streaming `run_slot_episodes`) and the
fixed-shape `TrajectoryBatch` they produce."""

from agent_r1_jax.rollout.batch import EpisodeStop, TrajectoryBatch
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.rollout.driver import cap_observation, run_episodes, run_episodes_in_waves
from agent_r1_jax.rollout.slot_engine import run_slot_episodes

__all__ = ["EpisodeStop", "RolloutConfig", "TrajectoryBatch", "cap_observation", "run_episodes",
           "run_episodes_in_waves", "run_slot_episodes"]
