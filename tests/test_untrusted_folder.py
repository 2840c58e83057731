"""The decisions folder is input, not trust (issue 51): files that cannot break, hang or steer a ranking.

Each test plants what another process, an older version, a disk error or another local user could leave in the
folder (capcal_integrations/content_check/saved_decisions.py, saved_readings.py, saved_folder.py) and checks that the
ranking goes on (the file ignored with one WARNING naming it, the check deciding afresh), within its deadline, and
that ``capcal status`` and ``capcal decisions forget`` still work. Anything that could hang or fill memory runs in a
thread with a timeout or in a child process under a memory limit."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from capcal_integrations import InputError
from capcal_integrations.content_check.saved_decisions import Store, key_id
from tests.test_content_check import lists
from tests.test_decisions import Served, a_decision

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _checked_once(data):
    """A check that read one query (its readings kept): the folder, the key and its id."""
    rr = Served(data).reranker(check_wait=True)
    rr.rerank(*data[0][:2])
    [check] = rr._state.content.values()
    return Store().folder, check.key, key_id(check.key)


def _rank_within(data, seconds=30.0, k=1):
    """A new process's first ranking (a new endpoint state), in a thread that must end within ``seconds``."""
    out = {}

    def run():
        try:
            rr = Served(data).reranker(check_wait=True, deadline=5)
            out["ranking"] = rr.rerank(*data[k][:2])
            out["checks"] = list(rr._state.content.values())
        except BaseException as err:  # noqa: BLE001 - reported by the test
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return thread.is_alive(), out


def _unblock(fifo):
    """Let a reader blocked on ``fifo`` go (today's code opened it for reading and waited for a writer)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def _warned(caplog, path):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]


def _decision_text(key, **changes):
    """A saved decision's file text for ``key`` (``changes`` to its fields, e.g. an impossible alpha)."""
    values = json.loads(a_decision(key=key).to_json())
    values.update(changes)
    return json.dumps({"capcal_saved_decision": 1, "id": key_id(key), "source": "rule 'query'",
                       "saved_at": "2026-01-01T00:00:00+00:00", "decision": values}) + "\n"


def _run_limited(code, env, megabytes=None, seconds=60):
    """``code`` in a child Python (this checkout first on its path), its address space limited to ``megabytes``
    above what it starts with, killed after ``seconds``."""
    prelude = ""
    if megabytes is not None:
        prelude = ("import resource\n"
                   "start = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
                   f"resource.setrlimit(resource.RLIMIT_AS, (start + {megabytes} * 2**20, resource.RLIM_INFINITY))\n")
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", prelude + code], env=env, capture_output=True, text=True,
                          timeout=seconds, cwd=ROOT)


# --------------------------------------------------------------------------- bytes and values


@pytest.mark.parametrize("which", ["decision", "readings"])
def test_a_byte_that_is_not_utf8_is_ignored_with_one_warning_and_the_check_decides_afresh(which, caplog):
    """Finding 1: one byte that is not UTF-8 stopped every ranking of the model (UnicodeDecodeError, no WARNING)."""
    data = lists(16)
    where, key, ident = _checked_once(data)
    path = where / f"{ident}.json" if which == "decision" else where / "readings" / f"{ident}.json"
    good = _decision_text(key) if which == "decision" else path.read_text()
    path.write_bytes(good.encode()[:40] + b"\xff\xfe" + good.encode()[40:])
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        hung, out = _rank_within(data)
    assert not hung and "error" not in out, out.get("error")
    [warning] = _warned(caplog, path)
    assert "not UTF-8" in warning and "forget" in warning
    assert out["checks"][0].decision is None  # decides afresh


@pytest.mark.parametrize("alpha", [float("inf"), float("-inf"), -50.0])
def test_an_impossible_alpha_in_a_saved_decision_is_ignored_and_rankings_go_on(alpha, caplog):
    """Finding 2: ``"alpha": Infinity`` passed the type check, and every ranking then raised an InputError naming an
    option the user never set."""
    data = lists(16)
    where, key, ident = _checked_once(data)
    path = where / f"{ident}.json"
    path.write_text(_decision_text(key, alpha=alpha))
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        hung, out = _rank_within(data)
    assert not hung and "error" not in out, out.get("error")
    [warning] = _warned(caplog, path)
    assert "'alpha' must be a finite number >= 0" in warning
    assert out["checks"][0].decision is None and out["ranking"].kept_given_order


