"""Multi-host evaluation: the questions split over JAX processes on 127.0.0.1, the records gathered.

Against one process's run of the same evaluation:
  * `python -m agent_r1_jax.evaluate`, launched identically as two processes (`AGENT_R1_DISTRIBUTED=on`, one CPU
    device each, Gloo collectives) on a random tiny model's workdir, 3 questions per set (uneven over 2): the
    files process 0 writes equal, byte for byte, what one process writes; process 1 writes and prints nothing.
  * `rollout.evaluation.evaluate_examples` with a scripted policy (right on some questions, a search first on
    others, so episodes end at different turns on different processes) on 3 processes, for 5 questions and for
    1 (fewer than the processes): each process plays ceil(n / 3) episodes, and every process returns all records,
    in question order, equal to one process's, and so the same summaries (the lockstep driver: the scripted
    sampler keeps its contract).
  * the same on the slot engine, a random tiny model sampling at temperature 1 on a mesh over the 3 processes' devices
    (one slot each), for 5 questions and for 1 (two processes then play a padding episode): every process returns
    the records one process gets on its own devices with another batch size, which holds only if every question is
    keyed by its index whatever process plays it.
  * `experiments.seed_runs` (what `paper_tables` reuses, evaluates and hashes) on two processes: both take
    process 0's reading of the finished run and evaluation, process 1 without reading a file, and hash the
    step-0 policy sharded over both to the one-process hash.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

import loopback_workers

CLI_PROCESSES = 2
SCRIPTED_PROCESSES = 3
ARGS = ["--methods=agent,base_tool_call,naive_rag", "--datasets=synthetic,one_hop", "--num_examples=3",
        "--batch_size=2", "--samples_per_dataset=3"]
OUTPUTS = ("table.md", "results.json", "trajectories.html", "records.jsonl")


def _launch_cli(workdir: pathlib.Path, out_dir: pathlib.Path, timeout_s: float) -> list[str]:
  """The evaluation CLI as `CLI_PROCESSES` workers with the same command line; returns their logs."""
  port = loopback_workers.free_port()
  command = [sys.executable, "-m", "agent_r1_jax.evaluate", f"--workdir={workdir}", f"--out_dir={out_dir}", *ARGS]
  logs = [workdir.parent / f"cli_{i}.log" for i in range(CLI_PROCESSES)]
  procs = []
  for i, log in enumerate(logs):
    env = dict(loopback_workers.worker_env(i, CLI_PROCESSES, port), AGENT_R1_DISTRIBUTED="on")
    with log.open("w") as f:
      procs.append(subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    cwd=loopback_workers.REPO_ROOT))
  loopback_workers.wait_all(procs, timeout_s)
  texts = [log.read_text() for log in logs]
  assert [p.returncode for p in procs] == [0] * CLI_PROCESSES, "\n-----\n".join(t[-3000:] for t in texts)
  return texts


def _write_workdir(workdir: pathlib.Path) -> None:
  """A workdir of the tiny task (its config's mesh: one device) with random policies at steps 0 and 2, their
  weights tripled: at its initial scale a random tiny model writes the same newlines for every question."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.learner import build  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.models import Qwen2ForCausalLM  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer import task as task_lib  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer.checkpointing import Checkpointer  # pylint: disable=import-outside-toplevel
  from test_evaluate import _config  # pylint: disable=import-outside-toplevel

  c = _config()
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(c.to_json_best_effort(indent=2))
  arch = build.model_config(c, len(task_lib.build_task(c).tokenizer))
  checkpointer = Checkpointer(workdir / "checkpoints")
  for step in (0, 2):
    params = jax.tree.map(lambda x: 3 * x, nnx.split(Qwen2ForCausalLM(arch, rngs=nnx.Rngs(step)))[1])
    state = {"actor": params, "actor_opt": {"mu": jax.tree.map(jnp.zeros_like, params)},
             "rng": jax.random.key_data(jax.random.key(0))}
    checkpointer.save(step, state, {"step": step, "fingerprint": build.fingerprint(c, arch)}, force=True)
    checkpointer.wait()
  checkpointer.close()


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
  """A workdir (`run`) evaluated by the two-process CLI into `two` and by one process into `one`; returns the
  folder and the two processes' logs."""
  from agent_r1_jax.evaluation import pipeline  # pylint: disable=import-outside-toplevel

  root = tmp_path_factory.mktemp("evaluated")
  _write_workdir(root / "run")
  logs = _launch_cli(root / "run", root / "two", timeout_s=240)
  flags = dict(arg[2:].split("=", 1) for arg in ARGS)
  pipeline.run(workdir=str(root / "run"), hf_checkpoint=None, base_hf_checkpoint=None, step=None,
               methods=flags["methods"].split(","), datasets=flags["datasets"].split(","), out_dir=str(root / "one"),
               num_examples=3, batch_size=2, samples_per_dataset=3, seed=0)
  return root, logs


@pytest.mark.slow
def test_two_process_cli_writes_exactly_the_one_process_evaluation(evaluated):
  root, logs = evaluated
  for name in OUTPUTS:
    assert (root / "two" / name).read_text() == (root / "one" / name).read_text(), name
  records = [json.loads(line) for line in (root / "one" / "records.jsonl").read_text().splitlines()]
  assert len(records) == 3 * 2 * 3 and len({r["response"] for r in records}) > 9  # they differ by question
  assert "wrote " in logs[0] and "Exact match (EM)" in logs[0]
  assert "wrote " not in logs[1] and "Exact match (EM)" not in logs[1]


class _Unreadable:
  """The path process 1 is handed: joining works, reading fails, so a process 1 that reads a file fails."""

  def __truediv__(self, other):
    return self

  def is_file(self):
    raise AssertionError("process 1 read a file")

  read_text = is_file


def _tables_worker(job: dict, pid: int) -> dict:
  """`seed_runs` on a finished run and evaluation (process 1 given unreadable paths) and the step-0 hash."""
  import jax  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel

  from agent_r1_jax import trainer  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.experiments import seed_runs  # pylint: disable=import-outside-toplevel

  mine = lambda path: epath.Path(path) if pid == 0 else _Unreadable()  # noqa: E731
  sharded = epath.Path(job["sharded"])
  c = trainer.read_workdir_config(sharded)
  arch = trainer.model_config(c, vocab_size=len(trainer.build_task(c).tokenizer))
  params = trainer.restore_actor(sharded, c, arch, trainer.build_mesh(c), step=0)[1]
  return {"train": seed_runs.train_once(None, mine(job["run"])),
          "evaluation": seed_runs.evaluate_once(mine(job["run"]), mine(job["two"]), ["agent"], 3),
          "sha256": seed_runs.step0_sha256(sharded),
          "split": any(not x.is_fully_addressable for x in jax.tree.leaves(params))}


@pytest.mark.slow
def test_seed_runs_take_process_0s_reading_and_hash_across_processes(evaluated, tmp_path):
  from agent_r1_jax.experiments import seed_runs  # pylint: disable=import-outside-toplevel

  root, _ = evaluated
  (root / "run" / "summary.json").write_text("{}\n")  # a finished run
  sharded = tmp_path / "sharded"  # the run as a two-process run trains it: its mesh spans every device
  shutil.copytree(root / "run", sharded)
  config = json.loads((sharded / "config.json").read_text())
  config["mesh"] = {"data": 1, "fsdp": -1, "tensor": 1}
  (sharded / "config.json").write_text(json.dumps(config))
  job = {"run": str(root / "run"), "two": str(root / "two"), "sharded": str(sharded)}
  (tmp_path / "job.json").write_text(json.dumps(job))
  loopback_workers.run_workers(__file__, tmp_path, num_processes=2, timeout_s=150)

  want = {"train": {"reused": True}, "evaluation": seed_runs.read_evaluation(root / "two"),
          "sha256": seed_runs.step0_sha256(sharded), "split": True}
  assert len(want["evaluation"]["em"]["agent"]) == 2 * 3
  for pid in range(2):
    assert json.loads((tmp_path / f"process_{pid}.json").read_text()) == want, pid


# ---------------------------------------------------------------------------------------------------------
# The library path on 3 processes with a scripted policy.


def _scripted_records(num_examples: int):
  """`evaluate_examples` of this process (one or several) over the first `num_examples` test questions, and how
  many episodes this process played."""
  import jax  # pylint: disable=import-outside-toplevel
  # Imported here: the worker initialises jax.distributed first, and these start a JAX backend (bm25s).
  from test_evaluate import _config, _prefill_wrapper, _question, ScriptedSampler  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.rollout import evaluation  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sampling import SamplingParams  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer import task as task_lib  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.learner import build  # pylint: disable=import-outside-toplevel

  c = _config()
  task = task_lib.build_task(c)
  examples = list(task.test[task_lib.SYNTHETIC_SOURCE])[:num_examples]
  index = {ex["question"]: i for i, ex in enumerate(examples)}

  def script(prompt):  # question i: a search first when i % 3 == 0, the right answer when i is even
    i = index[_question(prompt)]
    answer = examples[i]["answers"][0] if i % 2 == 0 else "nobody"
    final = f"<think>done</think>\n<answer>{answer}</answer><|im_end|>"
    if i % 3:
      return [final]
    return ['<tool_call>\n{"name": "search", "arguments": {"query": "' + examples[i]["question"] + '"}}\n</tool_call>',
            final]

  tok = task.tokenizer
  limits = build.rollout_config(c, tok)
  stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>", "<|endoftext|>")]
  sampler = _prefill_wrapper(ScriptedSampler(tok, script, limits.cache_length, stops))
  played, prefill = [], sampler.prefill
  sampler.prefill = lambda params, ids, mask: played.append(len(ids)) or prefill(params, ids, mask)
  records = evaluation.evaluate_examples(sampler, None, task.env, tok, task.render, examples, limits,
                                         SamplingParams(greedy=True), jax.random.key(0), batch_size=2)
  return records, sum(played)


def _slot_records(num_examples: int, batch_size: int):
  """`evaluate_examples` on the slot engine (`rollout.engine`, the preset's) over the first `num_examples` test
  questions: a random tiny model (weights tripled so questions get different responses) on a mesh over every
  process's devices, sampled at temperature 1."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from test_evaluate import _config  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.learner import build  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.models import Qwen2ForCausalLM  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.rollout import evaluation  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sampling import SamplingParams, multihost  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sizing import rollout_sizing  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer import task as task_lib  # pylint: disable=import-outside-toplevel

  c = _config()
  c.mesh.data = -1
  task = task_lib.build_task(c)
  tok = task.tokenizer
  mesh = build.build_mesh(c)
  graphdef, params = nnx.split(Qwen2ForCausalLM(build.model_config(c, len(tok)), rngs=nnx.Rngs(5)))
  params = jax.tree.map(lambda x: multihost.replicated(3 * np.asarray(x), mesh), params)
  limits = build.rollout_config(c, tok)
  options = rollout_sizing.evaluation_slot_options(c, jax.device_count(), jax.process_count(), batch_size)
  assert options is not None
  return evaluation.evaluate_examples(
      build.build_sampler(c, graphdef, tok, limits, mesh), params, task.env, tok, task.render,
      list(task.test[task_lib.SYNTHETIC_SOURCE])[:num_examples], limits, SamplingParams(temperature=1.0),
      jax.random.key(2), batch_size=batch_size, slot_options=options)


def _dump(records) -> list[dict]:
  import dataclasses  # pylint: disable=import-outside-toplevel
  return [dataclasses.asdict(r) for r in records]


def _worker(out_dir: pathlib.Path) -> None:
  from agent_r1_jax import distributed  # pylint: disable=import-outside-toplevel

  distributed.maybe_initialize(initialization_timeout=60)
  import jax  # pylint: disable=import-outside-toplevel

  from agent_r1_jax.rollout import evaluation  # pylint: disable=import-outside-toplevel

  pid = jax.process_index()
  job = out_dir / "job.json"
  if job.is_file():
    got = _tables_worker(json.loads(job.read_text()), pid)
  else:
    got = {}
    for n in (5, 1):
      records, played = _scripted_records(n)
      got[n] = {"records": _dump(records), "summary": evaluation.summarize(records), "played": played,
                "slots": _dump(_slot_records(n, batch_size=2))}
  (out_dir / f"process_{pid}.json").write_text(json.dumps(got))


@pytest.mark.slow
def test_every_process_returns_the_one_process_records_in_question_order(tmp_path):
  from agent_r1_jax.rollout import evaluation  # pylint: disable=import-outside-toplevel

  loopback_workers.run_workers(__file__, tmp_path, num_processes=SCRIPTED_PROCESSES, timeout_s=240)
  # One process, its 8 devices, 5 slots each: other slots and windows than the workers' one slot per process.
  slots = {n: json.loads(json.dumps(_dump(_slot_records(n, batch_size=40)))) for n in (5, 1)}
  assert len({r["response"] for r in slots[5]}) > 1
  for n in (5, 1):
    want, played = _scripted_records(n)
    summary = evaluation.summarize(want)
    assert len(want) == played == n
    if n == 5:  # the figures are not trivial: some right, some wrong; one and two turns
      assert 0 < summary["em"] < 1 and 1 < summary["turns"] < 2 and summary["tool_calls"] > 0
    for pid in range(SCRIPTED_PROCESSES):
      got = json.loads((tmp_path / f"process_{pid}.json").read_text())[str(n)]
      assert got["records"] == json.loads(json.dumps(_dump(want))), (n, pid)
      assert got["summary"] == summary, (n, pid)
      assert got["played"] == -(-n // SCRIPTED_PROCESSES), (n, pid)  # its share (padded), not every question
      assert got["slots"] == slots[n], (n, pid)


if __name__ == "__main__":
  _worker(pathlib.Path(sys.argv[1]))
