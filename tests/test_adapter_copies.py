"""Issue 24 item 6 and issue 23 items 4, 5 and 9: both adapters copy, pickle and dump like their neighbours,
never with a credential; fields are visible in the signature and checked on assignment; the caller's own
metadata entries are kept. On the fake endpoint and a loopback server that checks a key; no model."""

from __future__ import annotations

import copy
import inspect
import json
import os
import pathlib
import pickle
import socket
import subprocess
import sys

import pytest

from capcal_integrations import CapCalReranker, InputError
from tests.fake_endpoint import Loopback, httpx2, make_handler

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECRET = "sk-secret-24-do-not-leak"
CREDENTIAL_URL = "http://bob:hunter2pw@fake.test/v1"  # a query string is refused (test below), its key unshown
LEAKS = (SECRET, "hunter2pw", "querysecret24")


def _adapters():
    found = []
    for name in ("llamaindex_ext", "langchain_ext"):
        try:
            found.append(pytest.param(__import__(name), id=name))
        except ImportError:  # the stack venvs of .ci/run have one framework each
            found.append(pytest.param(None, id=name, marks=pytest.mark.skip(reason=f"{name}'s framework not installed")))
    return found


@pytest.fixture(params=_adapters())
def ext(request):
    return request.param


def _fake(ext, **fields):
    http = httpx2.Client(transport=httpx2.MockTransport(make_handler()))
    return ext.CapCalRerank(reranker=CapCalReranker(base_url="http://fake.test/v1", http_client=http), **fields)


def _rerank(ext, adapter, texts):
    if ext.__name__ == "llamaindex_ext":
        from llama_index.core.schema import NodeWithScore, TextNode

        nodes = [NodeWithScore(node=TextNode(text=t, metadata={"capcal": "mine", "retrieval_score": "mine too"}),
                               score=1.0) for t in texts]
        return [(n.node.metadata, n.score) for n in adapter.postprocess_nodes(nodes, query_str="topic 1")]
    from langchain_core.documents import Document

    docs = [Document(page_content=t, metadata={"capcal": "mine", "retrieval_score": "mine too"}) for t in texts]
    return [(d.metadata, d.metadata.get("relevance_score")) for d in adapter.compress_documents(docs, "topic 1")]


TEXTS = [f"passage {i} about topic {i % 3}" for i in range(5)]


def test_deepcopy_and_model_copy_share_the_clients_and_copy_the_fields(ext):
    adapter = _fake(ext, top_n=3, method="vanilla")
    for clone in (copy.deepcopy(adapter), adapter.model_copy(deep=True)):
        assert clone._reranker is adapter._reranker and (clone.top_n, clone.method) == (3, "vanilla")
        clone.top_n = 2
        assert adapter.top_n == 3 and len(_rerank(ext, clone, TEXTS)) == 2


def test_the_callers_own_metadata_entries_are_kept(ext):
    [(metadata, _), *_] = _rerank(ext, _fake(ext, top_n=2), TEXTS)
    assert metadata["capcal"] == "mine" and metadata["retrieval_score"] == "mine too"
    ours = metadata["capcal_rerank"]
    assert ours["rank"] == 1 and ours["method"]
    if ext.__name__ == "llamaindex_ext":
        assert ours[ext.RETRIEVAL_SCORE_KEY] == 1.0


def test_fields_are_checked_on_assignment_and_at_construction_with_input_error(ext):
    adapter = _fake(ext, top_n=3)
    with pytest.raises(InputError, match="top_n"):
        adapter.top_n = 0
    with pytest.raises(InputError, match="unknown method"):
        adapter.method = "best"
    assert (adapter.top_n, adapter.method) == (3, "auto")
    with pytest.raises(InputError, match="top_n"):
        ext.CapCalRerank(base_url="http://127.0.0.1:9/v1", top_n=0)
    with pytest.raises(InputError, match="top_nn"):
        ext.CapCalRerank(base_url="http://127.0.0.1:9/v1", top_nn=3)


def test_the_signature_shows_every_field(ext):
    params = inspect.signature(ext.CapCalRerank).parameters
    assert {"reranker", "api_key", "client", "top_n", "method", "alpha", "depth", "base_url", "model"} <= set(params)
    assert params["top_n"].default == 5 and "fields" not in params


