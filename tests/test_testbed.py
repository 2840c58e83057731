"""The testbed's simulated llama.cpp server: it speaks the dialect the library probes for, reads every
prompt back (passages, grades, the decoding prefix), and answers the parametric model's label
distribution, so that what the library reads at each step is known exactly."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capcal_integrations import EndpointError
from capcal_integrations.calibration.formulas import normalise_logprobs
from capcal_integrations.endpoints import SPAN_SEPARATOR
from capcal_integrations.testbed import SCENARIOS, SlotModel, simulated_endpoint
from capcal_integrations.testbed.endpoint import Vocabulary, pieces, tokenize

WORDS = "flea cat dog lives years water heat sun moon river stone tree bird fish grass cloud".split()


def lists(k=3, n=8):
    """``k`` synthetic lists of ``n`` passages with grades 0..3 (distinct texts per query)."""
    out = []
    for q in range(k):
        passages = [f"{WORDS[(q + i) % len(WORDS)].title()} passage {q}-{i}: " + " ".join(WORDS[(i * 3 + j) % len(WORDS)]
                    for j in range(12)) for i in range(n)]
        out.append((f"query number {q}", passages, [(i * 7 + q) % 4 for i in range(n)]))
    return out


def shares(p):
    return [x / sum(p) for x in p]


def softmax(logits):
    return normalise_logprobs(list(logits))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_the_tokenizer_is_invertible(text):
    vocab = Vocabulary()
    for special in (True, False):
        tokens = tokenize(vocab, text, special)
        assert "".join(p for _, p in tokens) == text
        assert "".join(vocab.piece(t) for t, _ in tokens) == text


def test_identifier_pieces_and_special_tokens():
    assert pieces(" [12] >") == [" [", "1", "2", "]", " >"]
    assert pieces("<|im_end|>x") == ["<|im_end|>", "x"]
    assert "<|im_end|>" not in pieces("<|im_end|>", parse_special=False)


def test_the_library_probes_it_as_llama_cpp():
    caps = simulated_endpoint(lists(), s=1.0).reranker().capabilities()
    assert (caps.server, caps.transport, caps.tokenize, caps.slots, caps.context) == (
        "llama.cpp", "completions", "llamacpp", 8, 32768)


@pytest.mark.parametrize("options", [
    {"method": "capcal", "alpha": 1.0, "guard": None},
    {"method": "capcal", "alpha": 1.0, "guard": None, "probability": "trie"},
    {"method": "capcal", "alpha": 1.0, "preset": "release"},
    {"method": "capcal", "alpha": 1.0, "guard": None, "labels": "alpha"},
])
def test_each_step_reads_the_models_label_distribution(options):
    data = lists()
    endpoint = simulated_endpoint(data, scenario="delta-0.5b", s=1.0, seed=3)
    query, passages, grades = data[1]
    ranking = endpoint.reranker(**options).rerank(query, passages)
    readings = endpoint.server.readings()
    [real] = [r for r in readings if r.grades is not None]
    [empty] = [r for r in readings if r.grades is None]
    assert real.grades == tuple(grades)
    first, later = ranking.steps[0], ranking.steps[5]  # later: the same logits over the labels not yet chosen
    # renormalised here for normalise=False (the release's raw joint probabilities); a little mass leaks to other tokens
    assert shares(first.p) == pytest.approx(softmax(real.logits), abs=2e-3)
    assert shares(first.q) == pytest.approx(softmax(empty.logits), abs=2e-3)
    assert shares(later.p) == pytest.approx(softmax([real.logits[i] for i in later.candidates]), abs=2e-3)


def test_vanilla_follows_the_logits_and_s_zero_is_slot_order_only():
    data = lists(1, 12)
    endpoint = simulated_endpoint(data, s=3.0, noise=0.0, prior=[0.0] * 12, seed=0)
    query, passages, grades = data[0]
    order = endpoint.reranker(method="vanilla").rerank(query, passages).order
    assert [grades[i] for i in order] == sorted(grades, reverse=True)
    blind = simulated_endpoint(data, s=0.0, noise=0.0, prior=[-j for j in range(12)], seed=0)
    assert blind.reranker(method="vanilla").rerank(query, passages).order == tuple(range(12))


def test_passages_are_found_after_cleaning_cutting_and_for_their_own_query():
    text = "Fleas  can live [3] up to <|im_end|> a year in warm homes with pets and carpets"
    data = [("how long do fleas live", [text, "Cats sleep a lot", "Dogs bark"], [3, 0, 1]),
            ("what do cats do", [text, "Cats sleep a lot", "Dogs bark"], [0, 2, 0])]
    endpoint = simulated_endpoint(data, s=1.0)
    endpoint.reranker(method="vanilla", max_passage_words=4).rerank("what do cats do", data[1][1])
    [real] = [r for r in endpoint.server.readings() if r.grades is not None]
    assert real.grades == (0, 2, 0)


def test_a_passage_it_does_not_know_is_an_http_400():
    endpoint = simulated_endpoint(lists(), s=1.0)
    with pytest.raises(EndpointError, match="not in the testbed's data") as err:
        endpoint.reranker(method="vanilla").rerank("query number 0", ["an unknown passage", "another one"])
    assert err.value.status == 400


def test_passages_sent_as_token_ids_read_as_the_same_prompt():
    """The template as text, the passages as ids from /tokenize with parse_special false (llama.cpp's
    mixed prompt): the same distribution as the all-text prompt."""
    data = lists(1, 4)
    endpoint = simulated_endpoint(data, s=1.0, seed=2)
    client = endpoint.http_client
    query, passages, _ = data[0]
    body = "".join(f"[{i + 1}] {p}\n" for i, p in enumerate(passages))
    text = client.post("http://testbed.invalid/apply-template", json={"messages": [
        {"role": "user", "content": f"Rank for: {query}.\n\n{body}Search Query: {query}."}]}).json()["prompt"]
    start, end = text.index("[1] "), text.index("Search Query")

    def ids(s):
        answer = client.post("http://testbed.invalid/tokenize", json={"content": s, "parse_special": False}).json()
        return answer["tokens"]

    opening = client.post("http://testbed.invalid/tokenize", json={"content": "["}).json()["tokens"]
    mixed = [text[:start], *ids(text[start:end]), text[end:], *opening]
    plain = [text, *opening]
    answers = client.post("http://testbed.invalid/v1/completions", json={"prompt": [mixed, plain], "logprobs": 20}).json()
    a, b = (c["logprobs"]["content"][0]["top_logprobs"] for c in answers["choices"])
    assert a == b and len(a) >= 4
    assert answers["usage"]["prompt_tokens"] > 2 * len(pieces(text)) - 10


def test_text_alone_in_a_prompt_list_is_refused_as_llama_cpp_does():
    endpoint = simulated_endpoint(lists(), s=1.0)
    answer = endpoint.http_client.post("http://testbed.invalid/v1/completions", json={"prompt": [["a", "b"]]})
    assert answer.status_code == 400


def test_the_async_path_reads_the_same():
    data = lists()
    endpoint = simulated_endpoint(data, s=1.0, seed=5)
    query, passages, _ = data[2]
    sync = endpoint.reranker(method="capcal", alpha=1.0, guard=None).rerank(query, passages)
    again = asyncio.run(endpoint.reranker(method="capcal", alpha=1.0, guard=None).arerank(query, passages))
    assert again.order == sync.order and again.steps[0].p == pytest.approx(sync.steps[0].p)


def test_the_same_prompt_gets_the_same_noise_another_draw_other_noise():
    data = lists()
    query, passages, _ = data[0]
    first = [simulated_endpoint(data, s=1.0, seed=k).reranker(method="vanilla").rerank(query, passages).steps[0].p
             for k in (1, 1, 2)]
    assert first[0] == first[1] and first[0] != first[2]


def test_slot_model_ties_and_preferences():
    model = SlotModel(s=1.0, noise=0.5, tie=5, seed=1)
    logits = model.logits([0, 1, 2, 3, 0, 1, 2, 3], "p")
    assert sorted(logits)[:5] == [min(logits)] * 5 and len(set(logits)) == 4
    liking = SlotModel(s=0.0, noise=0.0, preference=1.0, seed=1)
    a = liking.logits([0, 0], "prompt a", ["x", "y"])
    b = liking.logits([0, 0], "prompt b", ["y", "x"])
    assert a == b[::-1] and a[0] != a[1]  # the same taste for a passage in every prompt
    assert set(SCENARIOS) >= {"no-delta", "delta-0.5b", "delta-1.5b", "last-digit", "ties"}
    assert set(SCENARIOS) >= {"noise-scale-0.5", "noise-scale-1", "heavy-tails", "shared-slots", "scale-1.5b"}


def test_the_command_prints_and_writes_rows(tmp_path, capsys):
    from capcal_integrations.testbed.command import main

    folder = tmp_path / "data"
    folder.mkdir()
    with gzip.open(folder / "candidates.jsonl.gz", "wt", encoding="utf-8") as f:
        for q, (query, passages, _) in enumerate(lists(3, 6)):
            f.write(json.dumps({"qid": str(q), "query": query, "candidates": [
                {"docid": f"{q}-{i}", "text": p, "bm25_rank": i + 1} for i, p in enumerate(passages)]}) + "\n")
    (folder / "qrels.txt").write_text("".join(f"{q} 0 {q}-{i} {g}\n" for q, (_, _, grades) in enumerate(lists(3, 6))
                                              for i, g in enumerate(grades)))
    out = tmp_path / "rows.json"
    assert main(["--data", str(folder), "--s", "0,2", "--draws", "1", "--scenarios", "no-delta", "--json", str(out),
                 "--quiet"]) == 0
    rows = json.loads(out.read_text())
    assert {tuple(sorted(r)) for r in rows} == {("method", "ndcg10", "reads_share", "s", "scenario")}
    assert {r["method"] for r in rows} >= {"bm25", "vanilla", "capcal-1", "default"}
    by = {(r["s"], r["method"]): r["ndcg10"] for r in rows}
    assert by[(2.0, "vanilla")] > by[(2.0, "bm25")]
    assert "| scenario | s | method |" in capsys.readouterr().out


def test_ndcg_is_trec_evals():
    from capcal_integrations.testbed.measure import ndcg10

    # DCG = 3/log2(3) + 1/log2(4) = 2.3928; ideal = 3 + 1/log2(3) + 1/2 = 4.1309
    assert ndcg10([0, 3, 1], [3, 1, 1]) == pytest.approx((3 / math.log2(3) + 0.5) / (3 + 1 / math.log2(3) + 0.5))


def test_a_plain_import_does_not_load_the_testbed():
    code = "import capcal_integrations, sys; print(any(m.startswith('capcal_integrations.testbed') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_the_committed_slot_effects_are_what_the_fit_gives(tmp_path):
    """slot_effects.json is regenerated by its script from the packaged models' records."""
    import pathlib

    from capcal_integrations.testbed import fit

    root = pathlib.Path(__file__).resolve().parent.parent
    qrels = pathlib.Path("/work/shared/data/trec-dl19-passage/qrels.txt")
    if not qrels.is_file() or not (root / "benchmarks/results/quality/records/trec-dl19-passage/records.jsonl").is_file():
        pytest.skip("needs the DL19 qrels and the packaged models' records")
    out = tmp_path / "effects.json"
    assert fit.main(["--qrels", str(qrels), "--out", str(out)]) == 0
    committed = json.loads((root / "capcal_integrations/testbed/slot_effects.json").read_text())
    assert json.loads(out.read_text())["fits"] == committed["fits"]
    assert committed["fits"]["0.5b"]["lists"] == 43 and committed["fits"]["1.5b"]["lists"] == 20


