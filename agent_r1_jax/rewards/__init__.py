"""Rewards: answer metrics (official HotpotQA normalisation), format-gated multi-hop QA scores, a registry."""

from agent_r1_jax.rewards.answer_metrics import (exact_match, exact_match_any, f1, f1_any, normalize_answer,
                                                 substring_match, substring_match_any)
from agent_r1_jax.rewards.multihopqa import STYLES, compute_score
from agent_r1_jax.rewards.registry import get_scorer, known_data_sources, register_scorer

__all__ = ["STYLES", "compute_score", "exact_match", "exact_match_any", "f1", "f1_any", "get_scorer",
           "known_data_sources", "normalize_answer", "register_scorer", "substring_match",
           "substring_match_any"]
