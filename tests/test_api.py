"""The public API and the layering: what users import, and what a plain import loads."""

import json
import subprocess
import sys

import pytest

import capcal_integrations


def test_public_api_is_pinned():
    assert sorted(capcal_integrations.__all__) == sorted([
        "CapCalReranker", "choose_alpha", "achoose_alpha", "AlphaChoice", "Options", "Document", "Ranking", "Step",
        "Usage", "Capabilities", "PromptTemplate", "RANK_ZEPHYR", "RANK_GPT", "DEFAULT_PLACEHOLDER", "METHODS",
        "windows", "borda", "kendall_tau", "calibrate", "calibrate_log", "adaptive_alpha", "entropy",
        "CapCalError", "InputError", "CapabilityError", "EndpointError", "EndpointTimeout", "EndpointUnreachable",
        "ResponseError", "MissingExtra", "SetupError", "ModelError", "ServerError",
    ])
    assert all(hasattr(capcal_integrations, name) for name in capcal_integrations.__all__)


def test_every_error_is_a_capcal_error():
    errors = [getattr(capcal_integrations, n) for n in capcal_integrations.__all__ if n.endswith(("Error", "Timeout",
                                                                                                 "Unreachable", "Extra"))]
    assert len(errors) == 11
    assert all(issubclass(e, capcal_integrations.CapCalError) for e in errors)


def test_a_plain_import_loads_the_core_alone():
    code = "import capcal_integrations, sys, json; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    ours = [m for m in loaded if m.startswith("capcal_integrations")]
    sys.stderr.write("\n".join(ours) + "\n")  # shown with -s: the closing note quotes it
    above = (["evaluation"], ["server"], ["commands"], ["integrations"], ["testbed"])
    assert not [m for m in ours if m.split(".")[1:2] in above], ours
    heavy = ("xllamacpp", "llama_index", "langchain_core", "matplotlib", "scipy", "ir_measures", "tqdm")
    assert not [m for m in loaded if m.split(".")[0] in heavy], "a framework or eval dependency was imported"
    # the core, and nothing else: a new core module is added here on purpose (ARCHITECTURE.md draws them)
    folders = {
        "": ("", "_moved", "errors", "options", "option_values", "redaction", "reranker", "tuning", "types"),
        "calibration": ("", "certify", "formulas", "strength"),
        "content_check": ("", "check", "registry", "decision", "judged", "attempts", "rules", "contrast", "evidence",
                          "query_contrast", "saved_decisions", "saved_readings", "saved_folder", "typed_json",
                          "betting"),
        "transport": ("", "client", "drivers", "transfer", "background"),
        "endpoints": ("", "base", "lists", "llamacpp", "vllm", "sglang", "ollama", "chat", "hosted_chat",
                      "hosted_completions", "controls", "probe", "calls", "answers", "caches", "routing",
                      "slots"),
        "prompts": ("", "render", "untrusted", "files"),
        "ranking": ("", "strategies", "decoding", "fitting", "depth", "deadline", "progress", "orders"),
        "reading": ("", "readers", "certified", "labels", "textlabels"),
    }
    core = {".".join(p for p in (folder, m) if p) for folder, names in folders.items() for m in names}
    assert set(ours) == {"capcal_integrations" + (f".{m}" if m else "") for m in core}, ours


def test_the_retired_ranking_fields_still_read_with_a_future_warning():
    """Issue 37's leftovers: ``Ranking.agreement`` (always empty) and ``Ranking.guarded`` (what
    ``kept_given_order`` says) are properties now, kept for code that reads them, each read warned."""
    kept = capcal_integrations.Ranking((0, 1), (1.0, 0.5), "given-order", kept_given_order=True)
    ranked = capcal_integrations.Ranking((1, 0), (1.0, 0.5))
    for ranking, guarded in ((kept, (0,)), (ranked, ())):
        with pytest.warns(FutureWarning, match="kept_given_order"):
            assert ranking.guarded == guarded
        with pytest.warns(FutureWarning, match="always empty"):
            assert ranking.agreement == ()
    with pytest.raises(TypeError):
        capcal_integrations.Ranking((0,), (1.0,), guarded=(0,))  # no longer a field: nothing sets it


def test_the_method_table_keeps_the_names_and_says_what_each_does():
    """Issue 37: method names dispatch through one table (options.METHOD_TABLE); the names and their order are
    the public METHODS, unchanged."""
    from capcal_integrations.options import CALIBRATED_METHODS, METHOD_TABLE

    assert capcal_integrations.METHODS == ("auto", "capcal", "vanilla", "first-token", "first-token-capcal", "psc")
    assert CALIBRATED_METHODS == {"auto", "capcal", "first-token-capcal"}
    assert {m for m, how in METHOD_TABLE.items() if how.first_only} == {"first-token", "first-token-capcal"}
    assert {m for m, how in METHOD_TABLE.items() if how.answers_suffice} == {"vanilla", "psc"}
    assert {m for m, how in METHOD_TABLE.items() if how.shuffles} == {"psc"}
    assert capcal_integrations.Options(method="psc").how.shuffles and not capcal_integrations.Options().how.first_only