def test_tokenize_takes_a_mixed_list_as_llama_cpp_does():
    endpoint = simulated_endpoint(lists(), s=1.0)
    post = endpoint.http_client.post
    ids = post("http://testbed.invalid/tokenize", json={"content": "[1] cat"}).json()["tokens"]
    mixed = post("http://testbed.invalid/tokenize", json={"content": ["<|im_start|>user ", *ids], "with_pieces": True}).json()
    assert "".join(t["piece"] for t in mixed["tokens"]) == "<|im_start|>user [1] cat"
    assert mixed["tokens"][0]["piece"] == "<|im_start|>"  # the text's control tokens parsed (parse_special default)
    # the untrusted spans of a ranking in one request, between an id past the vocabulary (passed as given)
    spans = post("http://testbed.invalid/tokenize", json={"content": ["[1] cat", SPAN_SEPARATOR, " dog"],
                                                          "parse_special": False}).json()["tokens"]
    assert spans == [*ids, SPAN_SEPARATOR, *post("http://testbed.invalid/tokenize", json={"content": " dog"}).json()["tokens"]]


def test_routed_prompts_as_token_ids_only_read_the_same():
    data = lists()
    query, passages, _ = data[0]
    plain = simulated_endpoint(data, s=1.0, seed=4).reranker(method="vanilla").rerank(query, passages)
    routed = simulated_endpoint(data, s=1.0, seed=4).reranker(method="vanilla", routed=True).rerank(query, passages)
    assert routed.order == plain.order and routed.steps[0].p == pytest.approx(plain.steps[0].p)


