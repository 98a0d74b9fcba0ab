#!/usr/bin/env python3
"""A Llama-3-style byte-level BPE `tokenizer.json`, and what transformers makes of it.

Trains a small byte-level BPE with the `tokenizers` package, shaped like Llama 3's own
`tokenizer.json`: its pre-tokenizer split (the regex of Llama 3's `tokenizer.json`, then
byte-level without a prefix space), its special tokens (`<|begin_of_text|>`,
`<|end_of_text|>`, `<|eot_id|>`, ...) and its post-processor prepending `<|begin_of_text|>`;
saves it as `llama3_bpe/tokenizer.json` with a `tokenizer_config.json` as transformers writes
one (including its default `model_max_length`, a number far past 64 bits). Then loads the
directory with `AutoTokenizer.from_pretrained` and records, for the strings of
`spm_tokenizer_reference.py`, `tokenizer(text)["input_ids"]` and `tokenizer.decode(input_ids)`
into `llama3_bpe_cases.json`. The Rust test `models/llama/tests/spm_tokenizer.rs` reads them.

    pip install transformers tokenizers
    python3 tests/reference/llama3_bpe_reference.py
"""

import importlib.metadata
import importlib.util
import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "llama3_bpe"
CASES_OUT = HERE / "llama3_bpe_cases.json"
VOCAB = 800

# Llama 3's pre-tokenizer split, as its tokenizer.json writes it.
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def strings_of_the_spm_script() -> list[str]:
    spec = importlib.util.spec_from_file_location("spm_ref", HERE / "spm_tokenizer_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.strings(), mod.EXTRA


def build(extra: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = (HERE / "ppl_text.txt").read_text().split("\n") + extra
    tok.train_from_iterator(text, trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    return tok


def main() -> None:
    strings, extra = strings_of_the_spm_script()
    OUT_DIR.mkdir(exist_ok=True)
    tok = build(extra)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        clean_up_tokenization_spaces=True,
    )
    fast.save_pretrained(str(OUT_DIR))
    ref = AutoTokenizer.from_pretrained(str(OUT_DIR))
    cases = []
    for s in strings:
        ids = ref(s)["input_ids"]
        cases.append({"text": s, "input_ids": ids, "decoded": ref.decode(ids)})
    config = json.loads((OUT_DIR / "tokenizer_config.json").read_text())
    doc = {
        "description": "transformers' AutoTokenizer for llama3_bpe/ (a byte-level BPE shaped like "
        "Llama 3's tokenizer.json): tokenizer(text)['input_ids'] and decode(input_ids) per string",
        "generator": "tests/reference/llama3_bpe_reference.py",
        "versions": {p: importlib.metadata.version(p) for p in ("transformers", "tokenizers")},
        "vocab_size": tok.get_vocab_size(),
        "bos_id": tok.token_to_id("<|begin_of_text|>"),
        "eos_id": tok.token_to_id("<|eot_id|>"),
        "model_max_length": str(config.get("model_max_length")),
        "cases": cases,
    }
    CASES_OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases, vocabulary {tok.get_vocab_size()}: {OUT_DIR.name}/, {CASES_OUT.name}")


if __name__ == "__main__":
    main()
