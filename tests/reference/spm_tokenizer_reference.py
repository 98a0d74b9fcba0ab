#!/usr/bin/env python3
"""A SentencePiece vocabulary as a GGUF file, and what transformers makes of it.

Llama-2, TinyLlama and Mistral GGUFs carry SentencePiece vocabularies
(`tokenizer.ggml.model = "llama"`: tokens, scores and token types, no merges). This script
trains a small BPE SentencePiece model with the `sentencepiece` package (byte fallback, digits
split, no normalisation, as Llama-2's), writes its vocabulary as llama.cpp's converter does
into `spm_tiny.gguf` (tokenizer metadata and the few llama.* keys a loader reads; no tensors),
then loads that file with transformers (`LlamaTokenizer.from_pretrained(dir, gguf_file=...)`,
the class `AutoTokenizer` picks for a llama GGUF; it rebuilds the merges from the scores) and
records, for every string below,
`tokenizer(text)["input_ids"]` and `tokenizer.decode(input_ids)` into
`spm_tokenizer_cases.json`. The Rust test `models/llama/tests/spm_tokenizer.rs` reads both.

    pip install sentencepiece gguf transformers tokenizers
    python3 tests/reference/spm_tokenizer_reference.py

transformers' GGUF reader imports torch at module level for its tensor path; reading a file's
metadata never touches it, so without torch installed the script puts an empty stand-in module
in its place before loading (`_torch_stand_in`).

The training text is `ppl_text.txt` beside this script plus the lines in `EXTRA` (a few
languages, code and numbers), so rare characters exist that only the byte fallback covers.
"""

import importlib.metadata
import json
import random
import sys
import tempfile
import types
from pathlib import Path

import gguf
import sentencepiece as spm
from transformers import LlamaTokenizer

HERE = Path(__file__).resolve().parent
GGUF_OUT = HERE / "spm_tiny.gguf"
CASES_OUT = HERE / "spm_tokenizer_cases.json"
VOCAB = 600

EXTRA = [
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "El niño comió una manzana roja en la mañana.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "def main():\n    return sum(x * x for x in range(10))\n",
    "The answer is 42, and 3.14159 is close to pi; 2026-11-28 is a date.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 12345.",
]

# SentencePiece piece types -> llama.cpp's token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def train(work: Path) -> spm.SentencePieceProcessor:
    text = (HERE / "ppl_text.txt").read_text() + "\n" + "\n".join(EXTRA) + "\n"
    corpus = work / "corpus.txt"
    corpus.write_text(text)
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(work / "spm"),
        vocab_size=VOCAB,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        user_defined_symbols=["<think>"],
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=str(work / "spm.model"))


def piece_type(sp: spm.SentencePieceProcessor, i: int) -> int:
    if sp.is_unknown(i):
        return UNKNOWN
    if sp.is_control(i):
        return CONTROL
    if sp.is_unused(i):
        return UNUSED
    if sp.is_byte(i):
        return BYTE
    # user-defined symbols are neither of the above and score 0 in a BPE model
    if sp.id_to_piece(i) == "<think>":
        return USER_DEFINED
    return NORMAL


