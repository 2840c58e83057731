"""The model cache is whole, built once, and checked by content: the assembled GGUF (models.model_path)
and its Hugging Face conversion for vLLM (vllm.hf_model_dir).

No download and no vLLM: model "fake" and the "vLLM Python" with its slow converter come from
tests/_fake_vllm.py.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pathlib

import pytest

from capcal_integrations.errors import ModelError
from capcal_integrations.server import MODELS, integrity, model_path
from capcal_integrations.server.vllm import hf_model_dir
from tests import _fake_vllm

FILES = {"config.json", "model.safetensors", "tokenizer.json"}


@pytest.fixture
def fake_model(monkeypatch, tmp_path) -> bytes:
    return _fake_vllm.fake_model(monkeypatch, tmp_path / "cache")


@pytest.fixture
def fake_python(tmp_path) -> pathlib.Path:
    return _fake_vllm.fake_python(tmp_path)


def _conversions(tmp_path) -> list[str]:
    path = tmp_path / "conversions"
    return path.read_text().split() if path.exists() else []


def _assert_one_conversion(folder: pathlib.Path) -> str:
    """The folder holds exactly one converter's files; returns that converter's tag."""
    names = {p.name for p in folder.iterdir()}
    tags = {p.read_text() for p in folder.iterdir() if p.name != integrity.MARKER}
    assert len(tags) == 1, names
    tag = tags.pop()
    assert names == FILES | {f"only-{tag}", integrity.MARKER}
    assert integrity.marker_problem(folder, MODELS["fake"].sha256) is None
    return tag


def _leftovers(cache: pathlib.Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(".") or p.name.endswith(".lock"))


# --- the assembled GGUF ---------------------------------------------------------------------------------


def test_a_cached_model_of_zeros_with_the_right_size_and_sidecar_is_rejected_and_reassembled(fake_model, tmp_path,
                                                                                              caplog):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "fake.gguf").write_bytes(bytes(len(fake_model)))  # right size, and a sidecar that vouches for it
    (cache / "fake.gguf.sha256").write_text(f"{MODELS['fake'].sha256}  fake.gguf\n")
    with caplog.at_level(logging.WARNING):
        path = model_path("fake", install=False)
    assert path.read_bytes() == fake_model
    assert "is corrupt" in caplog.text and "assembling it again" in caplog.text
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]  # no lock or temp file


def test_a_right_file_whose_sidecar_was_lost_is_kept(fake_model, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "fake.gguf").write_bytes(fake_model)
    inode = (cache / "fake.gguf").stat().st_ino
    assert model_path("fake", install=False).stat().st_ino == inode  # verified by content, not rebuilt
    assert (cache / "fake.gguf.sha256").read_text().split()[0] == MODELS["fake"].sha256


def test_the_cached_model_is_hashed_once_per_process_and_file_state(fake_model, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / "fake.gguf"
    path.write_bytes(fake_model)  # as if assembled by another process: never hashed by this one
    (cache / "fake.gguf.sha256").write_text(f"{MODELS['fake'].sha256}  fake.gguf\n")
    hashed = []
    digest = integrity._digest
    monkeypatch.setattr(integrity, "_digest", lambda p: hashed.append(p) or digest(p))
    for _ in range(20):
        assert model_path("fake", install=False) == path
    assert hashed == [path]
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: checked again, once
    for _ in range(5):
        model_path("fake", install=False)
    assert hashed == [path, path]


def test_an_assembled_model_is_not_hashed_again(fake_model, tmp_path, monkeypatch):
    hashed = []
    digest = integrity._digest
    monkeypatch.setattr(integrity, "_digest", lambda p: hashed.append(p) or digest(p))
    for _ in range(3):
        assert model_path("fake", install=False).read_bytes() == fake_model
    assert hashed == []  # hashed while it was written


# --- the Hugging Face conversion --------------------------------------------------------------------------


def test_two_processes_converting_at_once_leave_one_consistent_folder(fake_model, fake_python, tmp_path):
    ctx = multiprocessing.get_context("fork")  # the children see the "fake" model registered here
    procs = [ctx.Process(target=hf_model_dir, args=("fake",), kwargs={"python": str(fake_python)}) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    folder = tmp_path / "cache" / "fake-hf"
    tag = _assert_one_conversion(folder)
    assert _conversions(tmp_path) == [tag]  # the second process waited, found the first one's folder, reused it
    assert _leftovers(tmp_path / "cache") == []


def _change_a_file(folder: pathlib.Path) -> None:
    with open(folder / "model.safetensors", "a") as f:
        f.write("!")


def _add_a_file(folder: pathlib.Path) -> None:
    (folder / "only-12345").write_text("12345")  # as another converter's file would be


def _remove_a_file(folder: pathlib.Path) -> None:
    (folder / "tokenizer.json").unlink()


def _forge_the_marker(folder: pathlib.Path) -> None:
    marker = json.loads((folder / integrity.MARKER).read_text())
    marker["files"]["config.json"] = "0" * 64
    (folder / integrity.MARKER).write_text(json.dumps(marker))


def _other_source(folder: pathlib.Path) -> None:
    marker = json.loads((folder / integrity.MARKER).read_text())
    marker["source_sha256"] = "0" * 64
    (folder / integrity.MARKER).write_text(json.dumps(marker))


def _old_marker(folder: pathlib.Path) -> None:
    (folder / integrity.MARKER).write_text(f"{MODELS['fake'].sha256}  fake.gguf\n")  # the format before the hashes


@pytest.mark.parametrize("tamper", [_change_a_file, _add_a_file, _remove_a_file, _forge_the_marker, _other_source,
                                    _old_marker], ids=lambda f: f.__name__.strip("_"))
def test_a_folder_that_fails_its_check_is_converted_again(fake_model, fake_python, tmp_path, caplog, tamper):
    folder = hf_model_dir("fake", python=str(fake_python))
    first = _assert_one_conversion(folder)
    assert hf_model_dir("fake", python=str(fake_python)) == folder and _conversions(tmp_path) == [first]  # reused
    tamper(folder)
    with caplog.at_level(logging.WARNING):
        assert hf_model_dir("fake", python=str(fake_python)) == folder
    assert "fails its check" in caplog.text and "converting it again" in caplog.text
    second = _assert_one_conversion(folder)
    assert _conversions(tmp_path) == [first, second]
    assert _leftovers(tmp_path / "cache") == []


def test_a_failed_conversion_leaves_no_folder_and_says_so(fake_model, fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CONVERT_FAIL", "1")
    with pytest.raises(ModelError, match="failed \\(exit 3\\)"):
        hf_model_dir("fake", python=str(fake_python))
    cache = tmp_path / "cache"
    assert not (cache / "fake-hf").exists() and _leftovers(cache) == []


def test_the_lock_file_is_removed_and_a_waiter_never_holds_a_stale_one(tmp_path):
    """Lock, release (the file goes), lock again: each holder locks the file the path names."""
    import fcntl
    import threading

    target = tmp_path / "entry"
    inside, order = threading.Event(), []

    def second():
        inside.wait()
        with integrity.file_lock(target):
            order.append("second")

    t = threading.Thread(target=second)
    t.start()
    with integrity.file_lock(target):
        inside.set()
        lock = tmp_path / "entry.lock"
        fd = os.open(lock, os.O_RDONLY)
        try:  # held: a non-blocking lock on the same file fails
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        order.append("first")
    t.join(10)
    assert order == ["first", "second"] and not (tmp_path / "entry.lock").exists()
