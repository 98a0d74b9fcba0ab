#!/usr/bin/env python3
"""The tiny reference checkpoints as GGUF files, written by llama.cpp's own converter.

What it does
------------
For every ``tiny-*/`` HF directory that ``tiny_models.py`` wrote, runs llama.cpp's
``convert_hf_to_gguf.py`` machinery (its model classes and its vendored ``gguf-py``) with
``--outtype f32`` and writes ``gguf/<name>.gguf``. The converter decides every tensor name, the
Q/K row permutation of the ``llama`` architecture, Llama 3's ``rope_freqs.weight`` divisors,
the metadata keys and their values, so an importer bug that mirrors our own test writer's
cannot hide. The checkpoints carry no tokenizer (their logits are taken from token ids), so
the converter's ``set_vocab`` is replaced by the one thing it cannot derive: a placeholder
``gpt2`` vocabulary of the model's size (``placeholder_vocab``) with the
pre-tokenizer llama.cpp names for the family. Everything else is the converter's.

``hf_logits.json`` of each directory is the reference for both file formats
(``tests/tests/hf_reference.rs``).

How to rerun
------------
    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d /tmp/lcp
    tar -C /tmp/lcp -xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz
    python tests/reference/tiny_gguf.py /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp

(needs torch, numpy, safetensors; ``--only NAME`` converts one directory). Rust tests only read
the committed files; they never run this script.
"""

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(os.path.dirname(os.path.abspath(__file__)))
NAMES = ["tiny-gqa", "tiny-mqa", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-llama3"]


def converter(llama_cpp: Path):
    """llama.cpp's converter package and its own gguf-py, imported from the source tree."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import gguf  # noqa: F401  (the vendored one, first on the path)
    import conversion

    return conversion, gguf


def placeholder_vocab(model, gguf, arch: str) -> None:
    """The vocabulary the tiny checkpoints lack: `vocab_size` tokens ("a", "b", "ab", then
    "t3", "t4", ...) and the one merge "a b" (llama.cpp requires the merges key of a `gpt2`
    vocabulary, and an empty array is not written)."""
    n = model.hparams["vocab_size"]
    w = model.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch.startswith("Qwen") else "llama-bpe")
    w.add_token_list(["a", "b", "ab"] + [f"t{i}" for i in range(3, n)])
    w.add_token_types([gguf.TokenType.NORMAL] * n)
    w.add_token_merges(["a b"])


def convert(conversion, gguf, src: Path, dst: Path) -> None:
    import torch

    hparams = conversion.ModelBase.load_hparams(src, False)
    arch = conversion.get_model_architecture(hparams, conversion.ModelType.TEXT)
    cls = conversion.get_model_class(arch)

    with torch.inference_mode():
        model = cls(src, gguf.LlamaFileType.ALL_F32, dst, eager=True, model_name=src.name)
        # The converter's model, but for the missing tokenizer.
        model.set_vocab = lambda: placeholder_vocab(model, gguf, arch)
        model.write()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("llama_cpp", type=Path, help="llama.cpp source (the sdist's vendor/llama.cpp)")
    ap.add_argument("--only", choices=NAMES)
    ap.add_argument("--out-dir", type=Path, default=HERE / "gguf")
    args = ap.parse_args()
    conversion, gguf = converter(args.llama_cpp)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in [args.only] if args.only else NAMES:
        dst = args.out_dir / f"{name}.gguf"
        convert(conversion, gguf, HERE / name, dst)
        print(json.dumps({"name": name, "gguf": str(dst), "bytes": dst.stat().st_size}))


if __name__ == "__main__":
    main()