def test_the_decision_option_reads_its_file_as_input(tmp_path):
    """The ``decision=`` option's file: not UTF-8, a device (read until memory ran out) or a named pipe (a hang)
    is a typed InputError, read bounded (in a child process under a memory limit and a timeout)."""
    (tmp_path / "bad.json").write_bytes(b"\xff{}")
    os.mkfifo(tmp_path / "pipe.json", 0o600)
    code = f"""
from capcal_integrations import InputError
from capcal_integrations.content_check.decision import load_decision
for name in ("/dev/zero", {str(tmp_path / "bad.json")!r}, {str(tmp_path / "pipe.json")!r}):
    try:
        load_decision(name)
    except InputError as err:
        print("InputError", err)
"""
    try:
        result = _run_limited(code, {}, megabytes=200, seconds=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the decision option hung on a named pipe")
    finally:
        _unblock(tmp_path / "pipe.json")
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and len(lines) == 3, result.stderr[-2000:]
    assert "not a regular file" in lines[0] and "not UTF-8" in lines[1] and "not a regular file" in lines[2]


def test_a_negative_count_or_evidence_in_a_readings_file_is_refused(tmp_path):
    from capcal_integrations.content_check import saved_readings

    ident = "0" * 16
    path = saved_readings.path(tmp_path, ident)
    path.parent.mkdir(mode=0o700)
    path.write_text(json.dumps({"capcal_check_readings": saved_readings.FORMAT, "key": {"model": "m"},
                                "e_value": -3.0, "readings": []}))
    assert "'e_value' a number >= 0" in saved_readings.load(tmp_path, ident).problem


# --------------------------------------------------------------------------- special files


@pytest.mark.parametrize("which", ["decision", "readings"])
def test_a_named_pipe_in_the_folder_does_not_hang_the_ranking(which, caplog):
    """Finding 3: a named pipe at ``<id>.json`` or ``readings/<id>.json`` hung the first ranking for good
    (``deadline=5`` did not help)."""
    data = lists(16)
    where, _, ident = _checked_once(data)
    path = where / f"{ident}.json" if which == "decision" else where / "readings" / f"{ident}.json"
    path.unlink(missing_ok=True)
    os.mkfifo(path, 0o600)
    try:
        with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
            hung, out = _rank_within(data, seconds=20)
    finally:
        _unblock(path)
    assert not hung, "the ranking hung on a named pipe"
    assert "error" not in out, out.get("error")
    [warning] = _warned(caplog, path)
    assert "not a regular file" in warning


_STATUS_AND_FORGET = """
from capcal_integrations.commands.cli import main
assert main(["status"]) == 0
assert main(["decisions", "forget", "--all"]) == 0
print("OK")
"""


def test_capcal_status_and_forget_work_on_a_folder_of_bad_files(tmp_path):
    """Findings 1 and 3: ``capcal status`` and ``forget --all`` crashed on a byte that is not UTF-8 and hung on a
    named pipe, closing the documented way out. A symbolic link to /dev/zero (read until memory ran out) and a
    600 MB file (read whole; sparse here) are run under a memory limit."""
    where = tmp_path / "d"
    where.mkdir(mode=0o700)
    (where / "readings").mkdir(mode=0o700)
    (where / "aaaaaaaaaaaaaaaa.json").write_bytes(b'{"capcal_saved_decision": 1, "id": "\xff"}')
    os.mkfifo(where / "bbbbbbbbbbbbbbbb.json", 0o600)
    os.mkfifo(where / "readings" / "bbbbbbbbbbbbbbbb.json", 0o600)
    (where / "cccccccccccccccc.json").symlink_to("/dev/zero")
    (where / "readings" / "cccccccccccccccc.json").symlink_to("/dev/zero")
    with open(where / "dddddddddddddddd.json", "wb") as f:
        f.truncate(600 << 20)  # sparse: 600 MB of zeros that take no disk
    try:
        result = _run_limited(_STATUS_AND_FORGET, {"CAPCAL_DECISIONS_DIR": str(where)}, megabytes=300, seconds=60)
    except subprocess.TimeoutExpired:
        pytest.fail("capcal status hung on the folder")
    finally:
        _unblock(where / "bbbbbbbbbbbbbbbb.json")
        _unblock(where / "readings" / "bbbbbbbbbbbbbbbb.json")
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-2000:]
    listed = result.stdout
    for ident, why in (("aaaaaaaaaaaaaaaa", "not UTF-8"), ("bbbbbbbbbbbbbbbb", "not a regular file"),
                       ("cccccccccccccccc", "symbolic link"), ("dddddddddddddddd", "larger than")):
        assert ident in listed and why in listed.split(ident, 1)[1].splitlines()[0]
    assert sorted(p.name for p in where.iterdir()) == [".lock", "readings"]  # every bad file forgotten


