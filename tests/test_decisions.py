"""Decisions that last and deciding machinery that cannot wedge (issue 33, items 3 and 4): the store of
saved decisions (capcal_integrations/content_check/saved_decisions.py), the content check's one place where a decision is set,
and the regression tests of the deciding machinery's defects (issue 33, finding 6), each named ``test_defect_...``.

The endpoint is the testbed's simulated llama.cpp server, shown as llama.cpp shows itself (a model path in
``/props``: a weights fingerprint, so its decisions are kept), with 503s on demand."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import threading
import time

import pytest

from capcal_integrations import CapCalReranker, InputError
from capcal_integrations.content_check import check as content_check
from capcal_integrations.content_check.check import ContentCheck, ContentDecision, decision_key
from capcal_integrations.content_check.saved_decisions import Store, key_id
from capcal_integrations.options import Options
from capcal_integrations.testbed import simulated_endpoint
from capcal_integrations.transport.client import http_library
from tests.test_content_check import lists


class Served:
    """The testbed's server with a model path in ``/props`` and, while ``failing``, an HTTP 503 for every
    ``/v1/completions`` request whose prompts are read with the query replaced (the check's query-free readings:
    ``readings_only``) or for every one."""

    def __init__(self, data, s=2.0, seed=0, model_path="/models/simulated.gguf"):
        self.endpoint = simulated_endpoint(data, s=s, seed=seed)
        self.server, self.model_path = self.endpoint.server, model_path
        self.failing, self.failed = False, 0
        http = http_library()

        def handle(request):
            if self.failing and request.url.path == "/v1/completions":
                self.failed += 1
                return http.Response(503, json={"error": {"code": 503, "message": "busy", "type": "unavailable"}})
            response = self.server(request)
            if request.url.path == "/props":
                return http.Response(200, json={**json.loads(response.content), "model_path": self.model_path})
            return response

        async def ahandle(request):
            await request.aread()
            return handle(request)

        self.http_client = http.Client(transport=http.MockTransport(handle))
        self.async_http_client = http.AsyncClient(transport=http.MockTransport(ahandle))

    def reranker(self, sync=True, **options):
        transport = {"http_client": self.http_client} if sync else {}
        return CapCalReranker(base_url="http://testbed.invalid/v1", api_key="testbed", max_retries=0,
                              async_http_client=self.async_http_client, **transport, **options)

    @property
    def prompts(self):
        return self.server.stats.prompts


def decided(rr, data, wait=10.0):
    """Rank ``data`` until ``rr`` has decided (background readings waited for after each list)."""
    for q, p, _ in data:
        rr.rerank(q, p)
        idle(rr, wait)
        if rr.content_decision() is not None:
            return rr.content_decision()
    return None


def idle(rr, seconds=10.0):
    deadline = time.monotonic() + seconds
    while any(c._busy for c in rr._state.content.values()) and time.monotonic() < deadline:
        time.sleep(0.01)


def a_decision(**changes):
    values = dict(reads=True, verdict="reads", p_value=0.004, e_value=250.0, score=0.8, lists=9, alpha=1.25,
                  alpha_first_token=1.0, curve=((1.0, 0.3), (1.25, 0.4)),
                  key=(("model", "m"), ("weights", "sha256:1"), ("template", "t")))
    values.update(changes)
    return ContentDecision(**values)


# --------------------------------------------------------------------------- the store


def test_a_decision_is_saved_per_key_and_read_back_as_data(tmp_path):
    store = Store(tmp_path / "d")
    d = a_decision()
    path = store.save(d, "rule 'query'")
    assert path.name == f"{key_id(d.key)}.json" and (tmp_path / "d").stat().st_mode & 0o777 == 0o700
    assert store.load(d.key) == d and store.load(d.key).saved
    assert store.load(a_decision(key=(("model", "m"), ("weights", "sha256:2"))).key) is None  # another key: none
    [entry] = store.entries()
    assert entry.source == "rule 'query'" and entry.saved_at and entry.decision == d
    assert [p.name for p in (tmp_path / "d").iterdir() if p.name.endswith(".tmp")] == []  # nothing left behind
    assert store.save(a_decision(key=(("model", "gpt"), ("weights", "")))) is None  # a name alone: not kept


@pytest.mark.parametrize("field, value, message", [
    ("reads", "false", "'reads' must be true or false"),
    ("alpha", "0.5", "'alpha' must be a number"),
    ("lists", -5, "'lists' must be an integer >= 0"),
    ("curve", [[1.0]], "'curve'"),
    ("key", {"model": 3}, "'key'"),
])
def test_defect_a_saved_decision_is_type_checked(field, value, message):
    """Finding 6: ``"reads": "false"`` (a string) was read as true, ``"alpha": "0.5"`` ended in an untyped
    ValueError, ``"lists": -5`` was accepted. Every field is checked against its annotation."""
    values = json.loads(a_decision().to_json())
    values[field] = value
    with pytest.raises(InputError, match=message):
        ContentDecision.from_json(json.dumps(values))


def test_a_corrupt_or_foreign_file_is_ignored_with_one_warning(tmp_path, caplog):
    store = Store(tmp_path)
    d = a_decision()
    path = store.save(d)
    for text in ("{ torn", json.dumps({"capcal_saved_decision": 1, "decision": {"reads": "false"}})):
        path.write_text(text)
        with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
            caplog.clear()
            assert store.load(d.key) is None and store.load(d.key) is None
        assert len([r for r in caplog.records if "is ignored" in r.message]) == 1
        store.save(d)  # saving over it: usable again, and warned about afresh if it breaks again
        assert store.load(d.key) == d
    other = a_decision(key=(("model", "other"), ("weights", "sha256:1")))
    path.write_text(store.save(other).read_text())  # another key's decision under this key's name
    assert store.load(d.key) is None


def _save_many(folder, k):
    store = Store(folder)
    for i in range(40):
        store.save(a_decision(lists=i, e_value=float(k)))


def test_processes_saving_at_once_leave_whole_files(tmp_path):
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_save_many, args=(tmp_path, k)) for k in range(4)]
    for w in workers:
        w.start()
    seen = 0
    while any(w.is_alive() for w in workers):  # read while they write: never a torn file
        d = Store(tmp_path).load(a_decision().key)
        seen += d is not None
    for w in workers:
        w.join()
        assert w.exitcode == 0
    assert Store(tmp_path).load(a_decision().key).lists == 39 and seen > 0
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_forget_by_id_prefix_model_or_all(tmp_path):
    store = Store(tmp_path)
    a, b = a_decision(), a_decision(key=(("model", "n"), ("weights", "sha256:1")))
    store.save(a)
    store.save(b)
    [gone] = store.forget(key_id(a.key)[:8])
    assert gone.decision == a and store.load(a.key) is None and store.load(b.key) == b
    with pytest.raises(InputError, match="no saved content decision"):
        store.forget("ffffffffff")
    assert [s.decision for s in store.forget("n")] == [b] and store.entries() == []


# --------------------------------------------------------------------------- restart


def test_defect_a_restart_on_the_same_model_uses_the_saved_decision_with_no_deciding_prompt(caplog):
    """Finding 6: nothing was kept across processes; every restart decided afresh and paid the deciding prompts."""
    data = lists(16)
    first = Served(data)
    decision = decided(first.reranker(check_wait=True), data)
    assert decision is not None and decision.reads
    again = Served(data)  # another process: a new endpoint state, the same model path
    rr = again.reranker()
    ranking = rr.rerank(*data[0][:2])
    assert again.prompts == 2 and ranking.method == "capcal"  # its real and empty prompts: no reading
    assert rr.content_decision() == decision and ", saved)" in ranking.notes[0]
    other = Served(data, model_path="/models/another.gguf")  # other weights under the same name: decided afresh
    assert other.reranker().rerank(*data[0][:2]).kept_given_order


def test_the_decision_option_wins_over_the_store_and_is_kept():
    data = lists(16)
    decision = decided(Served(data).reranker(check_wait=True), data)
    served = Served(data)
    rr = served.reranker(check_wait=True)
    rr.capabilities()
    flipped = json.loads(decision.to_json())
    flipped.update(reads=False, verdict="does not read")
    ranking = rr.with_options(decision=json.dumps(flipped)).rerank(*data[0][:2])
    assert ranking.kept_given_order and "no content signal" in ranking.notes[0]
    assert Served(data).reranker().rerank(*data[1][:2]).method != "capcal"  # the option's decision is kept


# --------------------------------------------------------------------------- readings kept while deciding


def test_a_check_in_progress_goes_on_in_the_next_process_and_reads_no_query_twice(caplog):
    """Issue 34: a script that ranks a few lists and exits started every run at "0 queries read" and never
    decided. Its readings are kept per key until the decision; the next process goes on from there."""
    data = lists(16)
    first = Served(data)
    rr = first.reranker(check_wait=True)
    for q, p, _ in data[:2]:
        assert rr.rerank(q, p).kept_given_order
    [check] = rr._state.content.values()
    assert check.decision is None and check.evidence.queries == 2
    [progress] = Store().progress()
    assert progress.model == dict(check.key)["model"] and progress.id == key_id(check.key)
    assert len(progress.readings) == 2 and progress.key == check.key and progress.readings == tuple(check.readings)

    again = Served(data)  # a restart: a new endpoint state, the same model and options
    rr2 = again.reranker(check_wait=True)
    with caplog.at_level(logging.INFO, logger="capcal_integrations"):
        ranking = rr2.rerank(*data[0][:2])  # a query read by the first process: not read again
    [check2] = rr2._state.content.values()
    assert check2.evidence.queries == 2 and check2.read == check.read
    assert again.prompts == 0 and ranking.kept_given_order and "2 of at most" in ranking.notes[0]
    assert any("goes on from 2 queries read before" in r.message for r in caplog.records)
    decision = decided(rr2, data[2:])
    assert decision is not None and decision.lists == check2.evidence.queries
    assert Store().progress() == [] and Store().load(decision.key) == decision  # decided: the readings are gone


def test_processes_reading_at_once_keep_each_query_once():
    data = lists(16)
    a, b = Served(data).reranker(check_wait=True), Served(data).reranker(check_wait=True)
    a.rerank(*data[0][:2])
    b.rerank(*data[1][:2])  # b looked at the store before a's reading was kept? No: b's first ranking looks now
    b.rerank(*data[2][:2])
    a.rerank(*data[2][:2])  # the same query in both processes
    [progress] = Store().progress()
    assert sorted(progress.read) == sorted({Store().keyed(content_check.query_identity(data[k][0])) for k in range(3)})
    assert len(progress.read) == 3  # each query once, whichever process read it


@pytest.mark.parametrize("text, problem", [
    ("{ torn", "Expecting"),
    (json.dumps({"capcal_check_readings": 2, "key": {"model": "m"}, "readings": [{"query": "x", "slots": []}]}),
     "identity"),
    (json.dumps({"capcal_check_readings": 2, "key": {"model": "m"}, "readings": [
        {"query": "a" * 64, "slots": [["1e999"]]}]}), "finite numbers"),
])
def test_a_corrupt_readings_file_is_ignored_with_one_warning_and_the_check_reads_afresh(text, problem, caplog):
    data = lists(16)
    rr = Served(data).reranker(check_wait=True)
    rr.rerank(*data[0][:2])
    [progress] = Store().progress()
    progress.path.write_text(text)
    again = Served(data)
    with caplog.at_level(logging.WARNING, logger="capcal_integrations"):
        again.reranker(check_wait=True).rerank(*data[0][:2])
    warned = [r.message for r in caplog.records if "is ignored" in r.message]
    assert len(warned) == 1 and problem in warned[0] and "reads afresh" in warned[0]
    assert again.prompts > 0  # the query is read afresh
    [progress] = Store().progress()
    assert not progress.problem and len(progress.readings) == 1  # and saved over the broken file


def test_capcal_status_shows_saved_decisions_and_checks_in_progress(capsys):
    from capcal_integrations.commands.cli import main

    data = lists(16)
    rr = Served(data).reranker(check_wait=True)
    for q, p, _ in data[:3]:
        rr.rerank(q, p)
    Store().save(a_decision(), "rule 'query'")
    assert main(["status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and any(" reads after 9 queries" in line for line in out)
    assert any("deciding: 3 queries read, e = " in line and "check in progress" in line for line in out)
    assert main(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["source"] for r in rows) == ["check in progress", "rule 'query'"]
    [progress] = Store().progress()
    assert main(["decisions", "forget", progress.id[:8]]) == 0 and Store().progress() == []
    assert "forgot" in capsys.readouterr().out and len(Store().entries()) == 1


# --------------------------------------------------------------------------- the deciding machinery


def test_defect_readings_survive_asyncio_run_per_call_on_an_async_only_transport():
    """Finding 6: with asyncio.run per call, the reading task was cancelled when the loop closed (CancelledError
    is no Exception) and the check never decided, saying nothing. Readings now run on the library's own thread
    and loop."""
    data = lists(20)
    served = Served(data)
    rr = served.reranker(sync=False)
    for q, p, _ in data:
        asyncio.run(rr.arerank(q, p))
        idle(rr)
        if rr.content_decision() is not None:
            break
    assert rr.content_decision() is not None and rr.content_decision().reads


def test_defect_the_lists_read_are_remembered_within_a_bound():
    """Finding 6: the "already read" set grew without bound (every list handed over, read or not)."""
    check = ContentCheck(decision_key("m", "w", Options()))
    for k in range(3 * getattr(content_check, "SEEN", 1024)):
        ident = check.want(f"query {k}", [f"p{i}" for i in range(6)])
        assert ident
        # dropped (a closed loop, a full queue): not read, so not remembered (the old release took no identity)
        check.release(ident) if isinstance(ident, str) else check.release()
    seen = check.attempts.seen if hasattr(check, "attempts") else check._seen  # the old check kept it itself
    assert len(seen) == 0


def test_defect_failing_readings_back_off_warn_once_and_decide_when_the_endpoint_recovers(caplog):
    """Finding 6: readings that kept failing made the reranker a permanent pass-through with a warning per list."""
    data = lists(30)
    served = Served(data)
    rr = served.reranker()
    rr.capabilities()
    assert rr.content_decision() is None  # the check is made: its clock is the test's
    clock = [0.0]
    for check in rr._state.content.values():
        check.attempts.clock = lambda: clock[0]
    served.failing = True
    with caplog.at_level(logging.DEBUG, logger="capcal_integrations"):
        for q, p, _ in data[:20]:
            assert rr.rerank(q, p).kept_given_order
            idle(rr)
            clock[0] += 1.0  # a second between lists: the backoff lets a few readings through
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "failed" in r.message]
    assert len(warnings) == 1 and "EndpointError" in warnings[0].message and "503" in warnings[0].message
    assert 3 <= served.failed <= 8  # tried again with backoff (2, 4, 8, 16 s ...), not on every list
    served.failing = False
    clock[0] += 1000.0
    assert decided(rr, data[20:] + data[:20]) is not None  # the lists tried before are read again


def test_defect_check_wait_failures_return_the_given_order_and_the_list_is_read_later():
    """Finding 6: with check_wait=True an endpoint error while reading failed the user's ranking, and the list was
    marked read and never retried."""
    data = lists(16)
    served = Served(data)
    rr = served.reranker(check_wait=True)
    rr.capabilities()
    served.failing = True
    ranking = rr.rerank(*data[0][:2])
    assert ranking.kept_given_order and ranking.order == tuple(range(12)) and ranking.checked == ()
    assert any("reading of this list failed" in n for n in ranking.notes)
    served.failing = False
    check = next(iter(rr._state.content.values()))
    check.attempts.clock = lambda: time.monotonic() + 1000.0  # past the backoff
    assert rr.rerank(*data[0][:2]).checked == (0,)  # the same list, read now


def test_defect_a_late_decision_or_check_lists_takes_effect():
    """Finding 6: with_options(decision=...) or a new check_lists after the first ranking was silently ignored."""
    data = lists(16)
    decision = decided(Served(data).reranker(check_wait=True), data)
    served = Served(data, model_path="/models/simulated.gguf")
    rr = served.reranker(check_wait=True, check_lists=2)
    Store().forget(None)  # no kept decision: the late option alone decides
    rr.rerank(*data[0][:2])
    assert rr.content_decision() is None
    ranking = rr.with_options(decision=decision.to_json()).rerank(*data[1][:2])
    assert ranking.method == "capcal" and rr.content_decision() == decision

    capped = Served(lists(16), s=0.0, model_path="/models/flat.gguf").reranker(check_wait=True, check_lists=2)
    for q, p, _ in data[:2]:
        capped.rerank(q, p)
    assert capped.content_decision().verdict == "undecided" and capped.content_decision().lists == 2
    wider = capped.with_options(check_lists=40)
    note = wider.rerank(*data[2][:2]).notes[0]
    assert "deciding" in note and "3 of at most 40" in note  # read on, with the evidence so far


def test_defect_option_variants_share_one_reading_thread_and_a_bounded_set_of_checks():
    """Finding 6: every distinct option set started its own check and thread: 60 variants, 60 threads."""
    data = lists(12)
    served = Served(data)
    rr = served.reranker()
    rr.capabilities()
    before = threading.active_count()
    peak = 0
    for k in range(60):
        rr.with_options(placeholder=f"nothing {k}").rerank(*data[k % 12][:2])
        peak = max(peak, threading.active_count() - before)
    idle(rr, 30)
    assert peak <= 1 and len(rr._state.content) <= 16


def test_defect_a_check_stopped_at_its_cap_says_undecided(caplog):
    """Finding 6: a check stopped undecided at its cap said "no content signal", even with e = 21.4."""
    d = a_decision(reads=False, verdict="undecided", e_value=21.4, p_value=1 / 21.4, lists=40)
    assert "undecided" in str(d) and "no content signal" not in str(d)
    check = ContentCheck(d.key, d)
    note = check.verdict().note
    assert "undecided" in note and "no content signal" not in note


# --------------------------------------------------------------------------- capcal decisions


def test_capcal_decisions_lists_and_forgets(capsys):
    from capcal_integrations.commands.cli import main

    store = Store()  # the environment's folder (a test's own: tests/conftest.py)
    a, b = a_decision(), a_decision(key=(("model", "n"), ("weights", "sha256:1")), reads=False, verdict="undecided")
    store.save(a, "rule 'query'")
    store.save(b, "option")
    assert main(["decisions"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and any(key_id(a.key) in line and " m " in line and "reads after 9 queries" in line
                                 and "rule 'query'" in line for line in out)
    assert main(["decisions", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["verdict"] for r in rows} == {"reads", "undecided"} and all(r["saved_at"] for r in rows)
    assert main(["decisions", "forget", key_id(b.key)[:8]]) == 0
    assert "forgot" in capsys.readouterr().out and store.load(b.key) is None and store.load(a.key) == a
    assert main(["decisions", "forget", "nothing-like-it"]) == 1
    assert "no saved content decision" in capsys.readouterr().err
    assert main(["decisions", "forget"]) == 1
    assert main(["decisions", "forget", "--all"]) == 0 and store.entries() == []


# --------------------------------------------------------------------------- batch decision files


def _fake_ray(monkeypatch):
    import sys

    from capcal_integrations.commands import batch
    from tests.test_batch import _Ray

    ray = _Ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(batch, "_WORKER", None)  # the actor class is made for this Ray
    return ray


BATCH = {"method": "first-token-capcal", "check_lists": 3}


def test_defect_a_stale_batch_decision_of_another_model_is_replaced(tmp_path, monkeypatch, caplog):
    """Finding 6: a decision file beside the output about another model was never replaced (the run decided afresh
    in every worker, and the next run did again)."""
    from capcal_integrations.commands.batch import decision_path, rerank_batch
    from tests.test_batch import LISTS, FakeServer

    _fake_ray(monkeypatch)
    out = tmp_path / "out.jsonl"
    stale = a_decision(key=(("model", "another"), ("weights", "sha256:9")))
    decision_path(out).write_text(stale.to_json())
    with caplog.at_level(logging.WARNING):
        rerank_batch(LISTS[:5], out, endpoints=[FakeServer(delay=0.0).url], api_key="none", progress=False, **BATCH)
    replaced = ContentDecision.from_json(decision_path(out).read_text())
    assert dict(replaced.key)["model"] == "fake" and replaced.lists == 3
    assert any("decided afresh, and replaced" in r.message for r in caplog.records)


def _hold(path, ready, stop):
    import fcntl
    import os

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    stop.wait(30)


def test_defect_two_batch_runs_on_one_output_the_second_is_refused(tmp_path, monkeypatch):
    """Finding 6: two runs on one output had no lock (both appended, both wrote its decision)."""
    from capcal_integrations.commands.batch import rerank_batch
    from tests.test_batch import LISTS, FakeServer

    _fake_ray(monkeypatch)
    out = tmp_path / "out.jsonl"
    ctx = multiprocessing.get_context("fork")
    ready, stop = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold, args=(str(out) + ".lock", ready, stop))  # the first run, in another process
    other.start()
    try:
        assert ready.wait(10)
        with pytest.raises(InputError, match="another capcal batch run is writing"):
            rerank_batch(LISTS[:2], out, endpoints=[FakeServer(delay=0.0).url], api_key="none", progress=False,
                         guard=None, method="first-token-capcal")
        assert not out.exists()
    finally:
        stop.set()
        other.join()
    assert rerank_batch(LISTS[:2], out, endpoints=[FakeServer(delay=0.0).url], api_key="none", progress=False,
                        guard=None, method="first-token-capcal").ranked == 2  # once it has ended


def _write_under_a_quota(output, text):
    import resource
    import signal

    from capcal_integrations.commands.batch import _saved_decision

    class Actor:
        class decision:  # noqa: N801 - a Ray method handle
            @staticmethod
            def remote():
                return text

    class Ray:
        @staticmethod
        def get(x):
            return x

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
    try:
        _saved_decision(Ray, Actor, output)
    except OSError:
        pass


def test_defect_a_batch_decision_file_is_whole_or_untouched_when_a_write_fails(tmp_path):
    """Finding 6: the decision file was written in place (truncated, then written): a write that fails (a disk
    quota here, a kill) left a torn file, which the next run refused."""
    from capcal_integrations.commands.batch import decision_path

    out = tmp_path / "out.jsonl"
    before = a_decision().to_json()
    decision_path(out).write_text(before)
    bigger = a_decision(curve=tuple((a / 8, 0.1) for a in range(40))).to_json()
    worker = multiprocessing.get_context("fork").Process(target=_write_under_a_quota, args=(out, bigger))
    worker.start()
    worker.join()
    assert decision_path(out).read_text() == before  # the old decision, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_defect_a_repeated_query_is_read_once_whatever_its_passages():
    """Finding 3: the same query asked again with one passage changed was read again (its hash held the passages),
    so a pool of a few queries counted the same evidence many times (pools of 3: 14.2 % false "reads")."""
    check = ContentCheck(decision_key("m", "w", Options()))
    first = check.want("What do fleas eat?", [f"p{i}" for i in range(6)])
    assert first
    check.attempts.read(first)
    check.release(first)
    for query, passages in (("What do fleas eat?", [f"p{i}" for i in range(5)] + ["another"]),
                            ("what do  FLEAS eat", [f"q{i}" for i in range(8)])):
        assert not check.want(query, passages)
    assert check.want("What do ticks eat?", [f"p{i}" for i in range(6)])

