"""LlamaIndex adapter for CapCal: ``CapCalRerank``, a node postprocessor.

Install with ``pip install "capcal-integrations[llamaindex]"``.

>>> from llamaindex_ext import CapCalRerank
>>> # engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[CapCalRerank(top_n=5)])
"""

from .postprocessor import DETAILS_KEY, RETRIEVAL_SCORE_KEY, CapCalRerank

__all__ = ["CapCalRerank", "RETRIEVAL_SCORE_KEY", "DETAILS_KEY"]