def test_no_credential_in_repr_or_any_dump(ext):
    adapter = ext.CapCalRerank(base_url=CREDENTIAL_URL, api_key=SECRET, top_n=2)
    assert adapter.base_url == "http://fake.test/v1"  # user:pw@ travel as a header (issue 36)
    with pytest.raises(InputError, match="query string") as refused:  # issue 51: the routes went after the query
        ext.CapCalRerank(base_url=CREDENTIAL_URL + "?api_key=querysecret24", api_key=SECRET, top_n=2)
    assert not any(leak in str(refused.value) for leak in LEAKS)
    assert adapter.reranker.client.api_key == SECRET  # the credentials still work, they are only not shown
    shown = [repr(adapter), str(adapter), json.dumps(adapter.model_dump(mode="json", exclude={"callback_manager"}))]
    if ext.__name__ == "llamaindex_ext":
        shown += [adapter.to_json(), json.dumps(adapter.to_dict(), default=str)]
    else:
        from langchain_core.load import dumpd

        shown.append(json.dumps(dumpd(adapter)))
    for text in shown:
        assert not any(leak in text for leak in LEAKS), text
    with pytest.raises(InputError, match="never goes into a pickle"):
        pickle.dumps(adapter)


def test_from_dict_of_to_dict_round_trips_an_adapter_built_from_a_reranker():
    pytest.importorskip("llama_index.core")
    import llamaindex_ext as ext

    adapter = ext.CapCalRerank(reranker=CapCalReranker(base_url="http://127.0.0.1:9/v1", model="m"), top_n=2,
                               method="vanilla")
    again = ext.CapCalRerank.from_dict(adapter.to_dict())
    assert (again.base_url, again.model, again.top_n, again.method) == ("http://127.0.0.1:9/v1", "m", 2, "vanilla")
    assert again.reranker.client.base_url == adapter.reranker.client.base_url


def test_a_pickle_holds_no_key_and_ranks_in_a_new_process_with_the_key_from_the_environment(ext, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    adapter = ext.CapCalRerank(base_url=f"http://127.0.0.1:{port}/v1", api_key=SECRET, top_n=2, method="vanilla")
    blob = pickle.dumps(adapter)
    assert SECRET.encode() not in blob
    (tmp_path / "adapter.pkl").write_bytes(blob)
    code = (f"import pickle, sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\n"
            f"from tests.test_adapter_copies import _rerank, TEXTS\nimport {ext.__name__} as ext\n"
            f"adapter = pickle.loads(open({str(tmp_path / 'adapter.pkl')!r}, 'rb').read())\n"
            "print(len(_rerank(ext, adapter, TEXTS)), adapter.top_n, adapter.method)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CAPCAL_API_KEY", "OPENAI_API_KEY")}
    with Loopback(port=port, key=SECRET):
        refused = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode != 0 and "set CAPCAL_API_KEY" in refused.stderr
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT,  # the key with its own URL (issue 36)
                              env={**env, "CAPCAL_API_KEY": SECRET, "CAPCAL_BASE_URL": f"http://127.0.0.1:{port}/v1"},
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "2", "vanilla"]


def test_every_package_is_typed_and_licensed():
    for package in ("capcal_integrations", "llamaindex_ext", "langchain_ext"):
        assert (ROOT / package / "py.typed").is_file(), package
    assert "Apache License" in (ROOT / "LICENSE").read_text() and 'license = { text = "Apache-2.0" }' in (
        ROOT / "pyproject.toml").read_text()


def test_the_signature_ides_read_lists_every_field_of_the_settings():
    """adapter.py's ``TYPE_CHECKING`` ``__init__`` (what static tools show) names exactly the model's fields."""
    import ast

    from capcal_integrations.integrations.adapter import RerankerSettings

    tree = ast.parse((ROOT / "capcal_integrations" / "integrations" / "adapter.py").read_text())
    [settings] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RerankerSettings"]
    [stub] = [f for n in settings.body if isinstance(n, ast.If) for f in n.body if isinstance(f, ast.FunctionDef)]
    named = [a.arg for a in stub.args.kwonlyargs]
    assert named[:4] == ["reranker", "api_key", "client", "async_client"]
    assert sorted(named[4:]) == sorted(RerankerSettings.model_fields)
