#!/usr/bin/env python3
"""Write a random-weight GGUF of any Llama shape with a real tokenizer.

The file is a plain llama.cpp GGUF (``general.architecture = llama``, the standard
``llama.*`` keys and tensor names) whose weights are random, so that amk, llama.cpp and
HuggingFace transformers can all load and time a model of a shape for which no checkpoint
is at hand (the benchmarks only need the shape; the text it generates is garbage).

Tokenizer: every ``tokenizer.*`` key is copied, with its GGUF type, from ``--tokenizer-from``
(by default the SmolLM2-135M-Instruct GGUF that ``amk`` fetches), and the vocabulary size is
that tokenizer's: ``token_embd.weight`` (and ``output.weight`` when untied) has one row per
token. A ``llama-3.2-1b`` shape therefore has 49 152 rows of embedding here, not the real
model's 128 256; the decoder layers are the real model's.

Weights: normal with standard deviation ``--std`` (0.02) for every matrix, 1.0 for the norm
weights; drawn from a seeded numpy generator in row chunks of at most ``--chunk-mib`` MiB
and streamed to the file, so memory stays bounded whatever the model size. ``--dtype`` bf16
writes GGML type BF16 (the float32 values rounded to nearest even, stored as their top 16
bits), f16 and f32 write F16 and F32; norm weights are always F32, as llama.cpp's converter
writes them.

Q/K layout: llama.cpp's HF->GGUF converter permutes the rows of ``attn_q`` and ``attn_k``
(each head's rotate-half pairs become adjacent pairs) and every GGUF reader undoes it when it
wants HF's layout. Random weights have no layout to preserve, so nothing is permuted here;
the file still loads everywhere, and a step costs the same either way.

Needs the ``gguf`` package (0.10 or later; the GGUFWriter writes the header, the metadata and
the tensor index, and the tensor data is appended by this script following the GGUF layout:
the data section starts aligned to ``general.alignment`` (32), every tensor is padded to it)
and numpy.

Exit status: 0 written, 1 failed while writing, 2 bad usage or missing package.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Iterator

try:
    import numpy as np
except ModuleNotFoundError:  # --help and --selftest's pure parts work without numpy
    np = None  # type: ignore[assignment]

DEFAULT_TOKENIZER = Path.home() / ".cache" / "amk" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTEXT_LENGTH = 4096
DEFAULT_STD = 0.02
DEFAULT_CHUNK_MIB = 64
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


class GgufError(Exception):
    """An expected failure: reported as one message, never as a traceback."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A Llama decoder's dimensions (the vocabulary comes from the tokenizer)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def problems(self) -> list[str]:
        """Why this shape is not a valid Llama decoder (empty when it is)."""
        out = []
        for field in ("hidden", "layers", "heads", "kv_heads", "ffn"):
            if getattr(self, field) < 1:
                out.append(f"{field} must be positive")
        if out:
            return out
        if self.hidden % self.heads:
            out.append(f"hidden ({self.hidden}) is not a multiple of heads ({self.heads})")
        elif self.head_dim % 2:
            out.append(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.heads % self.kv_heads:
            out.append(f"heads ({self.heads}) is not a multiple of kv heads ({self.kv_heads})")
        if self.rope_theta <= 0 or self.rms_eps <= 0:
            out.append("rope theta and rms eps must be positive")
        return out

    def tensors(self, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
        """Every tensor as (GGUF name, numpy shape (rows, columns)), in file order."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, h))]
        for i in range(self.layers):
            b = f"blk.{i}."
            out += [
                (b + "attn_norm.weight", (h,)),
                (b + "attn_q.weight", (self.heads * self.head_dim, h)),
                (b + "attn_k.weight", (kv, h)),
                (b + "attn_v.weight", (kv, h)),
                (b + "attn_output.weight", (h, self.heads * self.head_dim)),
                (b + "ffn_norm.weight", (h,)),
                (b + "ffn_gate.weight", (self.ffn, h)),
                (b + "ffn_up.weight", (self.ffn, h)),
                (b + "ffn_down.weight", (h, self.ffn)),
            ]
        out.append(("output_norm.weight", (h,)))
        if not self.tied:
            out.append(("output.weight", (vocab, h)))
        return out

    def parameters(self, vocab: int) -> int:
        return sum(math.prod(shape) for _, shape in self.tensors(vocab))


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("smollm2-135m", 576, 30, 9, 3, 1536, 100000.0, 1e-5, True),
        Shape("llama-3.2-1b", 2048, 16, 32, 8, 8192, 500000.0, 1e-5, True),
        Shape("llama-3.1-8b", 4096, 32, 32, 8, 14336, 500000.0, 1e-5, False),
        Shape("tinyllama-1.1b", 2048, 22, 32, 4, 5632, 10000.0, 1e-5, False),
    )
}


# --------------------------------------------------------------------------------------------
# Random values
# --------------------------------------------------------------------------------------------


def f32_to_bf16_bits(x: "np.ndarray") -> "np.ndarray":
    """Round float32 values to bfloat16 (nearest, ties to even); returns the uint16 bits.

    Finite inputs only (random normal values are).
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def encode(values: "np.ndarray", dtype: str) -> bytes:
    if dtype == "bf16":
        return f32_to_bf16_bits(values).tobytes()
    if dtype == "f16":
        return values.astype(np.float16).tobytes()
    return values.astype(np.float32).tobytes()


def row_chunks(rows: int, cols: int, chunk_bytes: int) -> Iterator[int]:
    """Row counts of the chunks one matrix is generated in (float32 working size)."""
    per_chunk = max(1, chunk_bytes // (4 * max(cols, 1)))
    done = 0
    while done < rows:
        n = min(per_chunk, rows - done)
        yield n
        done += n


def pad_to(f: BinaryIO, alignment: int) -> None:
    pad = -f.tell() % alignment
    if pad:
        f.write(b"\0" * pad)


# --------------------------------------------------------------------------------------------
# The tokenizer's metadata
# --------------------------------------------------------------------------------------------


def read_tokenizer(path: Path) -> tuple[list[tuple[str, Any, Any, Any]], int]:
    """The ``tokenizer.*`` fields of a GGUF as (key, value, type, array element type), and
    the vocabulary size (the number of ``tokenizer.ggml.tokens``).

    Strings are kept as raw bytes, so they are written back byte for byte.
    """
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise GgufError(f"--tokenizer-from {path}: cannot read it as GGUF: {exc}") from None
    array, string = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING
    out: list[tuple[str, Any, Any, Any]] = []
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == array:
            if len(field.types) != 2:
                raise GgufError(f"{path}: {key} is a nested array; not supported")
            sub = field.types[1]
            if sub == string:
                value: Any = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
            if not value:
                continue  # GGUF cannot hold an empty array's element type faithfully
            out.append((key, value, vtype, sub))
        elif vtype == string:
            out.append((key, bytes(field.parts[field.data[0]]), vtype, None))
        else:
            out.append((key, field.parts[field.data[0]].tolist()[0], vtype, None))
    if not out:
        raise GgufError(f"--tokenizer-from {path}: no tokenizer.* keys in it")
    if vocab == 0:
        raise GgufError(f"--tokenizer-from {path}: no tokenizer.ggml.tokens in it")
    return out, vocab


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_gguf(
    out: Path,
    shape: Shape,
    tokenizer: list[tuple[str, Any, Any, Any]],
    vocab: int,
    dtype: str,
    seed: int,
    std: float,
    chunk_mib: int,
    name: str,
    context: int = CONTEXT_LENGTH,
) -> int:
    """Write the file (via a temporary file renamed into place); returns its size in bytes."""
    import gguf

    qtype = {"bf16": gguf.GGMLQuantizationType.BF16, "f16": gguf.GGMLQuantizationType.F16,
             "f32": gguf.GGMLQuantizationType.F32}[dtype]
    ftype = {"bf16": gguf.LlamaFileType.MOSTLY_BF16, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "f32": gguf.LlamaFileType.ALL_F32}[dtype]
    tensors = shape.tensors(vocab)

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(str(tmp), "llama")
        writer.add_name(name)
        writer.add_file_type(int(ftype))
        writer.add_context_length(context)
        writer.add_embedding_length(shape.hidden)
        writer.add_block_count(shape.layers)
        writer.add_feed_forward_length(shape.ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.kv_heads)
        writer.add_rope_freq_base(shape.rope_theta)
        writer.add_layer_norm_rms_eps(shape.rms_eps)
        writer.add_rope_dimension_count(shape.head_dim)
        writer.add_vocab_size(vocab)
        for key, value, vtype, sub in tokenizer:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for tname, tshape in tensors:
            is_norm = len(tshape) == 1
            elem = 4 if is_norm else DTYPE_BYTES[dtype]
            raw = gguf.GGMLQuantizationType.F32 if is_norm else qtype
            # The numpy dtype only has to be one that add_tensor_info does not reinterpret
            # (uint8 would make it read the shape as bytes); raw_dtype gives the GGML type.
            np_dtype = np.dtype(np.uint16 if elem == 2 else np.float32)
            writer.add_tensor_info(tname, tshape, np_dtype, math.prod(tshape) * elem,
                                   raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        alignment = writer.data_alignment
        writer.close()

        rng = np.random.default_rng(seed)
        chunk_bytes = chunk_mib * 1024 * 1024
        total = sum(math.prod(s) for _, s in tensors)
        written = 0
        started = last = time.monotonic()
        with open(tmp, "ab") as f:
            pad_to(f, alignment)  # the data section starts aligned
            for tname, tshape in tensors:
                if len(tshape) == 1:
                    f.write(np.ones(tshape, dtype=np.float32).tobytes())
                else:
                    rows, cols = tshape
                    for n in row_chunks(rows, cols, chunk_bytes):
                        values = rng.standard_normal((n, cols), dtype=np.float32)
                        values *= np.float32(std)
                        f.write(encode(values, dtype))
                written += math.prod(tshape)
                pad_to(f, alignment)
                now = time.monotonic()
                if now - last > 5:
                    last = now
                    log(f"  {100 * written / total:5.1f} % ({tname}), {now - started:.0f} s")
        size = tmp.stat().st_size
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it private
        os.replace(tmp, out)
        return size
    finally:
        if tmp.exists():
            tmp.unlink()


def verify(path: Path, shape: Shape, vocab: int, dtype: str,
           tokenizer: list[tuple[str, Any, Any, Any]], std: float = DEFAULT_STD,
           context: int = CONTEXT_LENGTH) -> list[str]:
    """Read the file back with gguf's GGUFReader; returns what is wrong (empty: all good)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    problems = []
    expected = dict(shape.tensors(vocab))
    found = {t.name: t for t in reader.tensors}
    if list(found) != list(expected):
        problems.append(f"tensor names/order differ: {len(found)} found, {len(expected)} expected")
    want_type = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[dtype]
    for tname, tshape in expected.items():
        t = found.get(tname)
        if t is None:
            continue
        if tuple(reversed(t.shape.tolist())) != tshape:
            problems.append(f"{tname}: shape {t.shape.tolist()} (GGML order), expected {tshape}")
        wanted = "F32" if len(tshape) == 1 else want_type
        if t.tensor_type.name != wanted:
            problems.append(f"{tname}: type {t.tensor_type.name}, expected {wanted}")
    first = found.get("blk.0.attn_q.weight")
    if first is not None:
        data = np.asarray(first.data)
        if dtype == "bf16":  # GGUFReader gives BF16 data as raw bytes
            data = (data.reshape(-1).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        sd = float(np.std(data.astype(np.float64)))
        if not 0.5 * std < sd < 2 * std:
            problems.append(f"blk.0.attn_q.weight: std {sd:.4f}, expected about {std}")
    norm = found.get("output_norm.weight")
    if norm is not None and not np.all(np.asarray(norm.data) == 1.0):
        problems.append("output_norm.weight is not all ones")

    def scalar(key: str) -> Any:
        field = reader.fields[key]
        return field.parts[field.data[0]].tolist()[0]

    keys = {
        "llama.embedding_length": shape.hidden, "llama.block_count": shape.layers,
        "llama.feed_forward_length": shape.ffn, "llama.attention.head_count": shape.heads,
        "llama.attention.head_count_kv": shape.kv_heads, "llama.vocab_size": vocab,
        "llama.rope.dimension_count": shape.head_dim, "llama.context_length": context,
    }
    for key, value in keys.items():
        if key not in reader.fields or scalar(key) != value:
            problems.append(f"{key}: expected {value}")
    for key, value, _, _ in tokenizer:
        field = reader.fields.get(key)
        if field is None:
            problems.append(f"{key} missing")
        elif isinstance(value, list) and len(field.data) != len(value):
            problems.append(f"{key}: {len(field.data)} items, expected {len(value)}")
    return problems


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Write a random-weight Llama GGUF of any shape with a real tokenizer.",
    )
    parser.add_argument("--shape", choices=sorted(SHAPES),
                        help="a preset shape (explicit dimensions below override its fields)")
    parser.add_argument("--hidden", type=int, help="model width")
    parser.add_argument("--layers", type=int, help="decoder layers")
    parser.add_argument("--heads", type=int, help="query heads")
    parser.add_argument("--kv-heads", type=int, help="key/value heads (default: --heads)")
    parser.add_argument("--ffn", type=int, help="MLP inner width")
    parser.add_argument("--rope-theta", type=float, help="RoPE base (default 10000)")
    parser.add_argument("--rms-eps", type=float, help="RMSNorm epsilon (default 1e-5)")
    tie = parser.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None,
                     help="share the embedding as LM head (no output.weight; default for "
                          "custom shapes)")
    tie.add_argument("--untied", dest="tied", action="store_false",
                     help="write a separate output.weight")
    parser.add_argument("--tokenizer-from", type=Path, default=DEFAULT_TOKENIZER,
                        help=f"GGUF whose tokenizer.* keys are copied (default {DEFAULT_TOKENIZER})")
    parser.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16",
                        help="type of the weight matrices (norms are always f32; default bf16)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the weights (default 1)")
    parser.add_argument("--context", type=int, default=CONTEXT_LENGTH,
                        help=f"llama.context_length: the longest sequence an engine sizes its "
                             f"cache for (default {CONTEXT_LENGTH}; 8,192-token prompts need more)")
    parser.add_argument("--std", type=float, default=DEFAULT_STD,
                        help=f"standard deviation of the weights (default {DEFAULT_STD})")
    parser.add_argument("--chunk-mib", type=int, default=DEFAULT_CHUNK_MIB,
                        help="size of one generated chunk in MiB (bounds memory; default 64)")
    parser.add_argument("--name", help="general.name (default: random-<shape>)")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip reading the file back with GGUFReader")
    parser.add_argument("-o", "--output", type=Path, help="the GGUF file to write")
    parser.add_argument("--selftest", action="store_true",
                        help="check shapes, argument handling, bf16 rounding and, where gguf "
                             "is installed, a small round trip; then exit")
    return parser


def resolve_shape(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Shape:
    """The shape the arguments describe. Exits 2 on bad usage."""
    if args.shape:
        shape = SHAPES[args.shape]
    else:
        missing = [f"--{f.replace('_', '-')}" for f in ("hidden", "layers", "heads", "ffn")
                   if getattr(args, f) is None]
        if missing:
            parser.error(f"give --shape or all of --hidden --layers --heads --ffn "
                         f"(missing {' '.join(missing)})")
        shape = Shape("custom", args.hidden, args.layers, args.heads,
                      args.kv_heads or args.heads, args.ffn)
    overrides = {k: getattr(args, k) for k in
                 ("hidden", "layers", "heads", "kv_heads", "ffn", "rope_theta", "rms_eps", "tied")
                 if getattr(args, k) is not None}
    if args.shape and overrides:
        shape = replace(shape, name=f"{shape.name}-custom", **overrides)
    elif overrides:
        shape = replace(shape, **overrides)
    problems = shape.problems()
    if problems:
        parser.error("; ".join(problems))
    return shape


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Shape:
    shape = resolve_shape(parser, args)
    if args.output is None:
        parser.error("-o/--output is required")
    if args.chunk_mib < 1:
        parser.error("--chunk-mib must be at least 1")
    if not args.std > 0:
        parser.error("--std must be positive")
    if args.context < 1:
        parser.error("--context must be at least 1")
    return shape


def missing_packages() -> list[str]:
    missing = [] if np is not None else ["numpy"]
    try:
        import gguf  # noqa: F401
    except ModuleNotFoundError:
        missing.append("gguf")
    except Exception as exc:  # e.g. a dependency of gguf (pyyaml) is missing
        missing.append(f"gguf (import failed: {type(exc).__name__}: {exc})")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.selftest:
        return selftest()
    shape = validate(parser, args)
    missing = missing_packages()
    if missing:
        log(f"error: missing Python package(s): {', '.join(missing)} "
            "(pip install gguf numpy, or run bench/peers/fetch.sh and put the carried wheel "
            "on PYTHONPATH)")
        return 2
    if not args.tokenizer_from.is_file():
        log(f"error: --tokenizer-from {args.tokenizer_from}: no such file (run "
            "`amk generate --prompt hi -n 1` once to fetch the default model, or pass a GGUF)")
        return 2
    try:
        tokenizer, vocab = read_tokenizer(args.tokenizer_from)
        name = args.name or f"random-{shape.name}"
        n_params = shape.parameters(vocab)
        log(f"writing {args.output}: {shape.name} (hidden {shape.hidden}, layers {shape.layers}, "
            f"heads {shape.heads}/{shape.kv_heads}, ffn {shape.ffn}, head_dim {shape.head_dim}, "
            f"{'tied' if shape.tied else 'untied'}), vocab {vocab}, {n_params / 1e6:.1f} M "
            f"parameters, {args.dtype}")
        started = time.monotonic()
        size = write_gguf(args.output, shape, tokenizer, vocab, args.dtype, args.seed, args.std,
                          args.chunk_mib, name, args.context)
        log(f"wrote {size / 2**20:.1f} MiB in {time.monotonic() - started:.1f} s")
        if not args.no_verify:
            problems = verify(args.output, shape, vocab, args.dtype, tokenizer, args.std,
                              args.context)
            if problems:
                for p in problems:
                    log(f"verify: {p}")
                return 1
            log("read back with GGUFReader: tensors, types, llama.* and tokenizer.* keys ok")
    except GgufError as exc:
        log(f"error: {exc}")
        return 2
    except OSError as exc:
        log(f"error: {exc}")
        return 1
    print(args.output)
    return 0


# --------------------------------------------------------------------------------------------
# Self-test
# --------------------------------------------------------------------------------------------


# Decoder parameters of the HF checkpoints (embedding rows excluded: the vocabulary here is
# the tokenizer's), i.e. the real models' counts minus their embedding and LM head.
DECODER_PARAMETERS = {
    "smollm2-135m": 134_515_008 - 49152 * 576,
    "llama-3.2-1b": 1_235_814_400 - 128256 * 2048,
    "llama-3.1-8b": 8_030_261_248 - 2 * 128256 * 4096,
    "tinyllama-1.1b": 1_100_048_384 - 2 * 32000 * 2048,
}


def selftest() -> int:
    checks: list[tuple[str, bool]] = []
    for name, n in DECODER_PARAMETERS.items():
        s = SHAPES[name]
        checks.append((f"{name} parameters", s.parameters(0) == n))
    checks.append(("head_dim", SHAPES["llama-3.1-8b"].head_dim == 128))
    checks.append(("untied has output.weight",
                   SHAPES["llama-3.1-8b"].tensors(10)[-1][0] == "output.weight"
                   and SHAPES["llama-3.2-1b"].tensors(10)[-1][0] == "output_norm.weight"))
    checks.append(("chunks", list(row_chunks(10, 4, 48)) == [3, 3, 3, 1]))
    checks.append(("usage", _selftest_usage()))
    if np is not None:
        x = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e-3], dtype=np.float32)
        bits = f32_to_bf16_bits(x)
        back = (bits.astype(np.uint32) << 16).view(np.float32)
        # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0); 1 + 3 * 2^-8 to
        # 1 + 2^-6 (even); small values keep about 3 significant digits.
        checks.append(("bf16 rounding", back[:4].tolist() == [1.0, -2.5, 1.0, 1.015625]
                       and abs(back[4] - 3.0e-3) < 2e-5))
    if not missing_packages():
        checks.append(("round trip (gguf installed)", _selftest_round_trip()))
    else:
        print("skip round trip: numpy or gguf is not installed")
    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"selftest: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _selftest_usage() -> bool:
    parser = build_parser()
    bad = [
        [],  # no shape
        ["--hidden", "64", "--layers", "2", "--heads", "4", "-o", "x"],  # no --ffn
        ["--hidden", "66", "--layers", "2", "--heads", "4", "--ffn", "8", "-o", "x"],
        ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "3", "--ffn", "8",
         "-o", "x"],
        ["--shape", "llama-3.2-1b"],  # no output
        ["--shape", "gpt-2", "-o", "x"],
        ["--shape", "llama-3.2-1b", "--tied", "--untied", "-o", "x"],
    ]
    for argv in bad:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                validate(parser, parser.parse_args(argv))
        except SystemExit as exc:
            if exc.code != 2:
                return False
        else:
            return False
    s = validate(parser, parser.parse_args(["--shape", "llama-3.1-8b", "-o", "x"]))
    custom = validate(parser, parser.parse_args(
        ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
         "--untied", "-o", "x"]))
    layered = validate(parser, parser.parse_args(["--shape", "llama-3.2-1b", "--layers", "2",
                                                  "-o", "x"]))
    return (s == SHAPES["llama-3.1-8b"] and not s.tied
            and (custom.hidden, custom.kv_heads, custom.head_dim, custom.tied) == (64, 2, 16, False)
            and layered.layers == 2 and layered.hidden == 2048 and layered.tied)


def _selftest_round_trip() -> bool:
    """Write a tiny GGUF with a made-up tokenizer and read it back."""
    import gguf

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "tok.gguf"
        w = gguf.GGUFWriter(str(src), "llama")
        w.add_key_value("tokenizer.ggml.model", "gpt2", gguf.GGUFValueType.STRING)
        w.add_key_value("tokenizer.ggml.tokens", [b"a", b"b", "\u0120c".encode(), b"d"],
                        gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
        w.add_key_value("tokenizer.ggml.token_type", [1, 1, 1, 3],
                        gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        w.add_key_value("tokenizer.ggml.eos_token_id", 3, gguf.GGUFValueType.UINT32)
        w.add_key_value("tokenizer.ggml.add_bos_token", False, gguf.GGUFValueType.BOOL)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        tokenizer, vocab = read_tokenizer(src)
        ok = vocab == 4 and [k for k, *_ in tokenizer] == [
            "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
            "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token"]
        shape = Shape("tiny", 32, 2, 4, 2, 48, tied=False)
        for dtype in ("bf16", "f16", "f32"):
            out = Path(tmp) / f"tiny-{dtype}.gguf"
            with contextlib.redirect_stderr(io.StringIO()):
                write_gguf(out, shape, tokenizer, vocab, dtype, 1, 0.02, 1, "tiny")
            problems = verify(out, shape, vocab, dtype, tokenizer)
            if problems:
                print(f"  {dtype}: {problems}")
            ok = ok and not problems
        reread, vocab2 = read_tokenizer(Path(tmp) / "tiny-bf16.gguf")
        return ok and vocab2 == 4 and reread == tokenizer


if __name__ == "__main__":
    sys.exit(main())
