"""Two JAX processes on 127.0.0.1 run `run_episodes` with the real sampler on one mesh spanning both.

The test launches this file twice as a script (multi-controller JAX, one CPU device per process, Gloo
collectives). Both processes build the same random tiny Qwen2, a (data=2) mesh over the two devices and a
`Sampler(mesh=mesh)`; each drives its own prompts. Process 0's env ends every row in its second turn,
process 1's in its third, so process 0 must keep making the same jitted calls (an empty extension at
process 1's observation bucket, an all-zero-budget segment) until process 1 is done. Sampling is greedy, so
each process's local batch must equal a single-process run of its prompts, which the test (the parent)
computes itself.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

import loopback_workers

NUM_PROCESSES = 2
WORKER_TIMEOUT_S = 55
PROMPTS = (
    ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nwho?<|im_end|>\n"],
    ["<|im_start|>user\nwhen was it?<|im_end|>\n", "<|im_start|>assistant\n"],
)


class TurnsEnv:
  """Rows call a tool (an observation follows) for `calls` turns, then answer."""

  def __init__(self, calls: int):
    self.calls, self.steps = calls, 0

  def batch_step(self, texts):
    self.steps += 1
    if self.steps <= self.calls:
      return [(f"\n<tool_response>result {self.steps}</tool_response>\n", [True], True) for _ in texts]
    return [("", [], False) for _ in texts]


def rollout(process_id: int, mesh=None):
  """Process `process_id`'s rollout (the policy and everything else identical on every process)."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.rollout import RolloutConfig, run_episodes  # pylint: disable=import-outside-toplevel
  from scripted_policy import byte_tokenizer  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sampling import Sampler, SamplingParams, multihost  # pylint: disable=import-outside-toplevel

  tok = byte_tokenizer()
  config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
  graphdef, params = nnx.split(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)))
  if mesh is not None:
    params = jax.tree.map(lambda x: multihost.replicated(np.asarray(x), mesh), params)
  rollout_config = RolloutConfig(max_prompt_length=24, max_response_length=48, max_turns=4,
                                 max_new_tokens_per_turn=5)
  stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>")]
  sampler = Sampler(graphdef, max_cache_length=rollout_config.cache_length, stop_token_ids=stops,
                    pad_id=tok.pad_token_id, mesh=mesh)
  return run_episodes(sampler, params, TurnsEnv(calls=1 + process_id), tok, PROMPTS[process_id], rollout_config,
                      SamplingParams(greedy=True), jax.random.key(0), samples_per_prompt=2, check_env=False)


def _arrays(batch) -> dict[str, np.ndarray]:
  out = dict(batch.as_learner_inputs())
  out.update(num_turns=batch.num_turns, stop_reason=batch.stop_reason)
  return out


def _worker(out_dir: pathlib.Path) -> None:
  from agent_r1_jax import distributed  # pylint: disable=import-outside-toplevel

  distributed.maybe_initialize(initialization_timeout=40)
  import jax  # pylint: disable=import-outside-toplevel

  pid = jax.process_index()
  mesh = jax.make_mesh((2, 1, 1), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  batch = rollout(pid, mesh)
  np.savez(out_dir / f"batch_{pid}.npz", **_arrays(batch))
  (out_dir / f"report_{pid}.json").write_text(json.dumps(
      {"process_count": jax.process_count(), "global_devices": len(jax.devices())}))


@pytest.mark.slow
def test_processes_finishing_at_different_turns_step_together(tmp_path):
  loopback_workers.run_workers(__file__, tmp_path, num_processes=NUM_PROCESSES, timeout_s=WORKER_TIMEOUT_S)

  for pid in range(NUM_PROCESSES):
    report = json.loads((tmp_path / f"report_{pid}.json").read_text())
    assert report == {"process_count": NUM_PROCESSES, "global_devices": NUM_PROCESSES}
    got = dict(np.load(tmp_path / f"batch_{pid}.npz"))
    reference = _arrays(rollout(pid))  # this process's prompts alone, one process, no mesh
    assert got["num_turns"].tolist() == [2 + pid] * 4  # process 0 finished a turn before process 1
    for name, value in reference.items():
      if value.dtype.kind == "f":
        np.testing.assert_allclose(got[name], value, atol=1e-5, err_msg=f"{name} of process {pid}")
      else:
        np.testing.assert_array_equal(got[name], value, err_msg=f"{name} of process {pid}")


if __name__ == "__main__":
  _worker(pathlib.Path(sys.argv[1]))
