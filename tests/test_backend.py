"""The backend line and the refusal to train a real preset on the CPU backend (`trainer/backend.py`), the
`tpu` / `cuda12` install extras that the refusal names, and the launch scripts' default set-up that installs
them. Here JAX runs on the CPU (conftest: 8 fake devices), which is exactly the case the refusal is for."""

from __future__ import annotations

import os
import pathlib
import re
import stat
import subprocess
import sys

import jax
import pytest

from agent_r1_jax.trainer import backend
from agent_r1_jax.trainer import config as config_lib
from agent_r1_jax.trainer import loop

REPO = pathlib.Path(__file__).resolve().parent.parent


def _clean_env(**extra: str) -> dict[str, str]:
  """This environment without multi-host variables (one plain process) and without AGENT_R1_DEBUG."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_", "SLURM_", "AGENT_R1_DISTRIBUTED", "AGENT_R1_DEBUG"))}
  env.update(extra)
  return env


def _real_config(tmp_path: pathlib.Path, preset: str = "qwen2.5-0.5b"):
  """A real preset with its required paths set (to empty directories: the refusal must come before any read)."""
  c = config_lib.base_config("grpo", preset)
  (tmp_path / "model").mkdir(exist_ok=True)
  (tmp_path / "data").mkdir(exist_ok=True)
  c.model.path = str(tmp_path / "model")
  c.data.prepared_dir = str(tmp_path / "data")
  return c


# --------------------------------------------------------------------------------------------------
# The CLI


def test_real_preset_on_cpu_is_refused_by_the_cli_with_one_message(tmp_path):
  (tmp_path / "model").mkdir()
  (tmp_path / "data").mkdir()
  workdir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "-m", "agent_r1_jax.train", "--config=configs/grpo_multihopqa.py:qwen2.5-0.5b",
       f"--config.model.path={tmp_path / 'model'}", f"--config.data.prepared_dir={tmp_path / 'data'}",
       f"--workdir={workdir}"],
      cwd=REPO, env=_clean_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr
  assert "Traceback" not in result.stderr, result.stderr
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, result.stderr
  message = errors[0]
  for needed in ("qwen2.5-0.5b", "needs a TPU or GPU", "backend: cpu", 'pip install -e ".[tpu]"',
                 'pip install -e ".[cuda12]"', "--config.allow_cpu=True", "JAX_PLATFORMS=cpu"):
    assert needed in message, (needed, message)
  # The test requirements install libtpu (the TPU dry run compiles with it), so the jaxlib reason shows only
  # where no plugin is installed (its wording is checked in-process below).
  assert ("CPU-only jaxlib" in message) == (not backend.installed_plugins()), message
  assert not workdir.exists()  # refused before the trainer made or read anything


# --------------------------------------------------------------------------------------------------
# check_accelerator


@pytest.mark.parametrize("preset", sorted(config_lib.REAL_PRESETS))
def test_every_real_preset_is_refused_on_cpu(tmp_path, preset):
  with pytest.raises(ValueError, match=r"needs a TPU or GPU.*\.\[tpu\].*\.\[cuda12\].*--config\.allow_cpu=True"):
    backend.check_accelerator(_real_config(tmp_path, preset))


@pytest.mark.parametrize("field", ["allow_cpu", "dry_run"])
def test_real_preset_on_cpu_is_allowed_by_allow_cpu_and_dry_run(tmp_path, field):
  c = _real_config(tmp_path)
  c[field] = True
  backend.check_accelerator(c)


def test_tiny_preset_runs_on_cpu():
  backend.check_accelerator(config_lib.base_config("grpo", "tiny"))
  backend.check_accelerator(config_lib.base_config("ppo"))


def test_refusal_says_when_a_plugin_is_installed_but_finds_no_device(tmp_path, monkeypatch):
  monkeypatch.setattr(backend, "installed_plugins", lambda: ["libtpu"])
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  with pytest.raises(ValueError) as info:
    backend.check_accelerator(_real_config(tmp_path))
  message = str(info.value)
  assert "(libtpu) is installed but JAX found no TPU or GPU" in message
  assert "CPU-only jaxlib" not in message and "JAX_PLATFORMS" not in message


def test_refusal_names_the_cpu_only_jaxlib_when_no_plugin_is_installed(tmp_path, monkeypatch):
  monkeypatch.setattr(backend, "installed_plugins", lambda: [])
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  with pytest.raises(ValueError, match=r"pip installed the CPU-only jaxlib.*\.\[tpu\]"):
    backend.check_accelerator(_real_config(tmp_path))


# --------------------------------------------------------------------------------------------------
# The backend line and train()


def test_backend_line_names_platform_devices_and_processes():
  line = backend.describe_backend()
  assert line == f"backend: cpu, {jax.device_count()} x cpu devices, 1 process"
  assert jax.device_count() == 8  # conftest's fake devices


class _FakeTrainer:
  """Stands in for RLTrainer: records that train() got as far as building it."""
  built = []

  def __init__(self, c, workdir):
    self.built.append(c.preset)

  def run(self):
    return "ran"


def test_train_prints_the_backend_line_then_builds_the_trainer(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(loop, "RLTrainer", _FakeTrainer)
  _FakeTrainer.built.clear()
  assert loop.train(config_lib.base_config("grpo", "tiny"), tmp_path / "run") == "ran"
  assert _FakeTrainer.built == ["tiny"]
  assert backend.describe_backend() in capsys.readouterr().out.splitlines()


def test_train_refuses_a_real_preset_on_cpu_before_building_the_trainer(tmp_path, monkeypatch):
  monkeypatch.setattr(loop, "RLTrainer", _FakeTrainer)
  _FakeTrainer.built.clear()
  with pytest.raises(ValueError, match="allow_cpu"):
    loop.train(_real_config(tmp_path), tmp_path / "run")
  assert _FakeTrainer.built == []
  c = _real_config(tmp_path)
  c.allow_cpu = True
  assert loop.train(c, tmp_path / "run") == "ran"


# --------------------------------------------------------------------------------------------------
# The install extras and the launch scripts' default set-up


def test_extras_pin_the_accelerator_builds_of_the_pinned_jax():
  tomllib = pytest.importorskip("tomllib")  # Python 3.11+
  extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  pin = re.search(r"^jax==(\S+)$", (REPO / "requirements.txt").read_text(), re.M).group(1)
  assert jax.__version__ == pin
  assert extras["tpu"] == [f"jax[tpu]=={pin}"]
  assert extras["cuda12"] == [f"jax[cuda12]=={pin}"]


def test_tpu_pod_setup_installs_the_tpu_extra_unless_libtpu_is_there():
  """`tpu_pod.sh setup` (dry run: the script it would send to every worker) installs the package with its `tpu`
  extra, and counts a venv without libtpu as incomplete. Its Python provisioning runs in test_pod_rehearsal.py."""
  env = _clean_env(DRY_RUN="1")
  result = subprocess.run(["bash", str(REPO / "launch" / "tpu_pod.sh"), "setup", "tpu", "zone"], env=env,
                          capture_output=True, text=True, timeout=30)
  assert result.returncode == 0, result.stderr
  ssh = next(line for line in result.stdout.splitlines() if " ssh " in line and "--worker=all" in line)
  # The words bash makes of the printed command (printf %q quoting, which shlex does not read); nothing runs.
  words = subprocess.run(["bash", "-c", 'eval "set -- $LINE"; printf "%s\\0" "$@"'], env={"LINE": ssh},
                         capture_output=True, text=True, timeout=10, check=True).stdout.split("\0")[:-1]
  remote = next(w for w in words if w.startswith("--command=")).split("=", 1)[1]
  assert '-m pip install --quiet -e "$HOME/${repo}[tpu]"' in remote
  assert 'importlib.util.find_spec("libtpu") is None' in remote
  # Run last, with pyproject's Python range and the defaults (uv's 3.11, the installer allowed).
  assert remote.endswith("cd; w_setup agent_r1_jax_code.tar.gz agent_r1_jax agent_r1_venv agent_r1_logs 3.11 3.14 3.11 "
                         "1 '")


@pytest.mark.parametrize("plugin_installed", [False, True])
def test_gpu_slurm_default_setup_installs_the_cuda12_extra_once_before_the_tasks(tmp_path, plugin_installed):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "log"
  scripts = {
      "scontrol": "#!/usr/bin/env bash\necho gpu-a17\necho gpu-b03\n",
      "srun": f"#!/usr/bin/env bash\necho srun >> {log}\n",
      # The plugin probe (`python -c ...find_spec...`) fails unless the plugin is "installed".
      "python": (f"#!/usr/bin/env bash\necho \"python $*\" >> {log}\n"
                 f"if [[ $1 == -c ]]; then exit {0 if plugin_installed else 1}; fi\n"),
  }
  for name, text in scripts.items():
    path = bin_dir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
  env = _clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHON=str(bin_dir / "python"),
                   SLURM_JOB_ID="7", SLURM_JOB_NODELIST="gpu-a17,gpu-b03", SLURM_JOB_NUM_NODES="2")
  env.pop("SETUP", None)
  result = subprocess.run(["bash", str(REPO / "launch" / "gpu_slurm.sbatch"), "--config=c"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=10)
  assert result.returncode == 0, result.stderr
  calls = log.read_text().splitlines()
  assert calls[0].startswith("python -c ") and "jax_cuda12_plugin" in calls[0]
  expected = ([] if plugin_installed else ["python -m pip install -q -e .[cuda12]"]) + ["srun"]
  assert calls[1:] == expected