# ---------------------------------------------------------------- issue 22: the shapes of real traffic (model)


def _old_logits(model, grades, prompt, passages=()):
    """The formula before issue 22's parameters (a copy): the defaults must give exactly these logits."""
    import random

    from capcal_integrations.testbed.model import _digest, _unit, stretch

    n = len(grades) if grades is not None else len(passages)
    rng = random.Random(_digest(f"{model.seed}|{prompt}"))
    b = stretch(model.prior, n)
    if grades is None:
        return [b[j] + rng.gauss(0.0, model.noise_empty) for j in range(n)]
    d = stretch(model.delta, n)
    out = [model.s * grades[j] + b[j] + d[j] + rng.gauss(0.0, model.noise) for j in range(n)]
    if model.preference:
        out = [v + model.preference * _unit(f"{model.seed}|passage|{p}") for v, p in zip(out, passages)]
    return out


@pytest.mark.parametrize("name", ["no-delta", "delta-0.5b", "delta-1.5b", "last-digit"])
def test_the_defaults_give_the_old_logits_exactly(name):
    model = SCENARIOS[name].replace(s=0.7, seed=11, preference=0.2)
    grades = [(j * 5) % 4 for j in range(20)]
    keys = [f"p{j}" for j in range(20)]
    for key in ("", "some query"):
        assert model.logits(grades, "prompt a", keys, list_key=key) == _old_logits(model, grades, "prompt a", keys)
        assert model.logits(None, "empty a", ["x"] * 20, list_key=key) == _old_logits(model, None, "empty a", ["x"] * 20)
        assert model.logits(grades, "prompt a", keys) == model.logits(grades, "prompt a", keys, list_key=key)


