"""Batch reranking on Ray (capcal_integrations/commands/batch.py): resuming, a run killed midway, and a local
Ray cluster with two real servers (a Ray Dataset in).

The killed run is a real ``capcal rerank --input ... --output ... --base-url A,B`` process on a local
Ray, against two copies of the fake endpoint served over loopback HTTP (slowed down, so that it is
killed with lists still in flight), killed with SIGKILL, then run again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest

from capcal_integrations import CapCalReranker, InputError
from capcal_integrations.commands.batch import decision_path, finished, read_rows, rerank_batch
from capcal_integrations.content_check.check import ContentDecision
from tests.fake_endpoint import clients, make_handler

ROOT = Path(__file__).resolve().parent.parent
LISTS = [{"query": f"query {k}", "passages": [f"passage {k}.{i}" for i in range(4)]} for k in range(12)]
# no content check, so that every list's ranking is comparable with a direct run's (the check's own test is below)
METHOD = {"method": "first-token-capcal", "guard": None}


def write_input(path: Path, rows=LISTS) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- without Ray


def test_a_plain_import_loads_neither_ray_nor_the_batch_module():
    code = ("import capcal_integrations, sys; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray' or m == 'capcal_integrations.commands.batch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def _output_of(rows: list[dict], path: Path) -> Path:
    """An output that holds ``rows`` ranked (each in input order), as a run writes it."""
    from capcal_integrations.commands.batchfile import identities, record
    from capcal_integrations.types import Ranking

    lines_ = []
    for k, (row, key) in enumerate(zip(rows, identities(rows))):
        row = {"line": k, **row, **({"copy": key[2]} if key[0] == "list" and key[2] else {})}
        n = len(row["passages"])
        lines_.append(json.dumps(record(row, Ranking(tuple(range(n)), tuple([0.0] * n), "vanilla"))) + "\n")
    path.write_text("".join(lines_))
    return path


def test_finished_cuts_a_torn_last_line_and_reads_the_rest(tmp_path):
    from capcal_integrations.commands.batchfile import list_hash

    out = tmp_path / "out.jsonl"
    h0, h1 = list_hash(LISTS[0]), list_hash(LISTS[1])
    out.write_text(json.dumps({"line": 0, "list_hash": h0}) + "\n" + json.dumps({"qid": "q7", "list_hash": h1})
                   + '\n{"line": 2, "ord')
    assert finished(out) == {("list", h0, 0): h0, ("qid", "q7"): h1}
    assert out.read_text().endswith(f'"list_hash": "{h1}"}}\n')  # the next line starts clean
    out.write_text('{"line": 0}\nnot json\n')  # an older version's line (resumed by line number): refused
    with pytest.raises(InputError, match="not a line this batch wrote"):
        finished(out)


def test_rows_are_checked_and_keyed_before_anything_runs(tmp_path):
    rows = read_rows(write_input(tmp_path / "in.jsonl", [{"query": "a", "candidates": ["x"]}, {"query": "b", "passages": []}]))
    assert [(r["line"], r["passages"]) for r in rows] == [(0, ["x"]), (1, [])]
    with pytest.raises(InputError, match="share a qid"):
        rerank_batch([{"qid": 1, **LISTS[0]}, {"qid": 1, **LISTS[1]}], tmp_path / "o.jsonl", endpoints=["http://x/v1"])
    with pytest.raises(InputError, match="needs 'query'"):
        rerank_batch([{"question": "a"}], tmp_path / "o.jsonl", endpoints=["http://x/v1"])
    with pytest.raises(InputError, match="unknown option"):
        rerank_batch(LISTS, tmp_path / "o.jsonl", endpoints=["http://x/v1"], methd="vanilla")


def test_a_finished_output_is_left_alone(tmp_path):
    out = _output_of(LISTS, tmp_path / "out.jsonl")
    before = out.read_text()
    result = rerank_batch(write_input(tmp_path / "in.jsonl"), out, endpoints=["http://127.0.0.1:9/v1"])
    assert (result.ranked, result.skipped) == (0, len(LISTS)) and out.read_text() == before


def test_resume_is_keyed_by_list_identity_not_by_line_number(tmp_path):
    from capcal_integrations.commands.batchfile import pending, read_rows

    out = _output_of(LISTS[:5], tmp_path / "out.jsonl")
    inserted = [{"query": "a new first list", "passages": ["p", "q"]}, *LISTS]  # every line number moves by one
    todo = pending(read_rows(write_input(tmp_path / "in.jsonl", inserted)), finished(out))
    assert [r["query"] for r in todo] == ["a new first list", *(r["query"] for r in LISTS[5:])]
    twins = [LISTS[0], LISTS[0], LISTS[1]]  # identical lists without a qid: told apart by their order among themselves
    out = _output_of(twins[:1], tmp_path / "twins.jsonl")
    assert [r["query"] for r in pending(twins, finished(out))] == [LISTS[0]["query"], LISTS[1]["query"]]


@pytest.mark.parametrize("edit", ["passage", "deleted", "qid"])
def test_an_input_that_changed_under_its_output_is_refused(tmp_path, edit):
    named = [{"qid": f"q{k}", **row} for k, row in enumerate(LISTS)]
    rows = named if edit == "qid" else LISTS
    out = _output_of(rows[:5], tmp_path / "out.jsonl")
    edited = [dict(r) for r in rows]
    if edit == "deleted":
        del edited[2]
    else:
        edited[2]["passages"] = [*edited[2]["passages"][:-1], "an edited passage"]
    before = out.read_text()
    with pytest.raises(InputError, match="the input changed since the output was written"):
        rerank_batch(write_input(tmp_path / "in.jsonl", edited), out, endpoints=["http://127.0.0.1:9/v1"])
    assert out.read_text() == before


class _Ray:
    """A stand-in for Ray (one process, actors called in place) that records every actor's constructor
    arguments: what Ray would keep in its task metadata."""

    class exceptions:  # noqa: N801 - Ray's namespace
        RayTaskError = RuntimeError

    def __init__(self) -> None:
        self.actor_args: list[tuple] = []

    def is_initialized(self) -> bool:
        return True

    def remote(self, **_):
        ray = self

        def wrap(cls):
            class Actor:
                @staticmethod
                def remote(*args):
                    ray.actor_args.append(args)
                    instance = cls(*args)
                    handle = type("Handle", (), {})()
                    for name in ("rank", "decision", "use_decision", "applies"):
                        method = getattr(instance, name, None)
                        if method is None:
                            continue
                        setattr(handle, name, type("M", (), {"remote": staticmethod(ray._call(method))})())
                    return handle
            return Actor
        return wrap

    @staticmethod
    def _call(method):
        import asyncio
        import inspect

        def call(*args):
            result = method(*args)
            return asyncio.run(result) if inspect.iscoroutine(result) else result
        return call

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return [self.get(r) for r in ref] if isinstance(ref, list) else ref

    def kill(self, actor):
        pass

    def cancel(self, ref, force=False):
        pass


def test_the_api_key_is_no_actor_argument_and_reaches_the_endpoint(tmp_path, monkeypatch):
    from capcal_integrations.commands import batch

    server = FakeServer(delay=0.0)
    ray = _Ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(batch, "_WORKER", None)  # the actor class is made for this Ray
    secret = "sk-batch-secret-never-in-ray-metadata"
    result = rerank_batch(LISTS[:2], tmp_path / "out.jsonl", endpoints=[server.url], api_key=secret, progress=False,
                          **METHOD)
    assert result.ranked == 2 and ray.actor_args
    assert secret not in repr(ray.actor_args), ray.actor_args
    assert server.authorizations and set(server.authorizations) == {f"Bearer {secret}"}
    [(_, _, key_file)] = ray.actor_args
    assert not os.path.exists(key_file)  # deleted when the run ended


def test_the_cli_batch_needs_input_and_output_files(tmp_path, capsys):
    from capcal_integrations.commands.cli import main

    assert main(["rerank", "--input", str(write_input(tmp_path / "in.jsonl")), "--base-url", "http://a/v1,http://b/v1"]) == 1
    assert "needs --input FILE, --output FILE" in capsys.readouterr().err
    assert main(["rerank", "--query", "q", "--passages", "p.txt", "--workers", "2", "--base-url", "http://a/v1"]) == 1


# --------------------------------------------------------------------------- a real Ray


class FakeServer(ThreadingHTTPServer):
    """The fake endpoint over loopback HTTP, each completion answered after ``delay`` seconds."""

    daemon_threads = True

    def __init__(self, delay: float) -> None:
        self.handler, self.delay, self.authorizations = make_handler(slots=4), delay, []
        super().__init__(("127.0.0.1", 0), _Serve)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Serve(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.authorizations.append(self.headers.get("Authorization"))
        if self.path.endswith("/completions"):
            time.sleep(self.server.delay)
        answer = self.server.handler(httpx2.Request(self.command, f"http://fake.test{self.path}", content=body))
        data = answer.content
        self.send_response(answer.status_code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _batch_command(tmp_path: Path, urls: list[str]) -> list[str]:
    return [sys.executable, "-m", "capcal_integrations.commands.cli", "rerank", "--input", str(tmp_path / "in.jsonl"),
            "--output", str(tmp_path / "out.jsonl"), "--base-url", ",".join(urls), "--api-key", "none",
            "--method", "first-token-capcal", "--guard", "none"]


def _run(command: list[str]) -> subprocess.Popen:
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """What the killed run left (Ray's local processes share its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_run_killed_midway_resumes_without_redoing_duplicating_or_losing_a_list(tmp_path):
    pytest.importorskip("ray")
    write_input(tmp_path / "in.jsonl")
    servers = [FakeServer(delay=0.4), FakeServer(delay=0.4)]
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    first = _run(_batch_command(tmp_path, [s.url for s in servers]))
    try:
        while not (out.exists() and len(out.read_text().splitlines()) >= 3):
            assert first.poll() is None, first.stdout.read().decode()[-3000:]
            assert time.monotonic() - started < 240, "no results after 240 s"
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)  # midway: other lists are in flight
        first.wait(30)
    finally:
        _stop_group(first)
    kept = lines(out)
    assert 3 <= len(kept) < len(LISTS)
    with open(out, "a") as f:
        f.write('{"query": "query 11", "method": "first-tok')  # what a kill in mid-write leaves
    second = _run(_batch_command(tmp_path, [s.url for s in servers]))
    try:
        log = second.communicate(timeout=300)[0].decode()
    finally:
        _stop_group(second)
    assert second.returncode == 0, log[-3000:]
    assert f"{len(LISTS) - len(kept)} lists ranked, {len(kept)} already in" in log
    done = lines(out)
    assert done[:len(kept)] == kept  # the first run's lines are kept as they were, not redone
    assert sorted(r["line"] for r in done) == list(range(len(LISTS)))  # each list exactly once
    sync, async_ = clients(make_handler(slots=4))
    direct = CapCalReranker(client=sync, async_client=async_, **METHOD)
    for row in done:
        want = direct.rerank(LISTS[row["line"]]["query"], LISTS[row["line"]]["passages"])
        assert row["order"] == list(want.order) and row["query"] == LISTS[row["line"]]["query"]
    sys.stderr.write(f"killed run + resumed run: {time.monotonic() - started:.1f} s\n")  # shown with -s


