"""A small RAG chat with LangChain: each turn, a history-aware retriever rewrites the question, BM25
retrieves candidates, CapCal reranks them, and the chat model answers from the top passages.

    python examples/chat_app.py                      # two scripted turns
    python examples/chat_app.py --interactive        # your own turns (an empty line ends)
    python examples/chat_app.py --hosted             # the local model shown as a hosted chat-only API
    python examples/chat_app.py --conversation       # eight scripted turns, then the reranking's p50/p95
    python examples/chat_app.py --deadline 2         # each reranking answers within 2 s (partial if need be)
    python examples/chat_app.py --decision d.json    # a content-check decision taken before (no deciding turns)
    python examples/chat_app.py --guard none         # calibrate every turn, whatever the content check would say

The endpoint is $CAPCAL_BASE_URL (any OpenAI-compatible API with log-probabilities: a vLLM or
llama.cpp server, or a hosted one with $OPENAI_API_KEY) and $CAPCAL_MODEL; without it this starts
the embedded llama.cpp server. ``--hosted`` starts it with assistant prefill off, behind a gateway
that exposes only what hosted chat APIs do (capcal_integrations.server.HostedGateway).

The reranker is built from the chat model itself (``CapCalRerank.from_llm(llm)``: same endpoint, key,
timeout and HTTP client) and decodes only the ``--top-n`` places that go into the context (its ``depth``
follows ``top_n``). Per turn it prints the standalone question, which passages went into the context and
in what order, the method CapCal ran (``auto`` picks ``capcal`` where the endpoint continues an assistant
prefix and ``first-token-capcal`` where it cannot), and what the reranking cost: its wall time, requests
and tokens, read from the callback LangChain's usage tools read (the ``capcal`` chat-model run's end).

Needs: pip install "capcal-integrations[langchain,embedded]" langchain-classic langchain-openai bm25s
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import time

from langchain_classic.chains import create_history_aware_retriever, create_retrieval_chain
from langchain_classic.chains.combine_documents import create_stuff_documents_chain
from langchain_classic.retrievers.contextual_compression import ContextualCompressionRetriever
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import LLMResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_openai import ChatOpenAI
from langchain_retriever import DATA, BM25Retriever, served_model, snippet  # the example beside this one

from capcal_integrations.content_check.rules import DEFAULT_RULE
from capcal_integrations.options import Options
from capcal_integrations.server import EmbeddedServer, HostedGateway
from langchain_ext import CapCalRerank

TURNS = ["what is wifi vs bluetooth", "which of the two uses less power?"]
CONVERSATION = [*TURNS, "how far does it reach?", "can it connect headphones?", "what about speakers at home?",
                "is it secure?", "how do I pair a new device?", "what if pairing fails?"]
CONDENSE = ChatPromptTemplate.from_messages([
    MessagesPlaceholder("chat_history"),
    ("human", "{input}"),
    ("human", "Rewrite the last question as one standalone search query. Answer with the query only."),
])
ANSWER = ChatPromptTemplate.from_messages([
    ("system", "Answer in one or two sentences, using only this context:\n\n{context}"),
    MessagesPlaceholder("chat_history"),
    ("human", "{input}"),
])


class Searches(BaseCallbackHandler):
    """Records the queries the retrievers were called with (the rewritten, standalone question)."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def on_retriever_start(self, serialized: object, query: str, **kwargs: object) -> None:
        self.queries.append(query)


class RerankCost(BaseCallbackHandler):
    """What each reranking cost, from the end of the reranker's ``capcal`` chat-model run (where LangSmith and
    LangChain's usage callbacks read it): its summary carries the wall time, requests and tokens."""

    def __init__(self) -> None:
        self.summaries: list[dict] = []

    def on_llm_end(self, response: LLMResult, **kwargs: object) -> None:
        if response.llm_output and "capcal" in response.llm_output:
            self.summaries.append(response.llm_output["capcal"])


