"""Issue 24 item 5 and issue 23 item 5: ``-v`` after the command, one meaning of ``--model``, ``--top-n`` at
least 1 and decoding only that many places, help text without markup, and a data error that shows the
layout. On the fake endpoint behind a socket (tests/fake_endpoint.py's ``Loopback``); no model."""

from __future__ import annotations

import json
import socket

import pytest

from capcal_integrations.commands.cli import build_parser, main
from tests.fake_endpoint import Loopback

PASSAGES = "Fleas live two to three months.\nBananas are yellow.\nThe Eiffel Tower is in Paris.\n"


@pytest.fixture
def passages(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text(PASSAGES)
    return path


@pytest.fixture
def fake():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Loopback(port=port) as server:
        yield server


def _bodies(server) -> list[dict]:
    return [json.loads(s.body) for s in server.seen if s.method == "POST"]


def _decoding_requests(server) -> int:
    return sum("completions" in s.path for s in server.seen)


def test_verbose_is_accepted_after_the_command_and_before_it():
    parser = build_parser()
    for argv in (["rerank", "-v"], ["-v", "rerank"], ["rerank", "--verbose"], ["serve", "-v"], ["key", "-v"]):
        assert parser.parse_args(argv).verbose is True, argv
    assert parser.parse_args(["rerank"]).verbose is False


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_top_n_below_one_exits_2_with_a_clear_message(bad, passages, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["rerank", "--base-url", "http://127.0.0.1:9/v1", "--query", "q", "--passages", str(passages),
              "--top-n", bad])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--top-n" in err and ("at least 1" in err or "whole number" in err)


def test_top_n_decodes_only_that_many_places(fake, passages, capsys):
    assert main(["rerank", "--base-url", fake.base_url, "--query", "fleas", "--passages", str(passages),
                 "--method", "vanilla", "--top-n", "1"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["ranked"]) == 1 and sorted(record["order"]) == [0, 1, 2]
    one_place = _decoding_requests(fake)
    fake.seen.clear()
    assert main(["rerank", "--base-url", fake.base_url, "--query", "fleas", "--passages", str(passages),
                 "--method", "vanilla"]) == 0
    capsys.readouterr()
    assert _decoding_requests(fake) > one_place > 0  # old code: the same requests (it sliced after a full decoding)


def test_model_with_base_url_is_the_name_sent(fake, passages, capsys):
    assert main(["rerank", "--base-url", fake.base_url, "--model", "my-served-model", "--query", "fleas",
                 "--passages", str(passages), "--method", "vanilla"]) == 0
    bodies = [b for b in _bodies(fake) if "model" in b]
    assert bodies and all(b["model"] == "my-served-model" for b in bodies)


def test_help_has_no_restructuredtext_markup(capsys):
    for argv in (["--help"], ["rerank", "--help"], ["serve", "--help"], ["key", "--help"], ["demo", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        out = capsys.readouterr().out
        assert "``" not in out and ":class:" not in out and ":func:" not in out, argv


def test_a_folder_in_another_layout_is_told_the_expected_one(tmp_path, capsys):
    (tmp_path / "data.csv").write_text("qid,docid\n")
    assert main(["eval", "--data", str(tmp_path), "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "candidates.jsonl.gz" in err and "qrels.txt" in err and '"candidates"' in err
