"""The analytic matmul FLOPs of one learner micro-batch, to set beside the compiler's (`--config.dry_run=True`).

For a micro-batch of m rows of T = P + R tokens through L layers (hidden D, MLP width F, H query and K key/value
heads of width d, vocabulary V), one forward pass costs

    layers     2 * N_layer * L * m * T          N_layer = D*H*d + 2*D*K*d + H*d*D + 3*D*F (the matmul weights)
    attention  4 * m * T_q * T_k * H * d * L    q k^T and weights v over every (query, key) pair the program
                                                computes: blocked attention computes every block, masked ones
                                                included, over the padded lengths
    LM head    2 * V * D * m * R                applied to the R response positions only

and an update costs 3 forward passes' worth (the forward, and twice it for the gradients of activations and of
weights), plus what is recomputed instead of stored:

    model.remat                  each layer's forward again (its attention included) in the backward pass
    blocked attention            each query block's attention forward again (`jax.checkpoint` per block)
    model.logits_chunk_size > 0  the LM head's forward again, block by block

so: layers (3 + remat) + attention (3 + remat + blocked) + head (3 + chunked). The critic has no LM head (its value
head is a D-vector per token). This is "6 x parameters x tokens, plus attention, plus the recompute".
"""

from __future__ import annotations

from agent_r1_jax.models import Qwen2Config


def layer_matmul_params(arch: Qwen2Config) -> int:
  """N_layer: the q, k, v, o and SwiGLU weights of one decoder layer."""
  d, h, k, hd, f = (arch.hidden_size, arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim,
                    arch.intermediate_size)
  return d * h * hd + 2 * d * k * hd + h * hd * d + 3 * d * f


def update_flops(arch: Qwen2Config, *, rows: int, prompt_length: int, response_length: int, remat: bool,
                 attention_chunk: int, logits_chunk: int, lm_head: bool = True) -> float:
  """Matmul FLOPs of one update micro-batch of `rows` rows (the module docstring's count)."""
  t = prompt_length + response_length
  blocked = bool(attention_chunk) and t > attention_chunk
  padded = -(-t // attention_chunk) * attention_chunk if blocked else t
  layers = 2.0 * layer_matmul_params(arch) * arch.num_hidden_layers * rows * t
  attention = 4.0 * rows * padded * padded * arch.num_attention_heads * arch.head_dim * arch.num_hidden_layers
  total = layers * (3 + remat) + attention * (3 + remat + blocked)
  if lm_head:
    head = 2.0 * arch.vocab_size * arch.hidden_size * rows * response_length
    total += head * (3 + bool(logits_chunk))
  return total
