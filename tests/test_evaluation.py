"""Tests of capcal_integrations.evaluation: pure measures with hand-worked numbers, spec parsing,
metrics cross-checked against published BM25 figures, the resumable store and runner, and one
small end-to-end ``capcal eval`` against the real local model server."""

from __future__ import annotations

import asyncio
import json
import math
import pathlib

import pytest

from capcal_integrations.errors import InputError
from capcal_integrations.evaluation import analysis, main
from capcal_integrations.evaluation.bias import (
    expected_kl_uniform,
    kendall_tau,
    kl_from_uniform,
    mean_pairwise_tau,
    needle_list,
    pick_needle,
    position_histogram,
    shuffle_of,
)
from capcal_integrations.evaluation.data import load_dataset, read_run, run_of, write_run
from capcal_integrations.evaluation.metrics import paired_test, per_query, sign_flip_p
from capcal_integrations.evaluation.runner import Runner, needle_jobs, rank_jobs, shuffle_jobs
from capcal_integrations.evaluation.specs import parse_spec, parse_specs
from capcal_integrations.evaluation.store import Store, record_key

TINY = pathlib.Path(__file__).parent / "fixtures" / "tiny-dl"
SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


# --------------------------------------------------------------------------- specs

@pytest.mark.parametrize(("text", "method", "options", "key"), [
    ("bm25", "bm25", {}, "bm25"),
    ("capcal", "capcal", {}, "capcal"),
    ("capcal:alpha=1", "capcal", {"alpha": 1.0}, "capcal:alpha=1.0"),
    ("capcal:probability=trie,alpha=1.0", "capcal", {"probability": "trie", "alpha": 1.0},
     "capcal:alpha=1.0,probability=trie"),
    ("capcal:alpha=adaptive", "capcal", {"alpha": "adaptive"}, "capcal:alpha=adaptive"),
    ("capcal:calibration=log,alpha=0.5", "capcal", {"calibration": "log", "alpha": 0.5},
     "capcal:alpha=0.5,calibration=log"),
    ("capcal:placeholder=", "capcal", {"placeholder": ""}, "capcal:placeholder="),
    ("psc:m=5", "psc", {"m": 5}, "psc:m=5"),
    ("first-token:capcal", "first-token-capcal", {}, "first-token-capcal"),
    ("first-token-capcal", "first-token-capcal", {}, "first-token-capcal"),
    ("first-token:capcal,alpha=1", "first-token-capcal", {"alpha": 1.0}, "first-token-capcal:alpha=1.0"),
    ("vanilla:template=rank_gpt,labels=alpha", "vanilla", {"template": "rank_gpt", "labels": "alpha"},
     "vanilla:labels=alpha,template=rank_gpt"),
])
def test_parse_spec(text, method, options, key):
    spec = parse_spec(text)
    assert (spec.method, dict(spec.options), spec.key, spec.label) == (method, options, key, text)


@pytest.mark.parametrize("bad", ["nope", "capcal:beta=1", "capcal:alpha=high", "psc:m=five", "bm25:alpha=1",
                                 "capcal:alpha", "capcal:alpha=1,alpha=2"])
def test_parse_spec_rejects(bad):
    with pytest.raises(InputError):
        parse_spec(bad)


def test_parse_specs_splits_on_method_names_only():
    specs = parse_specs("bm25,vanilla,capcal,capcal:alpha=1.0,first-token,first-token:capcal,psc:m=5,"
                        "capcal:calibration=log,alpha=1.0,capcal:placeholder=")
    assert [s.key for s in specs] == ["bm25", "vanilla", "capcal", "capcal:alpha=1.0", "first-token",
                                      "first-token-capcal", "psc:m=5", "capcal:alpha=1.0,calibration=log",
                                      "capcal:placeholder="]
    assert specs[0].uses_model is False and specs[2].calibrated and not specs[1].calibrated
    with pytest.raises(InputError, match="twice"):
        parse_specs("capcal:alpha=1,capcal:alpha=1.0")
    with pytest.raises(InputError, match="start with a method"):
        parse_specs("alpha=1,capcal")


