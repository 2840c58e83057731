"""Convert a GGUF model to a Hugging Face safetensors folder that vLLM can serve.

Run as a script by the Python that has vLLM (it brings torch and transformers; ``gguf`` is needed
too): ``python convert_hf.py MODEL.gguf OUT_DIR``. It imports nothing from capcal_integrations, so
that Python need not have the library installed. The weights are dequantised to bfloat16; the
tokenizer and its chat template are kept. No network access: ``HF_HUB_OFFLINE=1``. ``OUT_DIR`` must be
new or empty: files of another conversion are never mixed in (the caller, :func:`.vllm.hf_model_dir`,
converts into a fresh temporary folder and renames it into place).
"""

from __future__ import annotations

import os
import pathlib
import sys
import time


def convert(gguf: pathlib.Path, out: pathlib.Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"convert_hf: {out} is not empty; convert into a new folder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    # the loaded model remembers its GGUF quantisation, and save_pretrained refuses to write that back
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    sys.stderr.write(f"converted {gguf.name} to {out} in {time.monotonic() - start:.0f} s\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python convert_hf.py MODEL.gguf OUT_DIR")
    convert(pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]))
