"""What the framework adapters share: ``adapter.py``, the pydantic settings generated from
:class:`~capcal_integrations.options.Options`, the reranker built from them and the metadata keys, and
``llm_clients.py``, the ``openai`` clients inside a framework's LLM object (``from_llm``).

The adapters themselves stay top-level packages (``llamaindex_ext``, ``langchain_ext``), each one module
inheriting ``adapter.RerankerSettings``; nothing in the core imports this folder.
"""
