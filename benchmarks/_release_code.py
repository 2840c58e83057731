"""The CapCal authors' released code beside the library: loading it (``fidelity official``), and the first decoding
step of both, label by label (``fidelity first-step``).

``first-step`` is the step-0 check of the release cross-check: on the official run's DL19 queries (the first 20
BM25 candidates, the strings the ``release`` preset shows: :func:`shown`), per label 1..20 the first step's joint
probability on the real prompt (``p``), on the placeholder prompt (``q``) and the calibrated score at a fixed rate
1.0 (``p - (q - 1/20)``, the raw form), from the release (``--release-code``, in a venv with torch and transformers:
the Hugging Face weights, ``--dtype float32`` as ``official`` loads them) and from the library
(``CapCalReranker(preset="release", method="capcal", alpha=1.0)`` on the embedded llama.cpp server, Q4_K_M
weights). Each side writes its record under ``results/fidelity/records/`` (``first-step-release.json``,
``first-step-library.json``: per query three vectors of 20 floats, the choice and digests of the prompts); the run
without ``--release-code`` ranks the library's side and compares: Pearson correlation per query of each vector, the
largest absolute difference, whether the first choices agree, and whether both sides scored the same prompt (the
text, and the token ids, both ending in the release's ``[[``). ``--compare`` only compares the two records again
(neither torch nor a server), ``--smoke`` the same into a temporary folder. Each record keeps the stamp of the
command that wrote it.

What is captured from the release: ``LLMExp_StateMachine.get_passage_logits_apply_bias_correction(query, passages,
1.0)`` is called unchanged; ``evaluate_candidates`` (the class's own, called through a wrapper set on the instance)
runs unchanged under a ``sys.settrace`` hook that copies, when it returns, its locals ``real_prob``, ``same_prob``
and ``final_prob`` (label -> the joint probability, as its ``joint_prob`` forms it from ``calculate_sequence_prob``'s
softmaxes) and its answer; the wrapper then raises, which ends the ranking after its first step. The prompts' digests
are those of ``src.util.RankLLM_format``'s string and of the release tokenizer's ids for it (the arguments its method
passes), each followed by the two ``[`` the release feeds before the digits. The library's: ``steps[0]`` of a
ranking with ``depth=1`` (its first step is read whole whatever the depth), and the prompt each stream's first
request sent, its text pieces tokenized by the server as it tokenizes a mixed prompt, then detokenized.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks import _common as C
from capcal_integrations import CapCalReranker
from capcal_integrations.evaluation.data import Topic, load_dataset
from capcal_integrations.options import Options
from capcal_integrations.prompts.render import passage_text
from capcal_integrations.ranking.fitting import cleaned

RELEASE_REPO = "USTC-StarTeam/CapCal"
RELEASE_COMMIT = "941f6d3d042c109f18c765c987d6fbcc79bc920b"
RELEASE_FILES = ("llm_utils.py", "util.py", "BaseConfig.py", "logger.py", "__init__.py")
PLACEHOLDER = "This is a placeholder passage for bias testing"  # the release's scripts' default (ExpConfig's ends in ".")
MAX_DEPTH = 20  # the release scores the labels 1-20 only
RECORDS = C.RESULTS / "fidelity" / "records"
SIDES = {"release": RECORDS / "first-step-release.json", "library": RECORDS / "first-step-library.json"}
#: the library's side served by vLLM (the release's Hugging Face weights, ``$CAPCAL_VLLM_DTYPE``: float32 as the release)
VLLM_SIDE = RECORDS / "first-step-library-vllm.json"
VECTORS = {"p": "real prompt, p", "q": "placeholder prompt, q", "scores": "calibrated, rate 1.0"}


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


def shown(topic: Topic, depth: int = MAX_DEPTH) -> list[str]:
    """The passages as the ``release`` preset puts them in its prompt (the release's data loader's text, only the
    characters of the library's span markers removed); the prompt digests check that both sides saw these."""
    opts = Options().replace(preset="release")
    return [cleaned(opts, passage_text(c.document(), "release")) for c in topic.candidates[:depth]]


def _sha(x: Any) -> str:
    return hashlib.sha256((x if isinstance(x, str) else json.dumps(x)).encode()).hexdigest()


class _FirstStepTaken(Exception):
    """Raised by the capture wrapper once the release's first step has been evaluated: the ranking stops there."""


def release_first_step(exp: Any, query: str, passages: list[str]) -> dict[str, Any]:
    """The release's first step (fixed rate 1.0) on ``passages``: per label 1..n p, q and the calibrated score, as
    ``evaluate_candidates`` computed them, and its choice (0-based)."""
    code, seen, original = type(exp).evaluate_candidates.__code__, {}, exp.evaluate_candidates

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "return":  # its locals as it returns: copies, nothing written back
            seen.update({k: dict(frame.f_locals[k]) for k in ("real_prob", "same_prob", "final_prob")}, best=arg)
        return local

    def capture(*a: Any, **k: Any) -> Any:
        sys.settrace(lambda frame, event, arg: local if frame.f_code is code else None)
        try:
            original(*a, **k)
        finally:
            sys.settrace(None)
        raise _FirstStepTaken

    exp.evaluate_candidates = capture
    try:
        exp.get_passage_logits_apply_bias_correction(query, passages, 1.0)
    except _FirstStepTaken:
        pass
    finally:
        del exp.evaluate_candidates
    labels = range(1, len(passages) + 1)
    return {"p": [seen["real_prob"][i] for i in labels], "q": [seen["same_prob"][i] for i in labels],
            "scores": [seen["final_prob"][i] for i in labels], "chosen": seen["best"] - 1}


def release_side(args: argparse.Namespace, qids: list[str], stamp: dict[str, str]) -> None:
    """The release's first step on every query, written to its record after each."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    topics = {t.qid: t for t in load_dataset(args.data).topics}
    args.queries, args.depth, args.verbose = len(qids), MAX_DEPTH, False
    fixed, _ = load_release(args, tempfile.mkdtemp(prefix="capcal-release-"))
    from src.util import RankLLM_format  # the release's own, imported by load_release's sys.path

    meta = {"stamp": stamp, "release_repo": RELEASE_REPO, "release_commit": RELEASE_COMMIT,
            "release_sha256": release_digests(args.release_code), "model_dir": args.model_dir,
            "model_dtype": str(fixed.model.dtype), "placeholder": PLACEHOLDER, "threads": args.threads,
            "torch": torch.__version__, "transformers": transformers.__version__, "rows": []}
    brackets = [fixed.l_bracket_id] * 2  # the release feeds "[" and scores the digits after a second one
    for qid in qids:
        topic, start = topics[qid], time.perf_counter()
        passages = shown(topic)
        row: dict[str, Any] = {"qid": qid, "passages_sha256": _sha(passages),
                               **release_first_step(fixed, topic.query, passages)}
        row["seconds"] = round(time.perf_counter() - start, 1)
        for stream, texts in (("real", passages), ("empty", [PLACEHOLDER] * len(passages))):
            prompt = RankLLM_format(texts, topic.query, fixed.args.model.prompt_format)
            ids = fixed.tokenizer(prompt, truncation=True, max_length=fixed.args.model.max_length)["input_ids"]
            row[stream] = {"text_sha256": _sha(prompt + "[["), "tokens_sha256": _sha(ids + brackets),
                           "tokens": len(ids) + 2}
        meta["rows"].append(row)
        C.write_json(SIDES["release"], meta)
        print(f"{qid}: chosen {row['chosen'] + 1} in {row['seconds']} s", flush=True)


def _first_prompts(sent: list[Any]) -> list[list[Any]]:
    """Each stream's first prompt (its first node: the context and the prefix): each completions request's first, in
    request order; where one request holds both streams (vLLM: the same nodes of each, real first), its halves'."""
    bodies = [json.loads(r.content) for r in sent if r.url.path.endswith("/v1/completions")]
    lists = [b["prompt"] for b in bodies if isinstance(b["prompt"], list) and isinstance(b["prompt"][0], list)]
    return [lists[0][0], lists[0][len(lists[0]) // 2]] if len(lists) == 1 else [p[0] for p in lists]


def _served(http: Any, url: str, prompt: list[Any], vllm_model: str | None = None) -> tuple[str, list[int]]:
    """A mixed prompt as the server reads it: its text pieces tokenized (special text parsed, a BOS only where the
    model asks for one, on the first piece), and the whole detokenized; on vLLM (``vllm_model``) token ids only,
    detokenized by its ``/detokenize``."""
    if vllm_model is not None:
        ids = [int(i) for i in prompt]
        return http.post(f"{url}/detokenize", json={"model": vllm_model, "tokens": ids}).raise_for_status().json()["prompt"], ids
    ids: list[int] = []
    for k, piece in enumerate(prompt):
        if isinstance(piece, str):
            answer = http.post(f"{url}/tokenize", json={"content": piece, "add_special": k == 0, "parse_special": True})
            ids += answer.raise_for_status().json()["tokens"]
        else:
            ids.append(piece)
    return http.post(f"{url}/detokenize", json={"tokens": ids}).raise_for_status().json()["content"], ids


def library_side(args: argparse.Namespace, qids: list[str], stamp: dict[str, str]) -> None:
    import httpx
    import openai

    topics = {t.qid: t for t in load_dataset(args.data).topics}
    sent: list[Any] = []
    with C.server(args.url, engine=args.engine) as ep:
        key = {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}
        root = ep.base_url.rstrip("/").removesuffix("/v1")
        http = httpx.Client(event_hooks={"request": [sent.append]}, timeout=3600)
        rr = CapCalReranker(client=openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key or "x", http_client=http,
                                                 max_retries=0), model=ep.model, preset="release", timeout=900)
        rr = rr.with_options(method="capcal", alpha=1.0, depth=1)
        caps, out = rr.capabilities(), httpx.Client(headers=key, timeout=600)
        vllm = caps.server == "vllm"
        meta: dict[str, Any] = {"stamp": stamp, "model": caps.model, "server": caps.server or caps.kind.name, "rows": [],
                                "weights": f"the release's Hugging Face weights, served as {_vllm_dtype()}" if vllm
                                else "Q4_K_M"}
        for qid in qids:
            topic, start = topics[qid], time.perf_counter()
            sent.clear()
            step = rr.rerank(topic.query, [c.document() for c in topic.candidates[:MAX_DEPTH]]).steps[0]
            assert list(step.candidates) == list(range(MAX_DEPTH)), step.candidates
            row: dict[str, Any] = {"qid": qid, "passages_sha256": _sha(shown(topic)), "p": list(step.p),
                                   "q": list(step.q or ()), "scores": list(step.scores), "chosen": step.chosen,
                                   "seconds": round(time.perf_counter() - start, 1)}
            prompts = _first_prompts(sent)
            assert len(prompts) == 2, f"{len(prompts)} first-step requests, not one a stream"
            served = (_served(out, root, p, caps.model if vllm else None) for p in prompts)
            for text, ids in served:  # the empty stream's holds the placeholder
                row["empty" if PLACEHOLDER in text else "real"] = {"text_sha256": _sha(text), "tokens_sha256": _sha(ids),
                                                                   "tokens": len(ids)}
            meta["rows"].append(row)
            print(f"{qid}: chosen {step.chosen + 1} in {row['seconds']} s", flush=True)
    C.write_json(_library_record(args), meta)


def _library_record(args: argparse.Namespace) -> pathlib.Path:
    return VLLM_SIDE if args.engine == "vllm" else SIDES["library"]


def _vllm_dtype() -> str:
    from capcal_integrations.server.vllm import default_dtype

    return default_dtype()


def compare(rel: dict[str, Any], lib: dict[str, Any]) -> dict[str, Any]:
    """One query's first steps side by side: per vector Pearson r and the largest absolute difference."""
    row: dict[str, Any] = {"qid": rel["qid"], "same_passages": rel["passages_sha256"] == lib["passages_sha256"],
                           "chosen": [rel["chosen"], lib["chosen"]]}
    for v in VECTORS:
        row[v] = {"r": statistics.correlation(rel[v], lib[v]), "max_abs": max(abs(a - b) for a, b in zip(rel[v], lib[v]))}
    for stream in ("real", "empty"):
        row[stream] = {k: rel[stream][k] == lib[stream][k] for k in ("text_sha256", "tokens_sha256")}
        row[stream]["tokens"] = [rel[stream]["tokens"], lib[stream]["tokens"]]
    return row


def run_of(release: dict[str, Any], library: dict[str, Any], name: str, stamp: dict[str, str],
           official_first: dict[str, int]) -> dict[str, Any]:
    libs = {r["qid"]: r for r in library["rows"]}
    rows = [compare(r, libs[r["qid"]]) for r in release["rows"] if r["qid"] in libs]
    summary = [[VECTORS[v], f"{min(r[v]['r'] for r in rows):.4f}", f"{statistics.fmean(r[v]['r'] for r in rows):.4f}",
                f"{max(r[v]['max_abs'] for r in rows):.4f}"] for v in VECTORS]
    same = {s: sum(r[s]["text_sha256"] for r in rows) for s in ("real", "empty")}
    tokens = {s: sum(r[s]["tokens_sha256"] for r in rows) for s in ("real", "empty")}
    agree = sum(a == b for a, b in (r["chosen"] for r in rows))
    body = [[r["qid"], *(f"{r[v]['r']:.4f}" for v in VECTORS), " / ".join(f"{r[v]['max_abs']:.4f}" for v in VECTORS),
             f"{r['chosen'][0] + 1} / {r['chosen'][1] + 1}", official_first.get(r["qid"], "–"),
             "yes" if r["real"]["text_sha256"] and r["empty"]["text_sha256"] else "no",
             " / ".join(f"{'same' if r[s]['tokens_sha256'] else 'differ'} ({r[s]['tokens'][0]} / {r[s]['tokens'][1]})"
                        for s in ("real", "empty"))] for r in rows]
    return {"name": name, "stamp": stamp, "title": "The first decoding step: the `release` preset against the authors' code",
            "notes": [f"Release: `{release['release_repo']}` at `{release['release_commit']}`, "
                      "`LLMExp_StateMachine.get_passage_logits_apply_bias_correction(query, passages, 1.0)` called "
                      "unchanged, its `evaluate_candidates`' `real_prob`, `same_prob` and `final_prob` copied as it "
                      f"returns (the ranking stopped there), on CPU (torch {release['torch']}, transformers "
                      f"{release['transformers']}), Qwen2.5-Coder-0.5B-Instruct as {release['model_dtype']} Hugging "
                      "Face weights (the packaged Q4_K_M GGUF dequantised to bfloat16 by `server/convert_hf.py`: the "
                      "same weights, rounded to bfloat16). Library: `CapCalReranker(preset=\"release\", "
                      "method=\"capcal\", alpha=1.0)`'s "
                      f"`steps[0]` (read whole) on the embedded {library['server']} server, `{library['model']}` "
                      f"({library.get('weights', 'Q4_K_M')}). The official run's {len(rows)} DL19 queries, the first 20 "
                      f"BM25 candidates as the preset shows them, placeholder \"{release['placeholder']}\"; same "
                      "passages on both sides: "
                      f"{sum(r['same_passages'] for r in rows)} of {len(rows)}.",
                      "Per label 1-20: p, the joint probability of the label on the real prompt; q, on the placeholder "
                      "prompt; the calibrated score p - 1.0 (q - 1/20) (the raw form, not renormalised). r: Pearson "
                      "correlation over the 20 labels; max |diff|: the largest absolute difference (p / q / calibrated). "
                      f"First choice agrees on {agree} of {len(rows)} queries. The prompt text (ending in the release's "
                      f"`[[`) identical on {same['real']} of {len(rows)} real and {same['empty']} of {len(rows)} "
                      f"placeholder prompts; token ids identical on {tokens['real']} and {tokens['empty']}.",
                      "Records: " + "; ".join(f"{side} `{r['stamp']['command']}` at commit {r['stamp']['commit']}, "
                                              f"{r['stamp']['date']}" for side, r in (("release", release),
                                                                                      ("library", library))) + ".",
                      "*official run's first*: the first place of the `fixed` ranking in `records/official.json` (the "
                      "same code run whole on 2026-11-30; its inputs were `clean_passage`d, which differ from the "
                      "preset's strings where a passage holds an identifier look-alike such as `[1]`)."],
            "tables": [{"columns": ["first step", "min r", "mean r", "max |diff|"], "rows": summary},
                       {"columns": ["query", "r: p", "r: q", "r: calibrated", "max |diff| (p / q / calibrated)",
                                    "first choice: release / library", "official run's first", "same prompt text",
                                    "token ids: real / placeholder (release / library count)"], "rows": body}],
            "data": {"rows": rows, "release": {k: v for k, v in release.items() if k != "rows"},
                     "library": {k: v for k, v in library.items() if k != "rows"}}}


def add_subcommand(sub: Any) -> None:
    fs = C.subcommand(sub, "first-step", "the first decoding step, label by label, against the authors' code")
    fs.add_argument("--release-code", type=pathlib.Path, help="the release's code/: run its side (torch venv)")
    fs.add_argument("--model-dir", default="~/.cache/capcal/qwen2.5-coder-0.5b-instruct-q4_k_m-hf")
    fs.add_argument("--dtype", choices=("float32", "auto"), default="float32")
    fs.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    fs.add_argument("--data", type=pathlib.Path, help="a dataset folder (default ../shared/data/trec-dl19-passage)")
    fs.add_argument("--url", help="a running server with the 0.5B model (default: start one)")
    fs.add_argument("--engine", default="llamacpp", choices=("llamacpp", "vllm"),
                    help="the library's server: llama.cpp (Q4_K_M) or vLLM with the release's Hugging Face weights "
                         "(set CAPCAL_VLLM_DTYPE=float32 for the release's arithmetic); its own record")
    fs.add_argument("--compare", action="store_true", help="only compare the two records again (no server, no torch)")


def first_step(args: argparse.Namespace, argv: list[str] | None, official: pathlib.Path) -> int:
    rows = json.loads(official.read_text())["rows"]
    qids = list(dict.fromkeys(r["qid"] for r in rows))
    args.data = args.data or (None if args.smoke else C.need_data("trec-dl19-passage"))
    if args.release_code:
        args.model_dir = str(pathlib.Path(args.model_dir).expanduser().resolve())
        args.release_code = args.release_code.resolve()
        release_side(args, qids, C.stamp("fidelity", argv))
        return 0
    if not (args.smoke or args.compare):
        library_side(args, qids, C.stamp("fidelity", argv))
    sides = (SIDES["release"], _library_record(args))
    if not all(p.is_file() for p in sides):
        print(f"skipped: no {' or '.join(str(p) for p in sides if not p.is_file())}", file=sys.stderr)
        return 0
    first = {r["qid"]: r["order"][0] + 1 for r in rows if r["variant"] == "fixed"}
    release, library = (json.loads(p.read_text()) for p in sides)
    name = "first-step" + ("-vllm" if args.engine == "vllm" else "") + ("-smoke" if args.smoke else "")
    run = run_of(release, library, args.name or name, C.stamp("fidelity", argv), first)
    print(f"wrote {C.save('fidelity', run, C.out_dir('fidelity', args))}")
    return 0