def test_shared_slot_effects_follow_the_list_not_the_order():
    model = SlotModel(s=0.0, noise=0.0, noise_empty=0.0, shared_slots=1.0, seed=3)
    given = model.logits([3, 0, 1, 2], "given order", ["a", "b", "c", "d"], list_key="query 1")
    swapped = model.logits([1, 2, 3, 0], "swapped order", ["c", "d", "a", "b"], list_key="query 1")
    other = model.logits([3, 0, 1, 2], "given order", ["a", "b", "c", "d"], list_key="query 2")
    assert given == swapped and given != other and len(set(given)) == 4  # the same u(list, slot) in both readings
    assert model.logits(None, "empty", ["x"] * 4, list_key="query 1") == [0.0] * 4  # real prompts only
    # with noise, the two readings' residuals share u: their slot-by-slot covariance is about shared_slots ** 2
    noisy = SlotModel(s=0.0, noise=0.5, shared_slots=1.0, seed=4)
    pairs = [(noisy.logits([0] * 20, f"a{k}", list_key=f"q{k}"), noisy.logits([0] * 20, f"b{k}", list_key=f"q{k}"))
             for k in range(200)]
    cov = sum(x * y for a, b in pairs for x, y in zip(a, b)) / (200 * 20)
    assert cov == pytest.approx(1.0, abs=0.15)