# --------------------------------------------------------------------------- bias measures

def test_position_histogram_and_kl_by_hand():
    assert position_histogram([1, 3, 3, 4], 4) == [1, 0, 2, 1]
    with pytest.raises(ValueError):
        position_histogram([5], 4)
    assert kl_from_uniform([2, 2, 2, 2]) == 0.0
    assert kl_from_uniform([8, 0, 0, 0]) == pytest.approx(math.log(4))
    # P = (.5, .25, .25, 0) over 4 slots: .5 log 2 + .25 log 1 + .25 log 1 = .3466
    assert kl_from_uniform([2, 1, 1, 0]) == pytest.approx(0.5 * math.log(2))
    # noise floor of 50 draws over 20 slots is near (n - 1) / (2 N) = 0.19
    assert expected_kl_uniform(50, 20, draws=500) == pytest.approx(0.19, abs=0.03)


def test_kendall_tau_by_hand():
    assert kendall_tau(["a", "b", "c", "d"], ["a", "b", "c", "d"]) == 1.0
    assert kendall_tau(["a", "b", "c", "d"], ["d", "c", "b", "a"]) == -1.0
    # b,a,d,c vs a,b,c,d: 2 discordant pairs (a-b, c-d) of 6 -> (4 - 2) / 6
    assert kendall_tau(["b", "a", "d", "c"], ["a", "b", "c", "d"]) == pytest.approx(1 / 3)
    # c,a,b vs a,b,c: discordant a-c, b-c -> (1 - 2) / 3
    assert kendall_tau(["c", "a", "b"], ["a", "b", "c"]) == pytest.approx(-1 / 3)
    with pytest.raises(ValueError):
        kendall_tau(["a", "b"], ["a", "c"])
    # three shuffles: taus 1/3 (x,y), -1/3 (x,z), ... worked: x=abc, y=acb (1 disc.), z=cab (2 disc. vs x)
    # y vs z: y=a,c,b  z=c,a,b -> pair a-c discordant only -> 1/3
    assert mean_pairwise_tau(["abc", "acb", "cab"]) == pytest.approx((1 / 3 - 1 / 3 + 1 / 3) / 3)


def test_shuffles_are_fixed_per_key():
    assert shuffle_of(20, "q1/0") == shuffle_of(20, "q1/0")
    assert shuffle_of(20, "q1/0") != shuffle_of(20, "q1/1")
    assert sorted(shuffle_of(20, "q1/3")) == list(range(20))


def test_needle_pick_and_placement():
    cands = ["d1", "d2", "d3", "d4", "d5", "d6"]
    grades = {"d1": 1, "d2": 0, "d3": 2, "d4": 3, "d5": 0, "d6": 0}
    assert pick_needle(cands, grades, 4) == ("d4", ["d2", "d5", "d6"])  # grade 3 beats the earlier grade 2
    assert pick_needle(cands, grades, 5) is None  # only three judged non-relevant
    assert pick_needle(cands, {"d1": 1}, 2) is None  # nothing of grade >= 2
    assert pick_needle(cands, {"d1": 1, "d2": 0}, 2, min_grade=1) == ("d1", ["d2"])
    assert [needle_list("N", ["a", "b"], p) for p in (1, 2, 3)] == [["N", "a", "b"], ["a", "N", "b"], ["a", "b", "N"]]


# --------------------------------------------------------------------------- aggregation and offline sweeps

def _store(tmp_path, records):
    store = Store(tmp_path / "records.jsonl")
    for r in records:
        store.add(r)
    return store


def test_borda_of_shuffles_uses_doc_ids_not_slots(tmp_path):
    # three shuffles of {x, y, z}; rankings by doc id: x>y>z, y>x>z, y>z>x -> points x 3, y 5, z 1
    recs = [{"kind": "shuffle", "method": "vanilla", "qid": "q", "variant": str(i), "input": inp, "order": order}
            for i, (inp, order) in enumerate([(["z", "x", "y"], ["x", "y", "z"]), (["y", "z", "x"], ["y", "x", "z"]),
                                              (["x", "y", "z"], ["y", "z", "x"])])]
    [agg] = analysis.borda_of_shuffles(_store(tmp_path, recs), "vanilla")
    assert agg == {"qid": "q", "order": ["y", "x", "z"], "m": 3}