@pytest.fixture
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_batch_on_a_local_ray_with_two_servers(local_ray, server_url, hosted_server, tmp_path):
    from tests._compare import TIE
    from tests._samples import PASSAGES, QUERY

    rows = [{"qid": "flea", "query": QUERY, "passages": PASSAGES[:4]},
            {"qid": "cats", "query": "what do cats eat", "passages": [
                "Paris is the capital of France.", "Cats are obligate carnivores and eat meat.",
                "The violin has four strings.", "Rain is water falling from clouds."]}]
    endpoints, method = [server_url, hosted_server], METHOD  # one list per worker, two prompts each
    unnamed = local_ray.data.from_items([{k: v for k, v in r.items() if k != "qid"} for r in rows])
    with pytest.raises(InputError, match="needs a 'qid'"):
        rerank_batch(unnamed, tmp_path / "out.jsonl", endpoints=endpoints)
    started = time.monotonic()
    result = rerank_batch(local_ray.data.from_items(rows), tmp_path / "out.jsonl", endpoints=endpoints, api_key="none",
                          **method)
    took = time.monotonic() - started
    assert (result.ranked, result.skipped) == (2, 0)
    done = {r["qid"]: r for r in lines(tmp_path / "out.jsonl")}
    assert sorted(done) == ["cats", "flea"]
    for k, row in enumerate(rows):  # worker k ranked row k on endpoint k: the same as a direct run there
        direct = CapCalReranker(base_url=endpoints[k], api_key="none", **method).rerank(row["query"], row["passages"])
        got = {r["index"]: r["score"] for r in done[row["qid"]]["ranked"]}
        assert sorted(got) == list(range(4))
        assert all(abs(got[i] - direct.scores[i]) <= TIE for i in range(4)), (got, direct.scores)
    assert done["flea"]["order"][0] == 1  # the one relevant passage
    again = rerank_batch(rows, tmp_path / "out.jsonl", endpoints=endpoints, api_key="none", **method)  # as a list
    assert (again.ranked, again.skipped) == (0, 2) and len(lines(tmp_path / "out.jsonl")) == 2
    sys.stderr.write(f"2 lists on a local Ray, two servers: {took:.1f} s\n")  # shown with -s


