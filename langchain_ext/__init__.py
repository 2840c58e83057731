"""LangChain adapter for CapCal: ``CapCalRerank``, a document compressor.

Install with ``pip install "capcal-integrations[langchain]"``.

>>> from langchain_ext import CapCalRerank
>>> # retriever = ContextualCompressionRetriever(base_compressor=CapCalRerank(top_n=5), base_retriever=bm25)
"""

from .compressor import DETAILS_KEY, OWN_SCORE_KEY, RELEVANCE_SCORE_KEY, CapCalRerank

__all__ = ["CapCalRerank", "RELEVANCE_SCORE_KEY", "OWN_SCORE_KEY", "DETAILS_KEY"]