def test_bias_summary_from_records(tmp_path):
    recs = [{"kind": "shuffle", "method": "m", "qid": q, "variant": str(i), "input": inp, "order": order}
            for q, i, inp, order in [("q1", 0, ["a", "b"], ["a", "b"]), ("q1", 1, ["b", "a"], ["b", "a"]),
                                     ("q2", 0, ["c", "d"], ["c", "d"]), ("q2", 1, ["d", "c"], ["c", "d"])]]
    b = analysis.bias(_store(tmp_path, recs), "m", 2)
    # top-1 slots: 1, 1, 1, 2 -> histogram [3, 1]; q1 taus: a>b vs b>a = -1; q2: c>d twice = 1 -> mean 0
    assert (b.lists, b.queries, b.histogram, b.tau) == (4, 2, [3, 1], 0.0)
    assert b.tau_input == 0.5  # outputs copy their input in 3 lists (tau 1), reverse it in one (tau -1)
    assert b.kl == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))


def test_first_token_sweep_reranks_stored_steps(tmp_path):
    rec = {"kind": "rank", "method": "first-token-capcal", "qid": "q", "variant": "", "input": ["a", "b", "c"],
           "order": ["b", "c", "a"],
           "first_step": {"candidates": [0, 1, 2], "p": [0.5, 0.3, 0.2], "q": [0.6, 0.2, 0.2], "s": [0, 0, 0]}}
    sweep = analysis.first_token_sweep(_store(tmp_path, [rec]), "first-token-capcal", [0.0, 1.0])
    assert sweep[0.0][0]["order"] == ["a", "b", "c"]  # raw p
    assert sweep[1.0][0]["order"] == ["b", "c", "a"]  # p - (q - 1/3) = .233, .433, .333


def test_shuffled_quality_averages_shuffles_then_queries(tmp_path):
    # query 1115776: its one grade-3 passage (8106321) at rank 1 in shuffle 0 (nDCG 1) and rank 2 in
    # shuffle 1 (1 / log2 3); query 1106007: 1334335 (grade 3) first in its only shuffle (1.0)
    ds = load_dataset(TINY)
    others = ["8106323", "4314171", "5605159", "600966"]
    recs = [{"kind": "shuffle", "method": "m", "qid": "1115776", "variant": "0", "input": ["8106321", *others],
             "order": ["8106321", *others]},
            {"kind": "shuffle", "method": "m", "qid": "1115776", "variant": "1", "input": [*others, "8106321"],
             "order": [others[0], "8106321", *others[1:]]},
            {"kind": "shuffle", "method": "m", "qid": "1106007", "variant": "0",
             "input": ["2143418", "1334335", "1530299", "5836920", "7726655"],
             "order": ["1334335", "2143418", "1530299", "5836920", "7726655"]}]
    value, queries = analysis.shuffled_quality(ds, _store(tmp_path, recs), "m")
    assert queries == 2
    assert value == pytest.approx(((1 + 1 / math.log2(3)) / 2 + 1.0) / 2)
    # the inputs themselves: 8106321 first in shuffle 0 (1), last of 5 in shuffle 1 (1 / log2 6); 1334335 second
    value, _ = analysis.shuffled_quality(ds, _store(tmp_path, recs), "m", input_order=True)
    assert value == pytest.approx(((1 + 1 / math.log2(6)) / 2 + 1 / math.log2(3)) / 2)


