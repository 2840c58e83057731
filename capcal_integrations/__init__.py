"""capcal-integrations: position-bias-calibrated LLM listwise reranking (CapCal) for RAG pipelines.

>>> from capcal_integrations import CapCalReranker
>>> # rr = CapCalReranker(base_url="http://127.0.0.1:8080/v1")
>>> # rr.rerank("how long do fleas live", passages).order
"""

from . import _moved
from . import errors as _errors
from .calibration.formulas import adaptive_alpha, calibrate, calibrate_log, entropy
from .errors import *  # noqa: F403 (the whole error tree is public)
from .options import METHODS, Options
from .prompts.render import DEFAULT_PLACEHOLDER, RANK_GPT, RANK_ZEPHYR, PromptTemplate
from .ranking.orders import borda, kendall_tau, windows
from .reranker import CapCalReranker
from .tuning import AlphaChoice, achoose_alpha, choose_alpha
from .types import Capabilities, Document, Ranking, Step, Usage

__version__ = "0.1.0"

_moved.install()  # the module paths before the folders still import, with a FutureWarning

__all__ = [
    "CapCalReranker",
    "choose_alpha",
    "achoose_alpha",
    "AlphaChoice",
    "Document",
    "Ranking",
    "Step",
    "Usage",
    "Capabilities",
    "Options",
    "PromptTemplate",
    "RANK_ZEPHYR",
    "RANK_GPT",
    "DEFAULT_PLACEHOLDER",
    "METHODS",
    "windows",
    "borda",
    "kendall_tau",
    "calibrate",
    "calibrate_log",
    "adaptive_alpha",
    "entropy",
    *_errors.__all__,
]