def test_a_file_is_read_to_its_limit_and_no_further(tmp_path):
    """Finding 3: the readings' 8 MiB limit was checked with ``stat`` (0 for /dev/zero) and a decision file had
    none. What is read is counted."""
    from capcal_integrations.prompts.files import DECISION_BYTES, read_untrusted

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(DECISION_BYTES + 1)  # just above the limit, sparse
    with pytest.raises(InputError, match="larger than"):
        read_untrusted(big, DECISION_BYTES)
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with pytest.raises(InputError, match="symbolic link"):
        read_untrusted(tmp_path / "zero.json", DECISION_BYTES)
    with pytest.raises(InputError, match="not a regular file"):  # followed (an option's file): a device is refused
        read_untrusted(tmp_path / "zero.json", DECISION_BYTES, follow=True)


# --------------------------------------------------------------------------- a folder that is the user's


def _plant_reads(where, key):
    """A ``"reads": true`` decision for ``key`` planted in ``where`` (another user's doing)."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{key_id(key)}.json"
    path.write_text(_decision_text(key))
    return path


@pytest.mark.parametrize("how", ["folder 0777", "file 0666", "folder of another uid", "file of another uid"])
def test_a_folder_or_file_others_can_write_is_not_used_and_says_why(how, caplog, tmp_path, monkeypatch):
    """Finding 4: a ``"reads": true`` file planted in a 0777 folder made a non-reader calibrate with nothing on
    stderr. Owner and mode are checked (another uid: as root, the test owns files by uid 65534; else the mode)."""
    if "uid" in how and os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root (the mode cases check the same rule)")
    data = lists(16)
    where = tmp_path / "d"
    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", str(where))
    _, key, _ = _checked_once(data)  # the key, read in a good folder
    for p in where.rglob("*"):
        if p.is_file():
            p.unlink()
    path = _plant_reads(where, key)
    os.chmod(where, 0o700)
    os.chmod(path, 0o600)
    target = where if how.startswith("folder") else path
    if "uid" in how:
        os.chown(target, 65534, 65534)
    else:
        os.chmod(target, 0o777 if how.startswith("folder") else 0o666)
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        hung, out = _rank_within(data)
        _rank_within(data, k=2)  # a second ranking: no second WARNING
    assert not hung and "error" not in out, out.get("error")
    assert out["checks"][0].decision is None and out["ranking"].kept_given_order  # the planted decision: not used
    warned = _warned(caplog, target)
    assert len(warned) == 1 and ("uid 65534" in warned[0] if "uid" in how else "writable by others" in warned[0])
    assert "kept in memory only" in warned[0] if how.startswith("folder") else "is ignored" in warned[0]


def test_the_folder_and_the_parents_it_makes_are_0700_and_files_0600(tmp_path):
    """Finding 4: the folder was created 0755 (the docs say 0700): ``mkdir(parents=True)`` ignores the mode."""
    where = tmp_path / "cache" / "capcal" / "decisions"
    path = Store(where).save(a_decision())
    for folder in (tmp_path / "cache", tmp_path / "cache" / "capcal", where):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_lock_is_not_taken_through_a_symbolic_link(tmp_path, caplog):
    """Finding 4: ``.lock`` followed symbolic links (a link planted there made the writer create or lock any file)."""
    where = tmp_path / "d"
    where.mkdir(mode=0o700)
    elsewhere = tmp_path / "not-the-lock"
    (where / ".lock").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        assert Store(where).save(a_decision()) is None
    assert not elsewhere.exists() and any("cannot save" in r.getMessage() for r in caplog.records)


def test_stale_temporary_files_are_cleaned(tmp_path):
    """Finding 4: SIGKILL left ``.tmp`` files that were never removed. A writer removes those over a minute old."""
    import time

    where = tmp_path / "d"
    store = Store(where)
    store.save(a_decision())
    stale, fresh = where / ".x.json.abc.tmp", where / ".y.json.def.tmp"
    stale.write_text("half")
    fresh.write_text("being written")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    store.save(a_decision(lists=10))
    assert not stale.exists() and fresh.exists()


def test_a_folder_that_cannot_be_written_warns_once_per_process(caplog, monkeypatch):
    """Finding 6: a read-only folder gave one WARNING per query (root writes any folder: the write fails here)."""
    from capcal_integrations.content_check import saved_decisions

    def read_only(path, text):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(saved_decisions, "write_atomically", read_only)
    data = lists(16)
    rr = Served(data).reranker(check_wait=True)
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        for q, p, _ in data[:4]:
            rr.rerank(q, p)
    assert len([r for r in caplog.records if "Read-only" in r.getMessage()]) == 1


# --------------------------------------------------------------------------- decisions kept in memory by their cost


def test_a_decision_from_labels_survives_more_than_16_option_sets():
    """Finding 5: with more than 16 option sets in one process, finished decisions were evicted first: a decision
    from 12 judged queries on an endpoint that reports no weights (nothing on disk) was gone, and the options
    started deciding again."""
    from tests.test_decisions import idle

    data = lists(16)
    served = Served(data, model_path="")  # no weights reported: the decision is kept in memory alone
    rr = served.reranker()
    decision = rr.decide(data[:12])
    assert decision.judged == 12 and not Store().entries()
    for k in range(20):
        rr.with_options(placeholder=f"nothing {k}").rerank(*data[k % 16][:2])
    idle(rr, 60)
    assert len(rr._state.content) <= 16
    assert rr.content_decision() == decision  # still there: never evicted before an undecided check


def test_a_reloaded_decision_warns_once_per_process(caplog):
    """Finding 5: where decisions are on disk they reloaded with their WARNING again (149 of 311 WARNINGs in the
    soak). One WARNING per decision (key and verdict) and process."""
    data = lists(16)
    _, key, _ = _checked_once(data)
    Store().save(a_decision(key=key, reads=False, verdict="does not read"))
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        for k in range(3):  # three endpoint states in one process: each loads the decision
            Served(data).reranker().rerank(*data[k][:2])
    assert len([r for r in caplog.records if "keeps the given order of every list" in r.getMessage()]) == 1


# --------------------------------------------------------------------------- the rest of finding 6


def test_readings_of_a_decided_key_are_neither_kept_nor_listed():
    """Finding 6: a readings file written 3-12 s after another process saved the decision (status listed the key
    twice)."""
    from capcal_integrations.content_check.contrast import Reading

    data = lists(16)
    where, key, ident = _checked_once(data)
    late = (where / "readings" / f"{ident}.json").read_text()  # what a slower process is about to write
    Store().save(a_decision(key=key))  # another process decides: its readings go
    assert Store().progress() == []
    (where / "readings" / f"{ident}.json").write_text(late)  # written after the decision
    assert Store().progress() == []  # not listed
    Store().save_readings(key, [Reading(((0.0, -1.0, -2.0, -3.0),) * 4, None)], ["a" * 64], 1.0)
    assert not (where / "readings" / f"{ident}.json").exists()  # a slower writer drops them instead


def test_query_identities_are_keyed_per_folder(tmp_path, monkeypatch):
    """Finding 6: query hashes were unsalted SHA-256 (8 of 8 DL19 queries matched against the public query list at
    once). The folder keeps them under its own random key; a restart in the same folder still reads no query twice
    (test_decisions.py's resume tests)."""
    import hashlib

    from capcal_integrations.content_check.check import query_identity

    data = lists(16)
    where, key, ident = _checked_once(data)
    [progress] = Store().progress()
    plain = query_identity(data[0][0])
    assert progress.read != (plain,) and progress.read[0] != hashlib.sha256(b"query 0").hexdigest()
    assert progress.read == (Store().keyed(plain),)
    secret = where / ".secret"
    assert secret.stat().st_mode & 0o777 == 0o600
    other = tmp_path / "other"
    monkeypatch.setenv("CAPCAL_DECISIONS_DIR", str(other))
    _checked_once(data)
    assert Store().progress()[0].read != progress.read  # another folder, another key
    assert (other / ".secret").read_text() != secret.read_text()


def test_forget_takes_whole_ids_or_a_unique_prefix(capsys):
    """Finding 6: ``capcal decisions forget 4`` deleted every id starting with 4 without asking."""
    from capcal_integrations.commands.cli import main

    store = Store()
    saved = [a_decision(key=(("model", f"m{k}"), ("weights", "sha256:1"))) for k in range(40)]
    for d in saved:
        store.save(d)
    ids = sorted(key_id(d.key) for d in saved)
    first = ids[0][0]
    sharing = [i for i in ids if i.startswith(first)]
    assert len(sharing) >= 2  # 40 ids over 16 first digits
    assert main(["decisions", "forget", first]) == 1
    err = capsys.readouterr().err
    assert "too short" in err and all(i in err for i in sharing) and len(store.entries()) == 40  # nothing deleted
    assert main(["decisions", "forget", ids[0][:8]]) == 0 and len(store.entries()) == 39
    assert main(["decisions", "forget", ids[1]]) == 0 and len(store.entries()) == 38
    capsys.readouterr()
    assert main(["status"]) == 0
    assert "sha256:1" in capsys.readouterr().out  # status shows the weights


def test_a_query_string_is_redacted_in_the_librarys_log_lines_and_refused_in_base_url():
    """Finding 6: a key in the URL's query string showed in httpx's INFO lines and broke the path."""
    from capcal_integrations import CapCalReranker
    from capcal_integrations.redaction import RedactingFilter

    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, 'HTTP Request: POST %s "HTTP/1.1 200 OK"',
                               ("http://h:8000/v1/completions?k=sk-unnamed-secret",), None)
    RedactingFilter().filter(record)
    assert "sk-unnamed-secret" not in record.getMessage() and "/v1/completions?***" in record.getMessage()
    with pytest.raises(InputError, match="query string") as refused:
        CapCalReranker(base_url="http://h:8000/v1?k=sk-unnamed-secret")
    assert "sk-unnamed-secret" not in str(refused.value)