def test_slot_profile_consistency_removes_a_multiplicative_slot_bias(tmp_path):
    # p = content (a 3, b 2, c 1) x slot weight (4, 1, 1); a Latin square of shuffles puts every passage in
    # every slot once, so the mean log p by slot is the slot weight plus a constant and dividing it out
    # leaves the content: a > b > c in all three lists, although raw p puts whoever is in slot 1 first
    content, slot = {"a": 3.0, "b": 2.0, "c": 1.0}, [4.0, 1.0, 1.0]
    recs = []
    for i, inp in enumerate([["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]):
        w = [content[d] * slot[k] for k, d in enumerate(inp)]
        recs.append({"kind": "shuffle", "method": "first-token", "qid": "q", "variant": str(i), "input": inp,
                     "order": inp, "first_step": {"candidates": [0, 1, 2], "p": [x / sum(w) for x in w], "q": None}})
    assert analysis.slot_profile_consistency(_store(tmp_path, recs), "first-token") == (1.0, 1)


# --------------------------------------------------------------------------- metrics and significance

def test_metrics_on_the_fixture_by_hand():
    ds = load_dataset(TINY)
    assert [t.qid for t in ds.topics] == ["1115776", "1106007", "1129237"] and ds.rel_threshold == 2
    grades = ds.grades()["1115776"]
    bm25 = [c.docid for c in ds.topics[0].candidates]
    assert [grades[d] for d in bm25] == [0, 3, 0, 0, 0]
    values = per_query(ds.qrels, run_of("1115776", bm25), ["1115776"], ds.rel_threshold)
    # one grade-3 passage at rank 2: DCG = (2^3 - 1) / log2(3), ideal = 7 / log2(2)
    assert values["nDCG@10"]["1115776"] == pytest.approx(1 / math.log2(3))
    assert values["MRR@10"]["1115776"] == 0.5 and values["R@20"]["1115776"] == 1.0


@pytest.mark.parametrize(("name", "published"), [("trec-dl19-passage", 0.5058), ("trec-dl20-passage", 0.4796)])
def test_bm25_matches_the_published_ndcg(name, published):
    if not (SHARED / name).is_dir():
        pytest.skip(f"shared data {SHARED / name} not present")
    ds = load_dataset(SHARED / name)
    run = [d for t in ds.topics for d in run_of(t.qid, [c.docid for c in t.candidates])]
    judged = sorted({q.query_id for q in ds.qrels})
    values = per_query(ds.qrels, run, judged)["nDCG@10"]
    assert sum(values.values()) / len(values) == pytest.approx(published, abs=5e-5)


def test_significance_by_hand():
    # diffs 1, 2, 3: of 8 sign flips only +++ and --- reach |sum| 6
    assert sign_flip_p([1.0, 2.0, 3.0]) == 0.25
    assert sign_flip_p([0.5] * 20, samples=2000) < 0.001  # Monte Carlo path, all-positive differences
    t = paired_test({"a": 2.0, "b": 3.0, "c": 4.0}, {"a": 1.0, "b": 1.0, "c": 1.0})
    # t = mean 2 / (sd 1 / sqrt 3) = 3.464 with 2 df -> two-sided p = 0.0742
    assert (t.n, t.diff, t.wins, t.ties, t.losses) == (3, 2.0, 3, 0, 0)
    assert t.t_p == pytest.approx(0.0742, abs=1e-4) and t.perm_p == 0.25
    assert paired_test({"a": 1.0}, {"a": 1.0}).t_p == 1.0


def test_run_files_round_trip(tmp_path):
    run = run_of("q", ["b", "a"], ["c", "a"])
    assert [d.doc_id for d in run] == ["b", "a", "c"]
    write_run(tmp_path / "r.txt", run, "my run")
    assert (tmp_path / "r.txt").read_text().splitlines()[0] == "q Q0 b 1 3 my_run"
    assert read_run(tmp_path / "r.txt") == run


# --------------------------------------------------------------------------- store and runner (no model)

def test_store_resumes_and_skips_a_torn_line(tmp_path):
    store = _store(tmp_path, [{"kind": "rank", "method": "bm25", "qid": "q1", "order": []}])
    with open(store.path, "a") as f:
        f.write('{"kind": "rank", "meth')  # killed mid-write
    again = Store(store.path)
    assert record_key("rank", "bm25", "q1") in again and len(again) == 1


def test_runner_plans_and_resumes_bm25(tmp_path):
    ds = load_dataset(TINY)
    specs = parse_specs("bm25")
    store = Store(tmp_path / "records.jsonl")
    groups = (rank_jobs(ds.topics, specs, 5) + shuffle_jobs(ds.topics[:2], specs, 5, 3)
              + needle_jobs(ds, ds.topics, specs, 5, 2))
    assert sum(len(j) for _, j in groups) == 3 + 2 * 3 + 2 * 5
    first = asyncio.run(Runner(store, None, progress=False).run(groups))
    assert (first.done, first.cached, first.failed) == (19, 0, [])
    again = asyncio.run(Runner(Store(store.path), None, progress=False).run(groups))
    assert (again.done, again.cached) == (0, 19)
    shuffled = [r for r in store.select("shuffle") if r["qid"] == "1115776"]
    assert len({tuple(r["input"]) for r in shuffled}) == 3  # three different orders...
    assert {tuple(r["order"]) for r in shuffled} == {tuple(c.docid for c in ds.topics[0].candidates)}  # ...one ranking
    needles = analysis.needle_ranks(store, "bm25")
    assert set(needles) == {"1115776", "1106007"}  # 1129237 has only three judged non-relevant
    assert needles["1115776"] == dict.fromkeys(range(1, 6), 2)  # bm25 puts the needle where BM25 had it


def test_eval_command_bm25_only_writes_runs_and_report(tmp_path):
    out = tmp_path / "out"
    assert main(["--data", str(TINY), "--out", str(out), "--methods", "bm25", "--no-progress"]) == 0
    report = (out / "report.md").read_text()
    assert "| `bm25` | 3 |" in report
    assert len(read_run(out / "runs" / "bm25.txt")) == 15
    assert main(["--data", str(TINY), "--out", str(out), "--methods", "capcal:beta=2"]) == 2


# --------------------------------------------------------------------------- which model, and resuming

def _model_records(out, model, methods=("vanilla",)):
    """records.jsonl in ``out`` as a finished run of ``methods`` on the tiny fixture (top 5) by ``model``."""
    store = Store(out / "records.jsonl")
    for _, jobs in rank_jobs(load_dataset(TINY).topics, parse_specs(",".join(methods)), 5):
        for job in jobs:
            store.add({"kind": "rank", "method": job.spec.key, "label": job.spec.label, "qid": job.topic.qid,
                       "variant": "", "input": list(job.docids), "order": list(job.docids), "model": model,
                       "usage": {"requests": 1, "prompt_tokens": 10, "completion_tokens": 1, "cached_tokens": 0},
                       "seconds": 1.0})
    return store


@pytest.fixture
def no_server(monkeypatch):
    """Fail the test if the command asks for an endpoint (it would start a server)."""
    import capcal_integrations.server as server

    monkeypatch.delenv("CAPCAL_BASE_URL", raising=False)
    monkeypatch.setattr(server, "endpoint", lambda *a, **k: pytest.fail("an endpoint was opened"))


@pytest.mark.parametrize(("recorded", "in_meta"), [("0.5b", True), ("0.5b", False), ("local", False)])
def test_eval_refuses_to_resume_a_folder_of_another_embedded_model(tmp_path, capsys, no_server, recorded, in_meta):
    out = tmp_path / "out"
    out.mkdir()
    _model_records(out, recorded)  # "local": records written before they named their model
    if in_meta:
        (out / "meta.json").write_text(json.dumps({"model_id": recorded, "command": "capcal eval ..."}))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    status = main(["--data", str(TINY), "--out", str(out), "--top", "5", "--methods", "bm25,vanilla",
                   "--model", "1.5b", "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert f"holds results of model {recorded!r}, not '1.5b'" in err and "--out" in err and "--fresh" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing written, no report


def test_eval_resumes_a_folder_of_the_same_model(tmp_path, no_server):
    out = tmp_path / "out"
    out.mkdir()
    _model_records(out, "1.5b")
    (out / "meta.json").write_text(json.dumps({"model_id": "1.5b"}))
    # every vanilla ranking is stored: nothing to rerank, so no endpoint; the report is rewritten
    assert main(["--data", str(TINY), "--out", str(out), "--top", "5", "--methods", "bm25,vanilla", "--model", "1.5b",
                 "--no-progress"]) == 0
    assert "| `vanilla` | 3 |" in (out / "report.md").read_text()
    assert json.loads((out / "meta.json").read_text())["model_id"] == "1.5b"


def test_eval_refuses_a_folder_of_another_endpoint_model_before_connecting(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    _model_records(out, "qwen-0.5b@127.0.0.1:9")
    status = main(["--data", str(TINY), "--out", str(out), "--top", "5", "--methods", "vanilla", "--no-progress",
                   "--base-url", "http://127.0.0.1:9/v1", "--model", "qwen-1.5b", "--timeout", "5"])
    assert status == 2
    assert "'qwen-0.5b@127.0.0.1:9', not 'qwen-1.5b@127.0.0.1:9'" in capsys.readouterr().err


def test_eval_fresh_sets_the_old_records_aside(tmp_path, no_server):
    out = tmp_path / "out"
    out.mkdir()
    old = _model_records(out, "0.5b").path.read_text()
    (out / "meta.json").write_text(json.dumps({"model_id": "0.5b"}))
    (out / "runs").mkdir()
    (out / "runs" / "vanilla.txt").write_text("made from the old records")
    assert main(["--data", str(TINY), "--out", str(out), "--top", "5", "--methods", "bm25", "--model", "1.5b",
                 "--fresh", "--no-progress"]) == 0
    kept = list(out.glob("records.jsonl.*.old"))
    assert len(kept) == 1 and kept[0].read_text() == old and len(list(out.glob("meta.json.*.old"))) == 1
    assert {r["method"] for r in Store(out / "records.jsonl").select("rank")} == {"bm25"}
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["bm25.txt"]


def test_records_name_the_model_they_were_ranked_with(tmp_path):
    from capcal_integrations import CapCalReranker
    from tests.fake_endpoint import clients, make_handler

    sync, async_ = clients(make_handler())
    reranker = CapCalReranker(client=sync, async_client=async_)
    store = Store(tmp_path / "records.jsonl")
    groups = rank_jobs(load_dataset(TINY).topics[:1], parse_specs("bm25,vanilla"), 3)
    summary = asyncio.run(Runner(store, reranker, progress=False, model_id="1.5b").run(groups))
    assert summary.failed == [] and summary.done == 2
    assert [r.get("model") for r in store.select("rank")] == [None, "1.5b"]  # bm25 used no model


def test_identity_of_embedded_and_endpoint_models(monkeypatch):
    from capcal_integrations.evaluation import identity

    monkeypatch.delenv("CAPCAL_BASE_URL", raising=False)
    assert identity.planned_model_id(None, None) == "0.5b" and identity.planned_model_id(None, "1.5b") == "1.5b"
    assert identity.planned_model_id("https://k:s@api.example.com/v1", "gpt-4o-mini") == "gpt-4o-mini@api.example.com"
    assert identity.planned_model_id("http://h:8000/v1", None) is None  # the endpoint will say
    monkeypatch.setenv("CAPCAL_BASE_URL", "http://h:8000/v1")
    assert identity.planned_model_id(None, "m") == "m@h:8000"
    identity.check_weights("1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "http://h/v1")
    identity.check_weights("1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m-hf", "http://h/v1")  # vLLM's conversion
    identity.check_weights("1.5b", None, "http://h/v1")  # the server does not say
    with pytest.raises(InputError, match="serves qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, not the embedded model '1.5b'"):
        identity.check_weights("1.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "http://h/v1")


def test_eval_records_its_command_line_without_credentials(tmp_path):
    out = tmp_path / "out"
    assert main(["--data", str(TINY), "--out", str(out), "--methods", "bm25", "--no-progress",
                 "--base-url", "http://bob:hunter2@127.0.0.1:9/v1?api_key=qs-secret", "--api-key", "sk-live-123"]) == 0
    for name in ("meta.json", "report.md"):
        text = (out / name).read_text()
        assert "hunter2" not in text and "sk-live-123" not in text and "qs-secret" not in text, name
        assert "http://***@127.0.0.1:9/v1" in text and "--api-key ***" in text, name


def test_eval_api_key_without_base_url_is_refused(tmp_path, capsys, no_server):
    status = main(["--data", str(TINY), "--out", str(tmp_path / "out"), "--methods", "vanilla", "--api-key", "sk-1"])
    assert status == 2 and "--api-key is the key of --base-url" in capsys.readouterr().err


# --------------------------------------------------------------------------- end to end, real server

@pytest.mark.e2e
def test_eval_end_to_end_on_the_tiny_fixture(server_url, test_model, tmp_path):
    out = tmp_path / "eval"
    args = ["--data", str(TINY), "--out", str(out), "--top", "5", "--queries", "2", "--base-url", server_url,
            "--model", test_model, "--methods", "bm25,vanilla,capcal,first-token", "--shuffles", "2",
            "--bias-queries", "1", "--bias-methods", "first-token", "--needle-queries", "1",
            "--needle-positions", "1,5", "--no-progress"]
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    ranks = [r for r in records if r["kind"] == "rank"]
    assert sorted((r["method"], r["qid"]) for r in ranks) == sorted(
        (m, q) for m in ("bm25", "vanilla", "capcal", "first-token") for q in ("1115776", "1106007"))
    for r in records:
        assert sorted(r["order"]) == sorted(r["input"]) and len(r["input"]) == 5
    capcal = next(r for r in ranks if r["method"] == "capcal")
    assert capcal["usage"]["requests"] > 0 and capcal["seconds"] > 0
    # the content check (the default guard) decides over queries: an evaluation waits for each query's readings
    # (read inside the ranking: checked), and two queries cannot decide, so both lists keep their BM25 order
    # and the records say so (the method that ran, kept_given_order)
    assert capcal["checked"] == [0] and capcal["kept_given_order"] and capcal["ran"] == "given-order"
    assert capcal["order"] == capcal["input"]
    assert {r["kind"] for r in records} == {"rank", "shuffle", "needle"}
    report = (out / "report.md").read_text()
    for label in ("`vanilla`", "`capcal`", "`first-token`", "Kendall", "Needle"):
        assert label in report
    assert (out / "ndcg_per_method.png").stat().st_size > 1000
    meta = json.loads((out / "meta.json").read_text())
    host = server_url.split("//", 1)[1].split("/", 1)[0]
    assert meta["model_id"] == f"{test_model}@{host}" and meta["endpoint"] == host
    assert {r["model"] for r in records if r["method"] != "bm25"} == {meta["model_id"]}
    if meta["server"] == "llama.cpp":
        assert meta["weights"].endswith(".gguf") and f"weights `{meta['weights']}`" in report
    before = len(records)
    assert main(args) == 0  # resumes: nothing left to rerank
    assert len((out / "records.jsonl").read_text().splitlines()) == before
    other = [*args[: args.index("--model") + 1], "another-model", *args[args.index("--model") + 2:]]
    assert main(other) == 2  # refused: the folder holds the first model's results


def test_report_from_synthetic_records_has_every_section(tmp_path):
    """Every report section and plot, from records shaped like a real run (no model needed)."""
    import random

    from capcal_integrations.evaluation.report import write_report

    ds = load_dataset(TINY)
    specs = parse_specs("bm25,vanilla,capcal,first-token:capcal")
    store = Store(tmp_path / "records.jsonl")
    asyncio.run(Runner(store, None, progress=False).run(
        rank_jobs(ds.topics, specs[:1], 5) + shuffle_jobs(ds.topics, specs[:1], 5, 2)))
    rng = random.Random(0)
    usage = {"requests": 10, "prompt_tokens": 1000, "completion_tokens": 4, "cached_tokens": 900}
    jobs = (rank_jobs(ds.topics, specs[1:], 5) + shuffle_jobs(ds.topics, specs[1:], 5, 2)
            + needle_jobs(ds, ds.topics, specs[1:], 5, 2))
    for _, group in jobs:
        for job in group:
            order = list(job.docids)
            rng.shuffle(order)
            p = [rng.random() + 0.01 for _ in order]
            p = [x / sum(p) for x in p]
            rec = {"kind": job.kind, "method": job.spec.key, "label": job.spec.label, "qid": job.topic.qid,
                   "variant": job.variant, "input": list(job.docids), **job.extra, "order": order,
                   "usage": usage, "seconds": rng.uniform(1, 5), "entropies": [1.0 + rng.random()],
                   "alphas": [1.0], "first_step": {"candidates": [0, 1, 2, 3, 4], "p": p,
                                                   "q": [0.4, 0.1, 0.1, 0.1, 0.3] if job.spec.calibrated else None,
                                                   "s": p}}
            if job.spec.calibrated:
                rec["prior"] = [0.4, 0.1, 0.1, 0.1, 0.3]
            store.add(rec)
    path = write_report(tmp_path, ds, store, specs, specs, {"top": 5, "model": "synthetic"})
    text = path.read_text()
    for heading in ("### Quality", "### Where the model has signal", "### Position bias", "### Needle test",
                    "### Cost", "### Calibration strength", "psc* (Borda of vanilla's 2 bias shuffles)",
                    "P([1]) = 0.400", "label-free choice", "### Content signal"):
        assert heading in text, heading
    for png in ("ndcg_per_method", "delta_vs_vanilla", "top1_positions", "needle", "cost_quality"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000, png


def test_standalone_seconds_charges_the_prefill_others_paid(tmp_path):
    def rec(method, t, seconds, uncached):
        return {"kind": "rank", "method": method, "qid": "q", "variant": "", "input": ["a", "b"], "order": ["a", "b"],
                "time": f"2026-01-01T00:00:0{t}", "seconds": seconds,
                "usage": {"requests": 1, "prompt_tokens": 3000, "completion_tokens": 1, "cached_tokens": 3000 - uncached}}
    recs = [rec("first-token", 1, 40.0, 2000), rec("first-token-capcal", 2, 8.0, 400), rec("vanilla", 3, 30.0, 100),
            rec("capcal", 4, 40.0, 200), rec("capcal:placeholder=", 5, 45.0, 500), rec("psc:m=5", 6, 300.0, 10000),
            rec("capcal:alpha=0.5", 7, 50.0, 2100)]
    store = _store(tmp_path, recs)
    est = [analysis.standalone_seconds(store, r) for r in recs]
    # first-token pays its own prefill; vanilla + 40; capcal + 40 + 8; own empty prompt: + 40 only;
    # psc's prompts are all cold; a run that found nothing cached already paid everything
    assert est == [40.0, 48.0, 70.0, 88.0, 85.0, 300.0, 50.0]


def test_eval_command_unreachable_endpoint_is_a_clean_error(tmp_path, capsys):
    out = tmp_path / "out"
    status = main(["--data", str(TINY), "--out", str(out), "--methods", "bm25,vanilla", "--no-progress",
                   "--base-url", "http://127.0.0.1:9/v1", "--timeout", "5"])
    assert status == 1 and "capcal eval: error:" in capsys.readouterr().err
    assert (out / "report.md").is_file()


def test_release_ndcg_takes_the_ideal_from_the_judged_candidates_only():
    from capcal_integrations.evaluation.data import Qrel, ScoredDoc
    from capcal_integrations.evaluation.metrics import CANDIDATES_NDCG

    # d3 is relevant but was not retrieved; the run ranks d2 (grade 0) above d1 (grade 1)
    qrels = [Qrel("q", "d1", 1), Qrel("q", "d2", 0), Qrel("q", "d3", 1)]
    run = [ScoredDoc("q", "d2", 2.0), ScoredDoc("q", "d1", 1.0)]
    got = per_query(qrels, run, ["q"])
    dcg = 1 / math.log2(3)  # d1 at rank 2
    assert got["nDCG@10"]["q"] == pytest.approx(dcg / (1 + 1 / math.log2(3)))  # ideal: d1 and d3
    assert got[CANDIDATES_NDCG]["q"] == pytest.approx(dcg / 1)  # ideal: d1 alone