def test_noise_scale_multiplies_a_lists_noise_by_its_factor():
    import statistics

    model = SlotModel(s=0.0, noise=0.3, noise_empty=0.1, noise_scale=1.0, seed=5)
    factors = {key: model.list_scale(key) for key in ("q1", "q2", "q3")}
    assert len(set(factors.values())) == 3 and all(f > 0 for f in factors.values())
    assert factors["q1"] == model.list_scale("q1") and SlotModel(noise_scale=0.0).list_scale("q1") == 1.0
    for key, factor in factors.items():
        real = model.logits([0] * 4000, f"real {key}", list_key=key)
        empty = model.logits(None, f"empty {key}", ["x"] * 4000, list_key=key)
        assert statistics.pstdev(real) == pytest.approx(0.3 * factor, rel=0.05)
        assert statistics.pstdev(empty) == pytest.approx(0.1 * factor, rel=0.05)
        # exactly the Gaussian draws of the model without a scale, multiplied by the factor
        plain = model.replace(noise_scale=0.0).logits([0] * 50, f"real {key}", list_key=key)
        assert model.logits([0] * 50, f"real {key}", list_key=key) == pytest.approx([v * factor for v in plain])
    spread = statistics.pstdev(math.log(model.list_scale(f"q{k}")) for k in range(2000))
    assert spread == pytest.approx(1.0, abs=0.05)


def test_heavy_tails_keep_the_noise_sd_and_fatten_the_tails():
    import statistics

    model = SlotModel(s=0.0, noise=0.4, tails=3.0, seed=6)
    draws = [v for k in range(40) for v in model.logits([0] * 2000, f"prompt {k}")]
    assert statistics.pstdev(draws) == pytest.approx(0.4, rel=0.1)
    mad = statistics.median(abs(v) for v in draws)
    assert mad == pytest.approx(0.4 * math.sqrt(1 / 3) * 0.7649, rel=0.05)  # t3's median |t| 0.7649, scaled to SD 1
    assert mad < 0.4 * 0.6745  # below the Gaussian's of the same SD: the mass sits in the middle and the tails
    with pytest.raises(Exception, match="tails"):
        SlotModel(tails=2.0)


def test_the_endpoint_keys_a_lists_prompts_by_its_query():
    """The real, the swapped and the empty prompt of one list share its key (its query), so its shared slot
    effects and noise scale; another list has another key."""
    data = lists(2, 6)
    endpoint = simulated_endpoint(data, s=0.0, noise=0.0, noise_empty=0.0, prior=[0.0] * 6, shared_slots=1.0, seed=2)
    first = endpoint.reranker(method="first-token", guard=None)
    query, passages, _ = data[0]
    given = first.rerank(query, passages).steps[0].p
    swapped = first.rerank(query, passages[3:] + passages[:3]).steps[0].p
    other = first.rerank(data[1][0], data[1][1]).steps[0].p
    assert given == pytest.approx(swapped) and given != pytest.approx(other)
    u = endpoint.model.slot_effects(query, 6)
    assert shares(given) == pytest.approx(softmax(u), abs=2e-3)
    index = endpoint.server.index
    assert index.query_of(f"Rank for: {query}. [1] x") == query and index.query_of("nothing") == ""


def test_the_new_scenarios_carry_the_fitted_values():
    from capcal_integrations.testbed.model import slot_effects

    fits = slot_effects()
    assert SCENARIOS["noise-scale-0.5"].noise_scale == 0.5 and SCENARIOS["noise-scale-1"].noise_scale == 1.0
    assert SCENARIOS["heavy-tails"].tails == 3.0
    assert SCENARIOS["shared-slots"].shared_slots == fits["0.5b"]["shared_slots"] > 0.3  # the "sd .35"
    assert SCENARIOS["shared-slots"].noise == fits["0.5b"]["noise_fresh"]
    assert SCENARIOS["scale-1.5b"].noise_scale == fits["1.5b"]["noise_scale"] > 0.3
    assert SCENARIOS["scale-1.5b"].replace(noise_scale=0.0, name="delta-1.5b") == SCENARIOS["delta-1.5b"]