def test_the_content_check_is_decided_once_for_the_whole_run_and_saved_for_the_next(local_ray, tmp_path):
    servers = [FakeServer(delay=0.0), FakeServer(delay=0.0)]
    out, urls = tmp_path / "out.jsonl", [s.url for s in servers]

    def checked(rows: list[dict]) -> tuple[int, list[str]]:
        notes = [n for r in rows for n in r.get("notes", []) if "content check" in n]
        return sum("content check deciding" in n for n in notes), [n for n in notes if "content check (6 queries" in n]

    options = {"method": "first-token-capcal", "check_lists": 6}  # at most 6 queries decide: "undecided" at the cap
    result = rerank_batch(LISTS, out, endpoints=urls, api_key="none", progress=False, **options)
    assert result.ranked == len(LISTS) and sorted(r["line"] for r in lines(out)) == list(range(len(LISTS)))
    decision = ContentDecision.from_json(decision_path(out).read_text())
    pending, final = checked(lines(out))
    # the first 6 lists decided it on one worker (each read inside the ranking: a batch waits for the readings;
    # the last to finish says the decision); every later list, on either worker, was ranked by that decision
    assert decision.lists == 6 and pending == 5 and len(final) == len(LISTS) - 5
    assert all(f"e = {decision.e_value:.3g}" in n for n in final), final
    more = [{"query": f"query {k}", "passages": [f"passage {k}.{i}" for i in range(4)]} for k in range(12, 15)]
    again = rerank_batch(LISTS + more, out, endpoints=urls, api_key="none", progress=False, **options)
    assert (again.ranked, again.skipped) == (3, len(LISTS))
    pending, final = checked(lines(out)[len(LISTS):])  # the resumed run decided nothing again: the saved decision
    assert pending == 0 and len(final) == 3 and all("saved" in n for n in final), final

