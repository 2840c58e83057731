"""What the model reads, free of I/O but for one module: ``render.py`` (prompt templates, identifiers,
passage cleaning, rendering to chat messages or to text: the release's raw tags, ChatML, Llama 3,
Gemma), ``untrusted.py`` (a prompt as a skeleton with markers plus untrusted spans; known control text
neutralised) and ``files.py``, the one module that reads files: the chat template a ``prompt`` option
names (checked, rendered with Jinja, its declared special tokens) and the text of a saved ``decision``.
"""


def __getattr__(name: str) -> object:  # the names of the module this folder replaced (capcal_integrations.prompts)
    from .._moved import forwarded

    return forwarded(__name__, __name__, f"{__name__}.render", name)