# ---------------------------------------------------------------- issue 22: the shapes of real traffic (measure)


def bench(k=3, n=8):
    from capcal_integrations.testbed.measure import BenchList

    return [BenchList(q, tuple(p), tuple(g), tuple(sorted(g, reverse=True))) for q, p, g in lists(k, n)]


def server_for(data, name="no-delta", s=1.0, seed=0):
    from capcal_integrations.testbed.endpoint import PassageIndex, SimulatedServer
    from capcal_integrations.testbed.model import scenario

    return SimulatedServer(PassageIndex((b.query, b.passages, b.grades) for b in data), scenario(name, s, seed=seed))


def test_a_mixed_length_run_ranks_lists_of_different_lengths():
    from capcal_integrations.testbed.measure import _run, shaped

    data = bench(6, 40)
    cut = shaped(data, "mixed", seed=1, draw=0)
    lengths = [len(b.passages) for b in cut]
    assert all(3 <= n <= 30 for n in lengths) and len(set(lengths)) > 2
    assert cut == shaped(data, "mixed", seed=1, draw=0) and cut != shaped(data, "mixed", seed=1, draw=1)
    assert shaped(data, "fixed") == data and shaped(data, "concurrent") == data
    _, rankings = _run(server_for(data, "shared-slots"), cut, {"method": "capcal", "alpha": 1.0, "guard": None})
    assert [len(r.order) for r in rankings] == lengths
    assert all(sorted(r.order) == list(range(n)) for r, n in zip(rankings, lengths))


def test_the_windows_shape_ranks_lists_longer_than_the_window():
    from capcal_integrations.testbed.measure import _run, _windows, shaped

    data = bench(2, 60)
    cut = shaped(data, "windows", seed=0, draw=0)
    assert all(50 <= len(b.passages) <= 60 for b in cut)
    _, rankings = _run(server_for(data, "noise-scale-1"), cut, {"method": "capcal", "alpha": 1.0, "guard": None})
    assert all(len(r.order) == len(b.passages) > 20 and _windows(r) > 1 for r, b in zip(rankings, cut))


def test_the_concurrent_shape_ranks_eight_at_a_time_as_one_after_another_would():
    from capcal_integrations.testbed.measure import _run

    data = bench(10, 6)
    server = server_for(data, "heavy-tails", s=2.0, seed=3)
    opts = {"method": "capcal", "alpha": 1.0, "guard": None}
    _, together = _run(server, data, opts, concurrency=8)
    _, alone = _run(server, data, opts)
    assert [r.order for r in together] == [r.order for r in alone]  # the same prompts get the same noise


def test_measure_runs_each_shape_and_labels_its_rows():
    from capcal_integrations.testbed.measure import estimate, measure, table

    data = bench(3, 32)
    methods = {"bm25": None, "vanilla": {"method": "vanilla"}, "capcal-1": {"method": "capcal", "alpha": 1.0, "guard": None}}
    for shape in ("mixed", "concurrent"):
        rows = measure(data, scenarios=["shared-slots"], s_values=[2.0], draws=1, methods=methods, shape=shape)
        assert {r.shape for r in rows} == {shape} and all(r.json()["shape"] == shape for r in rows)
        by = {r.method: r for r in rows}
        assert by["vanilla"].ndcg10 > by["bm25"].ndcg10
        assert (3 <= by["vanilla"].passages <= 30) if shape == "mixed" else by["vanilla"].passages == 32
        assert f"shared-slots / {shape}" in table(rows)
    seconds, per_list = estimate(data, scenarios=["no-delta"], s_values=[0.0, 1.0], draws=2, methods=methods)
    assert set(per_list) == set(methods) and seconds == pytest.approx(sum(per_list.values()) * 3 * 2 * 2)
    assert "shape" not in measure(data[:1], scenarios=["no-delta"], s_values=[0.0], draws=1, methods=methods)[0].json()


