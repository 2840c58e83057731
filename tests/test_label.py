"""capcal label (issue 50): the grades kept in a JSONL of triples at once, a restart resuming from it, the page's
server on loopback with a key. The page itself in a real browser: tests/test_label_browser.py."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from capcal_integrations.commands.judged_files import read_judged
from capcal_integrations.commands.label import Labels, make_server, read_questions
from capcal_integrations.errors import InputError

QUESTIONS = [{"query": f"question {i}", "passages": [f"passage {i}-{j}" for j in range(3)]} for i in range(4)]


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return str(path)


def test_each_grade_is_kept_at_once_and_a_restart_resumes(questions, tmp_path):
    out = str(tmp_path / "labels.jsonl")
    labels = Labels(read_questions(questions), out)
    for j, g in enumerate((0, 2, 3)):
        labels.grade(0, j, g)
    labels.grade(1, 0, 1)
    assert labels.progress() == {"questions": 4, "questions_done": 1, "passages": 12, "graded": 4}
    # what capcal decide --judged reads: the finished question only
    assert read_judged(out) == [("question 0", ["passage 0-0", "passage 0-1", "passage 0-2"], [0, 2, 3])]
    again = Labels(read_questions(questions), out)
    assert again.grades[:2] == [[0, 2, 3], [1, None, None]] and again.progress() == labels.progress()
    again.grade(0, 0, 1)  # a changed grade: the newest line wins
    assert read_judged(out)[0][2] == [1, 2, 3]


def test_a_line_cut_short_by_a_kill_is_dropped_and_the_rest_kept(questions, tmp_path):
    out = tmp_path / "labels.jsonl"
    labels = Labels(read_questions(questions), str(out))
    labels.grade(0, 0, 3)
    out.write_text(out.read_text() + '{"query": "question 0", "passages": ["pas')
    again = Labels(read_questions(questions), str(out))
    assert again.grades[0] == [3, None, None] and out.read_text().endswith("\n")
    with open(out, "a") as f:
        f.write("not json\n")
    with pytest.raises(InputError, match="line 2: not a line capcal label wrote"):
        Labels(read_questions(questions), str(out))


def test_questions_are_checked_and_read_from_candidates(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "passages": ["a"]}\n{"query": "q", "passages": []}\n')
    with pytest.raises(InputError, match="bad.jsonl, line 2: \"passages\""):
        read_questions(str(bad))
    shared = tmp_path / "shared.jsonl"
    shared.write_text(json.dumps({"qid": "1", "query": "q", "candidates": [{"docid": "d1", "text": "t1"},
                                                                            {"docid": "d2", "text": "t2"}]}) + "\n")
    assert read_questions(str(shared), top=1) == [{"query": "q", "passages": [{"text": "t1", "id": "d1"}]}]


def _request(port, method, path, key=None, body=None, host=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def test_the_server_is_on_loopback_and_asks_for_its_key(questions, tmp_path):
    labels = Labels(read_questions(questions), str(tmp_path / "labels.jsonl"))
    server = make_server(labels, "secret-key", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host, port = server.server_address
        assert host == "127.0.0.1"
        status, page = _request(port, "GET", "/")
        assert status == 200 and b"capcal label" in page and b"question 0" not in page  # no data without the key
        assert _request(port, "GET", "/api/state")[0] == 401
        assert _request(port, "GET", "/api/state", key="wrong")[0] == 401
        assert _request(port, "GET", "/api/state", key="secret-key", host="evil.example:80")[0] == 403
        status, state = _request(port, "GET", "/api/state", key="secret-key")
        assert status == 200 and json.loads(state)["questions"][0]["query"] == "question 0"
        assert _request(port, "POST", "/api/grade", body={"question": 0, "passage": 0, "grade": 2})[0] == 401
        status, _ = _request(port, "POST", "/api/grade", key="secret-key", body={"question": 0, "passage": 0, "grade": 2})
        assert status == 200 and labels.grades[0][0] == 2
        status, said = _request(port, "POST", "/api/grade", key="secret-key", body={"question": 0, "passage": 9,
                                                                                   "grade": 2})
        assert status == 400 and b"no passage 9" in said
        assert _request(port, "POST", "/api/grade", key="secret-key", body={"question": 0, "passage": 1,
                                                                           "grade": 7})[0] == 400
    finally:
        server.shutdown()
        server.server_close()
