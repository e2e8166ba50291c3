"""A local Cloud Storage emulator (gcp-storage-emulator, in memory) for the tests of `gs://` workdirs.

`running_emulator()` starts it in a subprocess on a free localhost port with one bucket, and yields the
environment that points every client of a run at it instead of storage.googleapis.com:
  STORAGE_EMULATOR_HOST            gcsfs (epath's gs:// files and listings)
  FSSPEC_GCS_TOKEN=anon            gcsfs sends no credentials (none exist here; it would probe for them)
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false   gcsfs asks no gRPC Storage Control API about the bucket's layout
  TENSORSTORE_GCS_HTTP_URL         tensorstore's gcs driver (orbax's checkpoint arrays)
  GOOGLE_AUTH_TOKEN_FOR_TESTING    tensorstore's fixed bearer token instead of Google credentials
Nothing leaves the machine. `use_in_this_process(env)` applies it to the test process itself.

The emulator runs from this file (`python gcs_emulator.py PORT BUCKET`), which adds to its media downloads the
`x-goog-generation` header that Cloud Storage sends with every object it serves and that the emulator omits:
tensorstore reads an object's generation from it to update orbax's OCDBT manifest, and refuses a download without
one ("Malformed StorageGeneration").
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def running_emulator(bucket: str = "bucket", *, timeout_s: float = 30.0) -> Iterator[dict[str, str]]:
  """Starts the emulator with `bucket` created; yields the client environment (see the module docstring)."""
  port = _free_port()
  with tempfile.TemporaryFile() as log:
    proc = subprocess.Popen([sys.executable, __file__, str(port), bucket], stdout=log, stderr=subprocess.STDOUT)
    try:
      deadline = time.monotonic() + timeout_s
      while True:
        try:
          socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
          break
        except OSError:
          if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            raise RuntimeError(f"the GCS emulator did not start: {log.read().decode(errors='replace')[-2000:]}")
          time.sleep(0.1)
      url = f"http://127.0.0.1:{port}"
      yield {"STORAGE_EMULATOR_HOST": url, "FSSPEC_GCS_TOKEN": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
             "TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator"}
    finally:
      proc.terminate()
      proc.wait(timeout=10)


def use_in_this_process(env: dict[str, str], monkeypatch) -> None:
  """Points this process's clients at the emulator: the environment (tensorstore and gcsfs read it when they
  open the bucket), fsspec's gs defaults (read from the environment only when fsspec is imported, which may have
  happened already), gcsfs's plain file system class (the layout-probing one is chosen at gcsfs import) and no
  cached gcsfs instance from another emulator."""
  import fsspec  # pylint: disable=import-outside-toplevel
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})
  import gcsfs.core  # pylint: disable=import-outside-toplevel
  fsspec.register_implementation("gs", gcsfs.core.GCSFileSystem, clobber=True)
  gcsfs.core.GCSFileSystem.clear_instance_cache()


def _serve(port: int, bucket: str) -> None:
  """Runs the in-memory emulator on 127.0.0.1:`port` with `bucket`, its downloads carrying x-goog-generation."""
  from gcp_storage_emulator import server  # pylint: disable=import-outside-toplevel
  from gcp_storage_emulator.handlers import objects  # pylint: disable=import-outside-toplevel

  download = objects.download

  def download_with_generation(request, response, storage, *args, **kwargs):
    download(request, response, storage, *args, **kwargs)
    if response.status.value < 300:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
      response["x-goog-generation"] = str(obj["generation"])
      response["x-goog-metageneration"] = str(obj["metageneration"])

  objects.download = download_with_generation  # `objects.get` (?alt=media) looks it up here at each call
  for _, methods in server.HANDLERS:  # the routes that name it directly
    for method, handler in methods.items():
      if handler is download:
        methods[method] = download_with_generation
  server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
  _serve(int(sys.argv[1]), sys.argv[2])
