"""Two JAX processes on 127.0.0.1 simulate a 2-host pod (multi-controller JAX, Gloo CPU collectives).

The test launches this file twice as a script (`python tests/test_multiprocess.py WORKER_DIR`), with the
environment `launch/local_multiprocess.sh` sets (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)
and one CPU device per process. Each worker calls `agent_r1_jax.distributed.maybe_initialize()`, builds a
(data=2, fsdp=1) mesh over the two global devices and exercises the three things a multi-host run relies on:

  * `any_across_processes`: a flag raised on one host only must read True on both (the driver's turn loop);
  * `example_iterator(shard_index=process_index, shard_count=process_count)`: hosts read disjoint rows;
  * `TrajectoryBatch.to_device(NamedSharding(mesh, P(("data", "fsdp"))))`: each host contributes its local
    rows; a jitted global sum (a cross-process all-reduce) and a jitted replicating copy (an all-gather) of
    the global array are recorded.

Each worker writes its local arrays and what it observed; the test (the parent process) compares them with
references it computes itself from both workers' local arrays with numpy.
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

import loopback_workers

NUM_PROCESSES = 2
LOCAL_ROWS = 3          # TrajectoryBatch rows per process
PROMPT_LEN, RESPONSE_LEN, TURNS = 4, 5, 2
NUM_EXAMPLES = 11       # rows of the toy split that the loader shards
WORKER_TIMEOUT_S = 150  # hard bound on the whole two-process run


# --------------------------------------------------------------------------------------------------
# Worker side (runs in the child processes).


def _local_batch(process_id: int):
  """A valid TrajectoryBatch whose numbers depend on the process (so the two hosts' rows differ)."""
  from agent_r1_jax.rollout.batch import TrajectoryBatch  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(1000 + process_id)
  b = LOCAL_ROWS
  prompt_mask = np.ones((b, PROMPT_LEN), np.int32)
  prompt_mask[:, 0] = rng.integers(0, 2, b)          # some left padding
  lengths = rng.integers(2, RESPONSE_LEN + 1, b)
  response_mask = (np.arange(RESPONSE_LEN)[None, :] < lengths[:, None]).astype(np.int32)
  action_mask = response_mask.copy()
  action_mask[:, 1] = 0                               # one observation token inside every response
  last = np.array([np.flatnonzero(row)[-1] for row in action_mask], np.int32)
  turn_last = np.stack([np.zeros(b, np.int32), last], axis=1)
  return TrajectoryBatch(
      prompt_ids=rng.integers(1, 500, (b, PROMPT_LEN)).astype(np.int32) * prompt_mask,
      prompt_mask=prompt_mask,
      response_ids=rng.integers(1, 500, (b, RESPONSE_LEN)).astype(np.int32) * response_mask,
      response_mask=response_mask, action_mask=action_mask,
      sampler_logprobs=(-rng.random((b, RESPONSE_LEN)) * action_mask).astype(np.float32),
      last_action_index=last, turn_last_action_index=turn_last,
      process_rewards=np.zeros((b, TURNS), np.float32),
      group_ids=(np.arange(b) + 100 * process_id).astype(np.int32),
      num_turns=np.full(b, 2, np.int32), num_tool_calls=np.ones(b, np.int32), num_tool_errors=np.zeros(b, np.int32),
      stop_reason=np.ones(b, np.int32), response_text=[""] * b, ground_truth=["x"] * b, data_source=["toy"] * b)


def _worker(out_dir: pathlib.Path) -> None:
  from agent_r1_jax import distributed  # pylint: disable=import-outside-toplevel

  plan = distributed.maybe_initialize(initialization_timeout=60)

  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.data.loader import example_iterator  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sampling.multihost import any_across_processes  # pylint: disable=import-outside-toplevel

  pid = jax.process_index()
  report: dict = {"plan": plan.kind, "process_index": pid, "process_count": jax.process_count(),
                  "num_global_devices": len(jax.devices()), "num_local_devices": len(jax.local_devices())}

  # any_across_processes: the same sequence of calls on every process (each is a collective).
  cases = {"only_p0": pid == 0, "only_p1": pid == 1, "none": False, "both": True}
  report["any"] = {name: any_across_processes(np.array([False, flag, False])) for name, flag in cases.items()}

  # Host sharding of the data loader: one pass, no shuffle-dependent expectations.
  source = [{"id": f"q{i}"} for i in range(NUM_EXAMPLES)]
  it = example_iterator(source, batch_size=2, seed=3, num_epochs=1, drop_remainder=False,
                        shard_index=jax.process_index(), shard_count=jax.process_count())
  report["loader_ids"] = [ex["id"] for batch in it for ex in batch]

  # Global batch from per-process rows.
  mesh = jax.make_mesh((2, 1), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  report["mesh_process_order"] = [int(d.process_index) for d in mesh.devices.flat]
  batch = _local_batch(pid)
  local = batch.as_learner_inputs()
  np.savez(out_dir / f"local_{pid}.npz", **local)
  dev = batch.to_device(NamedSharding(mesh, P(("data", "fsdp"))))
  report["global_shapes"] = {k: list(v.shape) for k, v in dev.items()}
  sums = jax.jit(lambda d: {k: jnp.sum(v.astype(jnp.float32)) for k, v in d.items()})(dev)
  report["global_sums"] = {k: float(v) for k, v in sums.items()}
  replicate = jax.jit(lambda d: d, out_shardings=NamedSharding(mesh, P()))
  np.savez(out_dir / f"global_{pid}.npz", **{k: np.asarray(v) for k, v in replicate(dev).items()})
  (out_dir / f"report_{pid}.json").write_text(json.dumps(report))


# --------------------------------------------------------------------------------------------------
# Test side (the parent process).


def test_two_process_pod_on_loopback(tmp_path):
  loopback_workers.run_workers(__file__, tmp_path, num_processes=NUM_PROCESSES,
                                 timeout_s=WORKER_TIMEOUT_S)
  reports = [json.loads((tmp_path / f"report_{i}.json").read_text()) for i in range(NUM_PROCESSES)]
  local = [dict(np.load(tmp_path / f"local_{i}.npz")) for i in range(NUM_PROCESSES)]

  for i, r in enumerate(reports):
    assert r["plan"] == "explicit"
    assert (r["process_index"], r["process_count"]) == (i, NUM_PROCESSES)
    assert (r["num_global_devices"], r["num_local_devices"]) == (NUM_PROCESSES, 1)
    # A flag raised on one host only is seen on every host; none raised stays False.
    assert r["any"] == {"only_p0": True, "only_p1": True, "none": False, "both": True}

  # Loader shards are disjoint and together cover the split exactly once.
  ids = [r["loader_ids"] for r in reports]
  assert not set(ids[0]) & set(ids[1])
  assert sorted(ids[0] + ids[1]) == sorted(f"q{i}" for i in range(NUM_EXAMPLES))
  assert all(len(x) == len(set(x)) for x in ids)

  # The two local batches really differ (otherwise the checks below could not tell rows apart).
  assert not np.array_equal(local[0]["input_ids"], local[1]["input_ids"])
  order = reports[0]["mesh_process_order"]
  assert sorted(order) == list(range(NUM_PROCESSES)) and reports[1]["mesh_process_order"] == order
  for name in local[0]:
    expected_global = np.concatenate([local[p][name] for p in order], axis=0)
    expected_sum = sum(float(np.sum(local[p][name].astype(np.float64))) for p in range(NUM_PROCESSES))
    for i, r in enumerate(reports):
      assert r["global_shapes"][name] == list(expected_global.shape), name
      np.testing.assert_allclose(r["global_sums"][name], expected_sum, rtol=1e-6, err_msg=name)
      gathered = np.load(tmp_path / f"global_{i}.npz")[name]
      np.testing.assert_array_equal(gathered, expected_global, err_msg=f"{name} on process {i}")


if __name__ == "__main__":
  _worker(pathlib.Path(sys.argv[1]))
