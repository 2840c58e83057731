"""Run the authors' official CapCal release code on CPU, for a 1:1 comparison with this library.

    /work/vllm-venv/bin/python benchmarks/release_official.py --release-code /path/to/CapCal/code \\
        --data ../shared/data/trec-dl19-passage --queries 1 --threads 2

``--release-code`` is the ``code/`` directory of USTC-StarTeam/CapCal at commit ``RELEASE_COMMIT``
(``src/llm_utils.py``, ``util.py``, ``BaseConfig.py``, ``logger.py``, ``__init__.py``), kept outside
this repository and never committed. Its methods are called unchanged, on one model loaded once by
its own ``LLMExp_StateMachine.load_model()``:

- ``vanilla``: ``LLMExp_StateMachine.get_passage_generation`` (constrained ``[i] > [j]`` decoding);
- ``fixed``: ``LLMExp_StateMachine.get_passage_logits_apply_bias_correction`` (bias rate 1.0);
- ``adaptive``: ``LLMExp_DynamicBias.get_passage_logits_apply_bias_correction`` (its
  ``evaluate_candidates`` computes the entropy-based rate per step).

Each query's first ``--depth`` candidates (first-stage order) are shown as
``clean_passage(passage_text(doc), None)``, the exact strings this library puts in its prompts. The
placeholder is the release's command-line default (no final period), not ``ExpConfig``'s default.
``--dtype float32`` (the default) casts the loaded model to float32, which is what the release's
``from_pretrained`` call did under transformers 4.x (its requirements allow >=4.45); transformers 5
loads the checkpoint's own dtype instead (``auto``: bfloat16 here, which an AVX2-only CPU emulates
slowly). Writes ``--out`` after every reranking and skips (qid, variant) pairs already in it. Needs torch,
transformers, numpy and PyYAML (the release imports them); this library's package imports openai.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from capcal_integrations.evaluation.data import Topic, load_dataset  # noqa: E402
from capcal_integrations.prompts.render import clean_passage, passage_text  # noqa: E402

RELEASE_REPO = "USTC-StarTeam/CapCal"
RELEASE_COMMIT = "941f6d3d042c109f18c765c987d6fbcc79bc920b"
RELEASE_FILES = ("llm_utils.py", "util.py", "BaseConfig.py", "logger.py", "__init__.py")
# The release's run scripts default --same_passage_text to this (ExpConfig's own default ends in ".").
PLACEHOLDER = "This is a placeholder passage for bias testing"
VARIANTS = ("vanilla", "fixed", "adaptive")
# get_passage_generation / calculate_sequence_prob only score the labels 1-20 ("1x" and "20").
MAX_DEPTH = 20
DEFAULT_MODEL = "~/.cache/capcal/qwen2.5-coder-0.5b-instruct-q4_k_m-hf"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "release-crosscheck" / "official.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release-code", required=True, type=pathlib.Path,
                    help="the official repository's code/ directory (holds src/llm_utils.py)")
    ap.add_argument("--model-dir", default=DEFAULT_MODEL, help="a Hugging Face model directory")
    ap.add_argument("--data", required=True, type=pathlib.Path, help="a dataset dir in the shared format")
    ap.add_argument("--queries", type=int, default=1, help="the first N queries, in file order")
    ap.add_argument("--depth", type=int, default=20, help=f"candidates per query (at most {MAX_DEPTH})")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--dtype", choices=("float32", "auto"), default="float32",
                    help="float32: cast after loading (transformers 4.x behaviour); auto: as loaded")
    ap.add_argument("--verbose", action="store_true", help="also show the release's INFO log on the console")
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    if unknown := set(args.variants) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if not 1 <= args.depth <= MAX_DEPTH:
        ap.error(f"--depth must be 1-{MAX_DEPTH}: the release scores no label above {MAX_DEPTH}")
    args.model_dir = str(pathlib.Path(args.model_dir).expanduser().resolve())
    args.release_code = args.release_code.resolve()
    if not (args.release_code / "src" / "llm_utils.py").is_file():
        ap.error(f"{args.release_code} has no src/llm_utils.py")
    return args


def passages_of(topic: Topic, depth: int) -> list[str]:
    """The strings both sides show: the first ``depth`` candidates, cleaned as this library does."""
    return [clean_passage(passage_text(c.document()), None) for c in topic.candidates[:depth]]


def load_release(args: argparse.Namespace, log_dir: str) -> tuple[Any, Any]:
    """Import the release, build its config and return (fixed, adaptive) experiments sharing one model."""
    sys.path.insert(0, str(args.release_code))
    import torch
    from src.BaseConfig import ConfigBase, DataConfig, ExpConfig, LogConfig, ModelConfig
    from src.llm_utils import LLMExp_DynamicBias, LLMExp_StateMachine

    config = ConfigBase(
        model=ModelConfig(model_name=args.model_dir, local_files_only=True, device="cpu", max_length=8192,
                          cache_use=True),
        data=DataConfig(data_dir=str(args.data), output_dir=pathlib.Path(log_dir)),
        experiment=ExpConfig(num_queries=args.queries, passages_per_query=args.depth, bias_rate=1.0,
                             same_passage_text=PLACEHOLDER),
        log=LogConfig(directory=pathlib.Path(log_dir), name="release_official"),
    )
    fixed = LLMExp_StateMachine(config)
    if not args.verbose:  # the release logs every prompt at INFO; keep that in its log file only
        for handler in fixed.logger.handlers:
            if type(handler) is logging.StreamHandler:
                handler.setLevel(logging.WARNING)
    model, tokenizer, device = fixed.load_model()
    if model is None:
        raise SystemExit(f"the release could not load {args.model_dir} (see {log_dir})")
    if args.dtype == "float32":  # exact for bf16/fp16 weights: the same numbers transformers 4.x loaded
        model = fixed.model = model.to(torch.float32)
        model.config.dtype = torch.float32
    adaptive = LLMExp_DynamicBias(config)
    adaptive.model, adaptive.tokenizer, adaptive.resolved_device, adaptive.use_vllm = model, tokenizer, device, False
    adaptive.pre_cache_token_ids()
    return fixed, adaptive


def release_digests(code_dir: pathlib.Path) -> dict[str, str]:
    return {name: hashlib.sha256((code_dir / "src" / name).read_bytes()).hexdigest() for name in RELEASE_FILES}


def read_out(path: pathlib.Path, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows already written, after checking they were made with the same settings."""
    if not path.is_file():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    for key in ("release_commit", "model_dir", "model_dtype", "data", "depth", "placeholder", "release_sha256"):
        if old.get(key) != meta[key]:
            raise SystemExit(f"{path} was made with {key}={old.get(key)!r}, not {meta[key]!r}: use another --out")
    return old["rows"]


