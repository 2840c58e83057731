"""What the model reads, free of I/O but for one module: ``render.py`` (prompt templates, identifiers,
passage cleaning, rendering to chat messages or to text: the release's raw tags, ChatML, Llama 3,
Gemma), ``untrusted.py`` (a prompt as a skeleton with markers plus untrusted spans; known control text
neutralised) and ``files.py``, the one module that reads files: the chat template a ``prompt`` option
names (checked, rendered with Jinja, its declared special tokens) and the text of a saved ``decision``.
"""