def write_gguf(sp: spm.SentencePieceProcessor, path: Path) -> None:
    n = sp.get_piece_size()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("spm-tiny")
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n)
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i).encode("utf-8") for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([piece_type(sp, i) for i in range(n)])
    w.add_unk_token_id(sp.unk_id())
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def strings() -> list[str]:
    fixed = [
        "",
        "Hello",
        "Hello world",
        " leading space",
        "   three leading spaces",
        "trailing spaces   ",
        "multiple    spaces   between  words",
        "     ",
        " ",
        "\n",
        "line one\nline two\n\nline four",
        "tabs\tand\ttabs",
        "The lighthouse stood at the end of a narrow spit of land.",
        "the grass gave way to sand and the sand gave way to grey water",
        "Numbers 0123456789 and 3.14159 and -273.15",
        "2026-11-28T20:51:00Z",
        "Über Äpfel, Öl und Grüße",
        "naïve café résumé",
        "日本語のテキスト",
        "中文字符和标点，。！",
        "한국어 문장입니다",
        "emoji 😀🎉👍🏽 and ❤️",
        "mixed: a😀b日c\u00e9d",
        "<s>",
        "</s>",
        "<unk>",
        "a <s> b </s> c",
        "<s>starts with bos",
        "<think>reasoning</think> done",
        "<think>",
        "x<think>y",
        "▁already▁has▁metaspace",
        "code: fn main() { println!(\"hi\"); }",
        "def f(x):\n    return x ** 2\n",
        "URL https://example.com/path?q=1&r=2#frag",
        "email someone@example.org",
        "punctuation!!! ??? ... ;;; :::",
        "quotes 'single' \"double\" `back`",
        "ALL CAPS SENTENCE HERE",
        "MiXeD CaSe WoRdS",
        "a",
        "ab",
        "abc",
        "\u00a0non-breaking\u00a0spaces\u00a0",
        "zero\u200bwidth\u200bspace",
        "control \u0001 char",
        "Быстрая коричневая лиса",
        "Der schnelle braune Fuchs",
        "El niño comió una manzana",
        "Le cœur a ses raisons",
    ]
    rng = random.Random(20261128)
    words = [w for w in ((HERE / "ppl_text.txt").read_text() + " " + " ".join(EXTRA)).split() if w]
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?-'\"()\n\t"
    rare = "éüßøœ日本語中文한국😀🎉❤Ωπ∑√€£¥©®™"
    seps = [" ", "  ", "\n", " \n ", "\t", ""]
    out = list(fixed)
    for _ in range(70):  # sentences of training words with varied separators
        k = rng.randint(1, 12)
        out.append(rng.choice(["", " ", "  "]) + "".join(rng.choice(words) + rng.choice(seps) for _ in range(k)))
    for _ in range(50):  # random characters of the common alphabet
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    for _ in range(40):  # rare characters mixed in (the byte fallback)
        out.append("".join(rng.choice(alphabet + rare * 3) for _ in range(rng.randint(1, 30))))
    for _ in range(20):  # special tokens inside text
        parts = [rng.choice(words) for _ in range(rng.randint(1, 5))]
        for _ in range(rng.randint(1, 3)):
            parts.insert(rng.randint(0, len(parts)), rng.choice(["<s>", "</s>", "<think>", "<unk>"]))
        out.append(rng.choice([" ", "", "  "]).join(parts))
    return out


class _Absent(types.ModuleType):
    """Any attribute is an empty class: enough for the annotations and dtype constants of a
    module that imports torch but is only asked for metadata."""

    def __getattr__(self, name):
        return type(name, (), {})


def _torch_stand_in() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.modules["torch"] = _Absent("torch")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sp = train(Path(tmp))
    write_gguf(sp, GGUF_OUT)
    _torch_stand_in()
    tok = LlamaTokenizer.from_pretrained(str(HERE), gguf_file=GGUF_OUT.name)
    cases = []
    for s in strings():
        ids = tok(s)["input_ids"]
        cases.append({"text": s, "input_ids": ids, "decoded": tok.decode(ids)})
    doc = {
        "description": "transformers' LlamaTokenizer for spm_tiny.gguf (a SentencePiece BPE vocabulary): "
        "tokenizer(text)['input_ids'] and decode(input_ids) per string",
        "generator": "tests/reference/spm_tokenizer_reference.py",
        "gguf": GGUF_OUT.name,
        "versions": {
            p: importlib.metadata.version(p) for p in ("transformers", "tokenizers", "sentencepiece", "gguf")
        },
        "vocab_size": sp.get_piece_size(),
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "unk_id": sp.unk_id(),
        "cases": cases,
    }
    CASES_OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases, vocabulary {sp.get_piece_size()}: {GGUF_OUT.name}, {CASES_OUT.name}")


if __name__ == "__main__":
    main()