def write_out(path: pathlib.Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "rows": rows}, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    topics = load_dataset(args.data).select(args.queries).topics
    log_dir = tempfile.mkdtemp(prefix="capcal-release-")
    start = time.perf_counter()
    fixed, adaptive = load_release(args, log_dir)
    print(f"loaded {args.model_dir} ({fixed.model.dtype}) in {time.perf_counter() - start:.1f} s; "
          f"release log in {log_dir}", flush=True)
    meta = {
        "release_repo": RELEASE_REPO, "release_commit": RELEASE_COMMIT,
        "release_sha256": release_digests(args.release_code), "model_dir": args.model_dir,
        "model_dtype": str(fixed.model.dtype), "data": args.data.name, "depth": args.depth,
        "placeholder": PLACEHOLDER, "bias_rate": 1.0, "threads": args.threads,
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    rows = read_out(args.out, meta)
    done = {(r["qid"], r["variant"]) for r in rows}
    calls = {
        "vanilla": lambda q, p: fixed.get_passage_generation(q, p),
        "fixed": lambda q, p: fixed.get_passage_logits_apply_bias_correction(q, p, 1.0),
        "adaptive": lambda q, p: adaptive.get_passage_logits_apply_bias_correction(q, p, 1.0),
    }
    for topic in topics:
        passages = passages_of(topic, args.depth)
        docids = [c.docid for c in topic.candidates[:args.depth]]
        for variant in args.variants:
            if (topic.qid, variant) in done:
                continue
            start = time.perf_counter()
            ids = calls[variant](topic.query, passages)
            seconds = time.perf_counter() - start
            order = [i - 1 for i in ids]  # the release answers 1-based labels
            rows.append({"qid": topic.qid, "variant": variant, "order": order,
                         "docids": [docids[i] for i in order], "seconds": round(seconds, 2),
                         "permutation": sorted(order) == list(range(len(passages)))})
            write_out(args.out, meta, rows)
            print(f"{topic.qid} {variant:<8} {seconds:7.1f} s  {order}", flush=True)
    write_out(args.out, meta, rows)


if __name__ == "__main__":
    main()