def test_a_lone_surrogate_in_a_passage_is_the_users_input_error():
    """Finding 6: a lone surrogate in a passage was reported as the endpoint's fault."""
    data = lists(4)
    rr = Served(data).reranker()
    with pytest.raises(InputError, match=r"passages\[1\].*lone surrogate"):
        rr.rerank("fleas", ["a passage", "bytes \udcff decoded with surrogateescape", "another"])


def test_the_adapters_empty_inputs_are_typed_errors():
    """Finding 6: LlamaIndex ``postprocess_nodes`` without a query raised a bare ValueError; LangChain
    ``compress_documents(None, q)`` returned ``[]``."""
    from capcal_integrations import CapCalReranker

    found = 0
    try:
        from llama_index.core.schema import NodeWithScore, TextNode

        import llamaindex_ext

        adapter = llamaindex_ext.CapCalRerank(reranker=CapCalReranker(base_url="http://127.0.0.1:9/v1"), top_n=2)
        with pytest.raises(InputError, match="needs the query"):
            adapter.postprocess_nodes([NodeWithScore(node=TextNode(text="a")), NodeWithScore(node=TextNode(text="b"))])
        found += 1
    except ImportError:
        pass
    try:
        import langchain_ext

        adapter = langchain_ext.CapCalRerank(reranker=CapCalReranker(base_url="http://127.0.0.1:9/v1"), top_n=2)
        with pytest.raises(InputError, match="must be a list of Documents"):
            adapter.compress_documents(None, "fleas")
        assert adapter.compress_documents([], "fleas") == []
        found += 1
    except ImportError:
        pass
    if not found:
        pytest.skip("neither framework is installed")