def test_the_command_says_how_long_and_runs_a_shape(tmp_path, capsys):
    from capcal_integrations.testbed.command import main

    folder = tmp_path / "data"
    folder.mkdir()
    data = lists(3, 12)
    with gzip.open(folder / "candidates.jsonl.gz", "wt", encoding="utf-8") as f:
        for q, (query, passages, _) in enumerate(data):
            f.write(json.dumps({"qid": str(q), "query": query, "candidates": [
                {"docid": f"{q}-{i}", "text": p, "bm25_rank": i + 1} for i, p in enumerate(passages)]}) + "\n")
    (folder / "qrels.txt").write_text("".join(f"{q} 0 {q}-{i} {g}\n" for q, (_, _, grades) in enumerate(data)
                                              for i, g in enumerate(grades)))
    assert main(["--data", str(folder), "--s", "1", "--draws", "1", "--scenario", "heavy-tails", "--shape", "mixed,windows",
                 "--estimate-only"]) == 0
    err = capsys.readouterr().err
    assert "mixed: 3 lists x 1 draws" in err and "windows:" in err and "in all about" in err
    out = tmp_path / "rows.json"
    assert main(["--data", str(folder), "--s", "1", "--draws", "1", "--scenario", "scale-1.5b", "--shape", "concurrent",
                 "--json", str(out), "--quiet"]) == 0
    rows = json.loads(out.read_text())
    assert {r["shape"] for r in rows} == {"concurrent"} and {r["scenario"] for r in rows} == {"scale-1.5b"}
    with pytest.raises(SystemExit):
        main(["--data", str(folder), "--shape", "sideways"])


@pytest.mark.parametrize("name", ["shared-slots", "scale-1.5b"])
def test_the_fit_recovers_the_scenarios_list_level_parameters(name):
    """The moments fit.py reads off the real models' reorderings, read off the scenario's own (given and halves
    swapped, as the 1.5B's saved readings): the shared slot effects, the fresh noise and the spread of list scales."""
    from capcal_integrations.testbed.fit import _halves, shared_fit

    model = SCENARIOS[name].replace(s=0.0, seed=9)
    n, swap = 20, _halves(20)
    readings = []
    for k in range(300):
        key = f"query {k}"
        given = model.logits([0] * n, f"given {k}", list_key=key)  # log p up to a constant per reading
        swapped = model.logits([0] * n, f"swapped {k}", list_key=key)
        readings.append([(given, [str(j) for j in range(n)]), (swapped, [str(j) for j in swap])])
    got = shared_fit(readings)
    assert got["shared_slots"] == pytest.approx(model.shared_slots, abs=0.03)
    assert got["noise_scale"] == pytest.approx(model.noise_scale, abs=0.06)
    if not model.noise_scale:
        assert got["noise_fresh"] == pytest.approx(model.noise, abs=0.03) and got["noise_passage"] < 0.05


def test_the_empty_prompt_of_a_list_carries_its_key_too():
    seen = []

    class Spy(SlotModel):
        def logits(self, grades, prompt, passages=(), *, list_key=""):
            seen.append((grades is None, list_key))
            return super().logits(grades, prompt, passages, list_key=list_key)

    data = lists(2, 6)
    endpoint = simulated_endpoint(data, model=Spy(noise_scale=1.0))
    for template in ("rank_zephyr", "capcal"):
        for query, passages, _ in data:
            endpoint.reranker(method="capcal", alpha=1.0, guard=None, template=template).rerank(query, passages)
    assert set(seen) == {(empty, query) for empty in (True, False) for query, _, _ in data}


def test_the_ties_scenario_keeps_the_top_eight_whatever_the_length():
    """A server that cuts its log-probabilities at the top 8 ties the rest: 12 of 20 labels, none of 6 (a short list
    keeps its information, as on a real server)."""
    ties = SCENARIOS["ties"].replace(s=1.0, seed=3)
    long, short = ties.logits([j % 4 for j in range(20)], "p20"), ties.logits([0, 1, 2, 3, 0, 1], "p6")
    assert sorted(long)[:12] == [min(long)] * 12 and len(set(long)) == 9
    assert len(set(short)) == 6
