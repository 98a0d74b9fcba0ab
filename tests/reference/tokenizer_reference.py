"""Tokenizer reference for SmolLM2-135M-Instruct (GGUF), written to tokenizer_cases.json.

Loads the tokenizer that HuggingFace transformers builds from the GGUF metadata
(`AutoTokenizer.from_pretrained(dir, gguf_file=name)`) and records, for a fixed list of
strings, `tokenizer(text)["input_ids"]` and `tokenizer.decode(input_ids)`; the chat template
rendering (`apply_chat_template(..., tokenize=False, add_generation_prompt=True)`) for a few
conversations; the BOS / EOS ids and whether BOS is prepended.

A second id list per string, `input_ids_smollm_pre`, comes from the same vocabulary, merges
and added tokens with the pre-tokenizer SmolLM2's own `tokenizer.json` uses (and llama.cpp's
"smollm" pre-tokenizer reproduces): Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]. transformers' GGUF
loader does not know the "smollm" pre-tokenizer name and falls back to plain ByteLevel; the two
differ only where whitespace runs end right before a digit (`match_transformers_gguf` says
where). The Rust tokenizer follows the model's own pre-tokenizer.

Rerun (needs torch only because transformers' GGUF reader imports it; nothing runs on it):

    python3 -m venv /work/venv-tok
    /work/venv-tok/bin/pip install transformers tokenizers gguf numpy torch
    /work/venv-tok/bin/python tests/reference/tokenizer_reference.py \
        [/work/models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

import hashlib
import importlib.metadata
import json
import os
import platform
import random
import sys

import tokenizers
import transformers
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoTokenizer
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

DEFAULT_GGUF = "/work/models/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_cases.json")

CASES = [
    ("empty", ""),
    ("word", "Hello"),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("leading_space", " leading space"),
    ("leading_spaces", "   three leading spaces"),
    ("trailing_spaces", "trailing spaces   "),
    ("multiple_spaces", "multiple    spaces   between  words"),
    ("only_spaces", "     "),
    ("newline", "line one\nline two"),
    ("newlines", "para one\n\n\npara two\n"),
    ("crlf", "windows\r\nline endings\r\n"),
    ("tabs", "col1\tcol2\t\tcol3"),
    ("digits", "12345"),
    ("float", "3.14"),
    ("numbers_in_text", "I have 12345 apples and 3.14 pies, 2x faster in 2024."),
    ("date", "2024-11-22 15:05:00"),
    ("spaces_before_digit", "x  1"),
    ("indented_number", "total:    42"),
    ("newline_digit", "a\n 7"),
    ("punctuation", "Wait... what?! (yes) [no] {maybe} -- \"quoted\" 'single';"),
    ("contractions", "I'm sure you'll see they've gone, isn't it? We'd, he's, they're"),
    ("upper_contractions", "I'M YOU'LL DON'T"),
    (
        "code",
        "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n    if a > 0:\n        return a + b\n    return b\n",
    ),
    ("code_braces", "fn main() {\n\tlet x = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}"),
    ("emoji", "I love pizza 🍕🍕! 😀👍🏽 👨‍👩‍👧"),
    ("cjk", "日本語のテキストと中文文本，还有한국어 텍스트。"),
    ("accented", "Café déjà vu, naïve façade, Straße, São Paulo, Ångström"),
    ("cyrillic_greek", "Привет мир, Καλημέρα κόσμε"),
    ("arabic_hebrew", "مرحبا بالعالم שלום עולם"),
    ("chatml_inline", "<|im_start|>user\nhi<|im_end|>"),
    ("chatml_full", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"),
    ("special_mid_word", "abc<|endoftext|>def"),
    ("special_spaced", "a <|im_start|> b"),
    ("other_control", "<repo_name>amk<file_sep>main.rs<filename>x"),
    ("broken_special", "<|im_start|<|im_end"),
    ("url", "https://example.com/path?query=1&other=two#frag"),
    ("email", "someone@example.org"),
    ("math", "E = mc^2, ∑_{i=1}^{n} x_i ≤ √2 ± 0.5°"),
    ("symbols", "~!@#$%^&*()_+`-=|\\:;<>,.?/"),
    ("mixed_whitespace", " \t \n \u00a0 \u3000 x"),
    ("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism"),
    ("repeated", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
    ("replacement_char", "bad \ufffd byte"),
]

# Pieces for the seeded random strings: every kind of text above, glued at random.
PIECES = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + [" ", "  ", "   ", "    ", "\n", "\n\n", "\t", "\r\n", " \n", "\u00a0"]
    + list(".,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`")
    + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL"]
    + ["the", " the", "Hello", " world", "ing", "tion", " 2024", "3.14", "0x1F", "100%"]
    + ["é", "ü", "ß", "ñ", "Å", "ø", "日本", "中文", "한국어", "Привет", "Καλη", "مرحبا", "שלום"]
    + ["😀", "👍🏽", "🍕", "👨\u200d👩\u200d👧", "∑", "≤", "√", "°", "\ufffd", "\u200b"]
    + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<|im_", "im_end|>", "<|"]
)


def random_cases(count, seed):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = rng.randint(1, 24)
        out.append((f"random_{i:03}", "".join(rng.choice(PIECES) for _ in range(n))))
    return out


RANDOM_COUNT = 200
RANDOM_SEED = 20261122

CHATS = [
    ("user_only", [{"role": "user", "content": "Hello! Who are you?"}]),
    (
        "with_system",
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2+2?"},
        ],
    ),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one, in 日本語 😀"},
        ],
    ),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    path = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF)
    directory, name = os.path.split(path)
    hf = AutoTokenizer.from_pretrained(directory, gguf_file=name)

    # The same vocabulary, merges and added tokens with SmolLM2's tokenizer.json pre-tokenizer.
    smollm = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    smollm.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )

    # transformers' own GGUF conversion with tokenizer.ggml.pre replaced, to check the other
    # byte-level pre-tokenizers on the same vocabulary ("gpt2" is plain ByteLevel: what
    # transformers already uses for "smollm", i.e. `input_ids`).
    architecture, tokenizer_dict, _ = get_gguf_tokenizer(path)
    llama_bpe, _ = convert_gguf_tokenizer(architecture, dict(tokenizer_dict, pre_tokenizer_type="llama-bpe"))

    bos, eos = hf.bos_token_id, hf.eos_token_id
    probe = hf("hello")["input_ids"]
    bare = hf("hello", add_special_tokens=False)["input_ids"]
    adds_bos = len(probe) == len(bare) + 1 and probe[0] == bos

    cases = []
    for case_name, text in CASES + random_cases(RANDOM_COUNT, RANDOM_SEED):
        ids = hf(text)["input_ids"]
        ids_smollm = smollm.encode(text).ids
        ids_llama_bpe = llama_bpe.encode(text).ids
        if adds_bos:
            ids_smollm = [bos] + ids_smollm
            ids_llama_bpe = [bos] + ids_llama_bpe
        cases.append(
            {
                "name": case_name,
                "text": text,
                "input_ids": ids,
                "decoded": hf.decode(ids),
                "input_ids_smollm_pre": ids_smollm,
                "decoded_smollm_pre": hf.decode(ids_smollm),
                "match_transformers_gguf": ids == ids_smollm,
                "input_ids_llama_bpe": ids_llama_bpe,
            }
        )

    chats = []
    for chat_name, messages in CHATS:
        chats.append(
            {
                "name": chat_name,
                "messages": [[m["role"], m["content"]] for m in messages],
                "add_generation_prompt": True,
                "rendered": hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
            }
        )
    # One without the generation prompt.
    chats.append(
        {
            "name": "user_only_no_prompt",
            "messages": [[m["role"], m["content"]] for m in CHATS[0][1]],
            "add_generation_prompt": False,
            "rendered": hf.apply_chat_template(CHATS[0][1], tokenize=False, add_generation_prompt=False),
        }
    )

    out = {
        "description": "HuggingFace transformers tokenizer built from the GGUF metadata "
        "(AutoTokenizer.from_pretrained(dir, gguf_file=name)): input_ids = tokenizer(text)['input_ids'], "
        "decoded = tokenizer.decode(input_ids). input_ids_smollm_pre: same vocabulary with SmolLM2's "
        "tokenizer.json pre-tokenizer (Digits(individual) + ByteLevel), which transformers' GGUF loader "
        "does not apply for tokenizer.ggml.pre = 'smollm'. input_ids_llama_bpe: transformers' GGUF "
        "conversion of the same metadata with tokenizer.ggml.pre = 'llama-bpe'. Cases random_*: seeded "
        "random strings (RANDOM_SEED in the generator).",
        "generator": "tests/reference/tokenizer_reference.py",
        "model": {"file": name, "sha256": sha256(path)},
        "versions": {
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf": importlib.metadata.version("gguf"),
            "python": platform.python_version(),
        },
        "vocab_size": len(hf),
        "bos_token_id": bos,
        "bos_token": hf.bos_token,
        "eos_token_id": eos,
        "eos_token": hf.eos_token,
        "adds_bos": adds_bos,
        "chat_template": hf.chat_template,
        "cases": cases,
        "chats": chats,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    differ = [c["name"] for c in cases if not c["match_transformers_gguf"]]
    print(f"wrote {OUT}: {len(cases)} cases, {len(chats)} chats; adds_bos={adds_bos}")
    print(f"cases where transformers' GGUF ids differ from the smollm pre-tokenizer: {differ}")


if __name__ == "__main__":
    main()