def chat(base_url: str, turns: list[str] | None, candidates: int, top_n: int, max_tokens: int,
         deadline: float | None = None, **options: object) -> None:
    documents = [Document(page_content=row["text"], id=row["docid"])
                 for row in map(json.loads, DATA.open(encoding="utf-8"))]
    llm = ChatOpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
                     model=served_model(base_url), max_tokens=max_tokens, temperature=0)
    reranker = CapCalRerank.from_llm(llm, top_n=top_n, deadline=deadline, **options)  # method auto; depth follows top_n
    retriever = ContextualCompressionRetriever(base_compressor=reranker,
                                               base_retriever=BM25Retriever(documents=documents, k=candidates))
    chain = create_retrieval_chain(create_history_aware_retriever(llm, retriever, CONDENSE),
                                   create_stuff_documents_chain(llm, ANSWER))
    history: list = []
    costs = RerankCost()
    for turn, question in enumerate(_questions(turns), 1):
        started, searches = time.perf_counter(), Searches()
        result = chain.invoke({"input": question, "chat_history": history}, config={"callbacks": [searches, costs]})
        ranking = reranker.last_ranking
        print(f"\nturn {turn}: {question}\n  search: {searches.queries[0].strip()!r}\n"
              f"  context (BM25 top {candidates} reranked by CapCal: {ranking.method}, "
              f"{ranking.usage.requests} requests, {time.perf_counter() - started:.0f} s):")
        for rank, doc in enumerate(result["context"], 1):
            details = doc.metadata["capcal"]
            print(f"    {rank}. {doc.id:>8}  score {doc.metadata.get('relevance_score', float('nan')):.3f}  "
                  f"(BM25 rank {details['input_rank']:2d})  {snippet(doc.page_content)}")
        for note in ranking.notes:
            print(f"  note: {note}")
        print(f"  reranking: {_cost(costs.summaries[-1])}")
        print(f"  answer: {result['answer'].strip()}")
        history += [HumanMessage(question), AIMessage(result["answer"])]
    if len(costs.summaries) > 1:
        print(f"\nreranking over {len(costs.summaries)} turns: {_percentiles(costs.summaries)}")


def _cost(summary: dict) -> str:
    """One turn's reranking: ``0.84 s, 4 requests, 2345 prompt + 8 completion tokens (1200 cached), ...``."""
    usage, decoded, n = summary["usage"], summary["decoded"], summary["passages"]
    places = f"{n} of {n}" if decoded is None else f"{decoded} of {n}"
    deciding = any(n.startswith("content check deciding") for n in summary["notes"])
    outcome = (f"kept in BM25 order ({'content check deciding, read in the background' if deciding else 'no content signal'})"
               if summary["kept_given_order"] else
               f"{places} places decoded{', cut by the deadline' if summary['partial'] else ''}")
    return (f"{summary['seconds']:.2f} s, {usage['requests']} requests, {usage['prompt_tokens']} prompt + "
            f"{usage['completion_tokens']} completion tokens ({usage['cached_tokens']} cached), {outcome}")


def _percentiles(summaries: list[dict]) -> str:
    """p50 and p95 (nearest rank) of the rerankings' wall time and prompt tokens."""
    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    seconds = [s["seconds"] for s in summaries]
    tokens = [s["usage"]["prompt_tokens"] for s in summaries]
    return (f"time p50 {p(seconds, .5):.2f} s, p95 {p(seconds, .95):.2f} s (mean {statistics.fmean(seconds):.2f} s); "
            f"prompt tokens p50 {p(tokens, .5):.0f}, p95 {p(tokens, .95):.0f}")


def _questions(turns: list[str] | None):
    if turns is not None:
        yield from turns
        return
    while question := input("\nyou> ").strip():
        yield question


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", nargs="+", default=TURNS, help="scripted questions (default: two turns)")
    parser.add_argument("--interactive", action="store_true", help="read the questions from the terminal")
    parser.add_argument("--hosted", action="store_true",
                        help="without $CAPCAL_BASE_URL: the embedded model behind a hosted-API gateway")
    parser.add_argument("--candidates", type=int, default=10, help="passages BM25 retrieves (default 10)")
    parser.add_argument("--top-n", type=int, default=3, help="passages in the context (default 3)")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length (default 64)")
    parser.add_argument("--conversation", action="store_true", help="eight scripted turns (p50/p95 at the end)")
    parser.add_argument("--deadline", type=float, default=None, help="seconds each reranking may take (default: none)")
    parser.add_argument("--guard", default=DEFAULT_RULE, help=f"the content check's rule (default {DEFAULT_RULE!r}, "
                        "the library's), 'content', or none: calibrate every turn")
    parser.add_argument("--decision", default=None, help="a saved content-check decision (its JSON file)")
    args = parser.parse_args()
    options = {"guard": Options.parse("guard", args.guard), **({"decision": args.decision} if args.decision else {})}
    with contextlib.ExitStack() as stack:
        base_url = os.environ.get("CAPCAL_BASE_URL")
        if not base_url:
            print("starting the embedded llama.cpp server (the first start assembles the model)...", flush=True)
            base_url = stack.enter_context(EmbeddedServer(prefill=not args.hosted)).base_url
            if args.hosted:
                base_url = stack.enter_context(HostedGateway(base_url, "chat")).base_url
                print(f"hosted-API gateway at {base_url}: chat completions only, top_logprobs <= 20", flush=True)
        turns = None if args.interactive else CONVERSATION if args.conversation else args.turns
        chat(base_url, turns, args.candidates, args.top_n, args.max_tokens, args.deadline, **options)


if __name__ == "__main__":
    main()
