"""Test-suite setup shared by every test module.

Eight fake CPU devices are requested before JAX is imported anywhere, so sharding tests can build
(data=2, fsdp=2, tensor=2) and (fsdp=8) meshes; single-device tests simply use device 0.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pathlib  # noqa: E402

import pytest  # noqa: E402

from agent_r1_jax import paths  # noqa: E402


# A worker's memory, the most the README's test command plans for: a margin over the SmolLM2 runs (a 135M-parameter
# model with its reference copy and AdamW state in float32), the suite's largest.
WORKER_MEMORY_BYTES = 6 << 30


def pytest_xdist_auto_num_workers(config):  # pylint: disable=unused-argument
  """`-n auto` (pytest-xdist): one worker per core this process may run on, at most one per `WORKER_MEMORY_BYTES`
  of the machine's memory."""
  cores = len(os.sched_getaffinity(0))
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return max(1, min(cores, memory // WORKER_MEMORY_BYTES))


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  """Files that hold a `slow` test first, each file's tests kept together and in order: pytest-xdist hands a worker
  the next file as it finishes one, so the long files start early and the short ones even out the end."""
  slow_files = {item.path for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.path not in slow_files)  # stable


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """`../shared/data`, or a skip with the reason when it is absent (as on a user's machine)."""
  path = paths.shared_data_dir()
  if not path.is_dir():
    pytest.skip(f"shared public data not found at {path} (set AGENT_R1_SHARED_DATA to its location)")
  return path


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(shared_data: pathlib.Path) -> pathlib.Path:
  """The real Qwen2.5-Instruct tokenizer directory from the shared data."""
  path = shared_data / "qwen2.5_tokenizer"
  if not path.is_dir():
    pytest.skip(f"Qwen2.5 tokenizer not found at {path}")
  return path


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory):
  """A persistent XLA compilation cache for the session: tests that build the same programs again (the
  trainer runs, resume, every algorithm) load them instead of recompiling. The environment variables hand the
  same cache to every process a test starts (a CLI run and its resume, the notebook's kernel and its runs, the
  workers of a two-process run), which read JAX's settings from them."""
  import jax  # pylint: disable=import-outside-toplevel
  cache_dir = str(tmp_path_factory.mktemp("xla_cache"))
  settings = {"jax_compilation_cache_dir": cache_dir, "jax_persistent_cache_min_compile_time_secs": 0.0,
              "jax_persistent_cache_min_entry_size_bytes": 0}
  for name, value in settings.items():
    jax.config.update(name, value)
    os.environ[name.upper()] = str(value)
  yield


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
  """Generated artefacts go to a per-session temp folder, never the user's home cache."""
  monkeypatch.setenv("AGENT_R1_CACHE", str(tmp_path_factory.getbasetemp() / "agent_r1_cache"))


@pytest.fixture(scope="session")
def synthetic_world(tmp_path_factory):
  """`make(**sizes) -> SyntheticWorldFiles`: a generated world of `WorldConfig(**sizes)`, prepared once per
  session in one cache folder (the same sizes in two test files share the same files)."""
  from agent_r1_jax.data.synthetic import prepare_synthetic_world  # pylint: disable=import-outside-toplevel  (after XLA_FLAGS)
  root = tmp_path_factory.mktemp("worlds")

  def make(**sizes):
    return prepare_synthetic_world(cache_root=root, **sizes)
  return make


@pytest.fixture(scope="session")
def smollm2_tokenizer(shared_data: pathlib.Path):
  """The real SmolLM2-135M-Instruct tokenizer that transformers builds from the shared GGUF's metadata
  (vocabulary 49,152; no tool support in its chat template; `<tool_call>` / `</tool_call>` are five ordinary
  tokens each), read once per session (about 12 s); skips with the reason when the file or `gguf` is absent."""
  path = shared_data / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
  if not path.is_file():
    pytest.skip(f"SmolLM2 GGUF not found at {path}")
  pytest.importorskip("gguf", reason="reading a tokenizer from a GGUF file needs the gguf package")
  import transformers  # pylint: disable=import-outside-toplevel  (after XLA_FLAGS)
  return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
