"""docs/retrieval_at_scale.md's commands, run in bash in page order at tiny scale: a DPR-format TSV as $WIKI, a
2-layer random BERT as $E5. A block marked `# server:` is started and waited for on /health (and stopped at the
end), `# cloud-only:` blocks are skipped (each must say why), the `# long-running:` measurement is a bench whose
--smoke mode tests/test_bench_smoke.py runs. Then both servers answer a search with the passages it should."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from agent_r1_jax.retrieval import BM25Index, HttpRetriever, Passage
from test_retrieval_dense import tiny_bert  # noqa: F401  pylint: disable=unused-import

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "retrieval_at_scale.md"
TOPICS = ["iliad", "homer", "australia", "canberra", "capital", "poem", "greek", "city", "river", "music"]


def command_blocks() -> list[str]:
  return re.findall(r"```bash\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _passages(n: int = 300) -> list[Passage]:
  return [Passage(str(i + 1), f"{TOPICS[i % 10].title()} {i}",
                  " ".join(TOPICS[(i * j + j) % 10] for j in range(1, 12)) + f" who wrote the iliad {i}")
          for i in range(n)]


def _write_tsv(path: pathlib.Path, passages: list[Passage]) -> None:
  rows = ["id\ttext\ttitle"] + [f'{p.id}\t"{p.text}"\t{p.title}' for p in passages]
  path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_every_block_is_marked_or_runnable():
  blocks = command_blocks()
  assert len(blocks) >= 8
  for block in blocks:
    first = block.splitlines()[0]
    if first.startswith(("# cloud-only:", "# long-running:", "# server:")):
      assert len(first.split(":", 1)[1].strip()) > 10, f"say why: {first!r}"
  long_running = [b for b in blocks if b.startswith("# long-running:")]
  assert all("python bench/retrieval.py" in b for b in long_running)
  smoke = (REPO / "tests" / "test_bench_smoke.py").read_text()
  assert '"retrieval": [' in smoke  # bench/retrieval.py --smoke runs there


@pytest.mark.slow
def test_the_page_runs_at_tiny_scale(tiny_bert, tmp_path):  # noqa: F811
  if shutil.which("curl") is None:
    pytest.skip("curl is not installed")
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the page's `python` is this one
  (bin_dir / "python").chmod(0o755)
  passages = _passages()
  _write_tsv(tmp_path / "psgs_w100.tsv", passages)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", JAX_PLATFORMS="cpu",
             WIKI=str(tmp_path / "psgs_w100.tsv"), BM25=str(tmp_path / "bm25"), E5=str(tiny_bert),
             EMB=str(tmp_path / "emb"), DENSE=str(tmp_path / "dense"), PORT=str(_free_port()),
             DENSE_PORT=str(_free_port()))
  servers = []
  try:
    for block in command_blocks():
      first = block.splitlines()[0]
      if first.startswith(("# cloud-only:", "# long-running:")):
        continue
      if first.startswith("# server:"):
        port = env["DENSE_PORT"] if "$DENSE_PORT" in block else env["PORT"]
        servers.append(subprocess.Popen(["bash", "-c", block], cwd=REPO, env=env, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.monotonic() + 180
        while True:
          assert servers[-1].poll() is None, servers[-1].stderr.read().decode()[-3000:]
          try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
              break
          except httpx.HTTPError:
            pass
          assert time.monotonic() < deadline, f"no /health on {port}: {block}"
          time.sleep(0.3)
        continue
      proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=900, check=False)
      assert proc.returncode == 0, (f"{block}\n--- stdout ---\n{proc.stdout[-3000:]}\n"
                                    f"--- stderr ---\n{proc.stderr[-3000:]}")
    assert len(servers) == 2
    query = ["who wrote the iliad homer greek poem"]
    bm25 = HttpRetriever(f"http://127.0.0.1:{env['PORT']}").search(query, 5)
    assert bm25 == BM25Index(passages).search(query, 5)
    dense = HttpRetriever(f"http://127.0.0.1:{env['DENSE_PORT']}/retrieve").search(query, 5)
    assert len(dense[0]) == 5 and {h.passage for h in dense[0]} <= set(passages)
  finally:
    for server in servers:
      os.killpg(server.pid, signal.SIGTERM)
      server.wait(timeout=60)
