"""RL math of Agent-R1 as pure, jit-compatible functions over masked `[B, T]` arrays.

Modules (one job each):
  advantages   GAE, GRPO, REINFORCE++, REINFORCE++-baseline, RLOO + registry `compute_advantages`.
  recurrences  masked backward linear recurrences (lax.scan / lax.associative_scan).
  groups       per-group statistics by segment reductions.
  masked       masked sums, means, variance and whitening.
  aggregation  loss aggregation modes as (sum, denominator) `Aggregate`s for micro-batching.
  losses       PPO policy loss (asymmetric + dual clip), clipped value loss.
  logits       token log-probs and entropy from logits (or, chunked, from hidden states and the head).
  kl           KL penalties (k1, abs, k2, k3), KL loss / reward penalty, KL controllers.
  checks       host-side `check_inputs`, called once per batch.
"""

from agent_r1_jax.rl.advantages import ADVANTAGE_ESTIMATORS
from agent_r1_jax.rl.advantages import AdvantageEstimator
from agent_r1_jax.rl.advantages import AdvantageParams
from agent_r1_jax.rl.advantages import compute_advantages
from agent_r1_jax.rl.advantages import compute_gae
from agent_r1_jax.rl.advantages import compute_grpo
from agent_r1_jax.rl.advantages import compute_reinforce_pp
from agent_r1_jax.rl.advantages import compute_reinforce_pp_baseline
from agent_r1_jax.rl.advantages import compute_rloo
from agent_r1_jax.rl.advantages import get_estimator
from agent_r1_jax.rl.aggregation import LOSS_AGG_MODES
from agent_r1_jax.rl.aggregation import Aggregate
from agent_r1_jax.rl.aggregation import accumulate
from agent_r1_jax.rl.aggregation import aggregate
from agent_r1_jax.rl.aggregation import finalize
from agent_r1_jax.rl.aggregation import loss_denominator
from agent_r1_jax.rl.checks import check_inputs
from agent_r1_jax.rl.kl import KL_CONTROLLERS
from agent_r1_jax.rl.kl import KL_PENALTIES
from agent_r1_jax.rl.kl import AdaptiveKLController
from agent_r1_jax.rl.kl import FixedKLController
from agent_r1_jax.rl.kl import apply_kl_penalty
from agent_r1_jax.rl.kl import compute_kl_loss
from agent_r1_jax.rl.kl import kl_penalty
from agent_r1_jax.rl.kl import make_kl_controller
from agent_r1_jax.rl.kl import register_kl_penalty
from agent_r1_jax.rl.logits import chunked_logprobs
from agent_r1_jax.rl.logits import compute_entropy_loss
from agent_r1_jax.rl.logits import entropy_from_logits
from agent_r1_jax.rl.logits import token_logprobs
from agent_r1_jax.rl.losses import PolicyLossOutput
from agent_r1_jax.rl.losses import ValueLossOutput
from agent_r1_jax.rl.losses import compute_policy_loss
from agent_r1_jax.rl.losses import compute_value_loss
from agent_r1_jax.rl.masked import masked_mean
from agent_r1_jax.rl.masked import masked_var
from agent_r1_jax.rl.masked import masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageParams",
    "compute_advantages",
    "compute_gae",
    "compute_grpo",
    "compute_reinforce_pp",
    "compute_reinforce_pp_baseline",
    "compute_rloo",
    "get_estimator",
    "LOSS_AGG_MODES",
    "Aggregate",
    "accumulate",
    "aggregate",
    "finalize",
    "loss_denominator",
    "check_inputs",
    "KL_CONTROLLERS",
    "KL_PENALTIES",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "compute_kl_loss",
    "kl_penalty",
    "make_kl_controller",
    "register_kl_penalty",
    "chunked_logprobs",
    "compute_entropy_loss",
    "entropy_from_logits",
    "token_logprobs",
    "PolicyLossOutput",
    "ValueLossOutput",
    "compute_policy_loss",
    "compute_value_loss",
    "masked_mean",
    "masked_var",
    "masked_whiten",
]
