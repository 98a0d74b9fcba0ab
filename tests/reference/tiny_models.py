#!/usr/bin/env python3
"""Tiny random-init HuggingFace checkpoints with reference logits.

What it does
------------
Builds three tiny decoder models with fixed seeds, overwrites every parameter
with a non-trivial random init (matrices ~ N(0, 0.2^2), RMSNorm weights
1 + 0.1*N(0,1), biases 0.1*N(0,1), so neither norm weights nor biases are the
trivial ones/zeros), and saves each as float32 safetensors with
``save_pretrained(dir, safe_serialization=True)``:

* ``tiny-gqa/``   LlamaConfig, 2 layers, 4 heads / 2 kv heads, head_dim 16, tied embeddings
* ``tiny-mqa/``   LlamaConfig, 3 layers, 8 heads / 1 kv head, explicit head_dim 8, untied
* ``tiny-qwen2/`` Qwen2Config, 2 layers, 4 heads / 2 kv heads, q/k/v biases, untied
* ``tiny-qwen3/`` Qwen3Config, 2 layers, 4 heads / 2 kv heads, head_dim 24 (heads x head_dim
  != hidden), per-head q/k RMSNorm, rope_theta 1e6, tied embeddings
* ``tiny-mistral/`` MistralConfig, 2 layers, 4 heads / 1 kv head, head_dim 16, no sliding
  window, rope_theta 1e6, untied
* ``tiny-llama3/`` LlamaConfig with Llama 3's RoPE frequency scaling (``rope_type: llama3``,
  factor 8, low/high frequency factors 1/4, original context 64: with head_dim 16 and theta
  10000, pair 0 keeps its frequency, pairs 1-2 are smoothed, pairs 3-7 divided by 8, so the
  scaling changes the angles from the first positions on)

For each it then reloads the saved directory with ``from_pretrained`` (so the
reference comes from exactly what is on disk), runs one teacher-forced float32
eager forward pass over a fixed sequence of 12 random token ids and writes
``<dir>/hf_logits.json``: the input ids, all logits ``[12, vocab]`` (each a
float32 value written as the exact decimal of that float32), the greedy
(argmax) next token at each position and the top-1/top-2 logit gap there.
No tokenizer is saved.

How to rerun
------------
    /path/to/venv/bin/python tests/reference/tiny_models.py
    (optionally --out-dir DIR; default: the directory of this script; --only NAME builds one)

Rust tests only read the committed files; they never run this script.
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ_LEN = 12


def model_specs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return [
        (
            "tiny-gqa",
            1001,
            LlamaConfig(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=160,
                vocab_size=320,
                rms_norm_eps=1e-5,
                rope_theta=10000.0,
                tie_word_embeddings=True,
                max_position_embeddings=128,
                bos_token_id=None,
                eos_token_id=None,
            ),
        ),
        (
            "tiny-mqa",
            1002,
            LlamaConfig(
                hidden_size=64,
                num_hidden_layers=3,
                num_attention_heads=8,
                num_key_value_heads=1,
                head_dim=8,
                intermediate_size=96,
                vocab_size=300,
                rms_norm_eps=1e-6,
                rope_theta=500000.0,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=None,
            ),
        ),
        (
            "tiny-llama3",
            1004,
            LlamaConfig(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=128,
                vocab_size=288,
                rms_norm_eps=1e-5,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                max_position_embeddings=256,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=None,
            ),
        ),
        (
            "tiny-mistral",
            1006,
            MistralConfig(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=16,
                intermediate_size=96,
                vocab_size=272,
                rms_norm_eps=1e-5,
                rope_theta=1000000.0,
                max_position_embeddings=256,
                sliding_window=None,
                tie_word_embeddings=False,
                bos_token_id=None,
                eos_token_id=None,
            ),
        ),
        (
            "tiny-qwen3",
            1005,
            Qwen3Config(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=24,
                intermediate_size=128,
                vocab_size=256,
                rms_norm_eps=1e-6,
                rope_theta=1000000.0,
                max_position_embeddings=256,
                tie_word_embeddings=True,
                attention_bias=False,
                use_sliding_window=False,
                bos_token_id=None,
                eos_token_id=None,
            ),
        ),
        (
            "tiny-qwen2",
            1003,
            Qwen2Config(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=128,
                vocab_size=256,
                tie_word_embeddings=False,
                use_sliding_window=False,
            ),
        ),
    ]


@torch.no_grad()
def randomise(model, seed):
    """Deterministic non-trivial init of every parameter, in named_parameters order."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():  # tied tensors appear once
        if name.endswith("norm.weight") or "layernorm" in name:
            new = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith(".bias"):
            new = 0.1 * torch.randn(p.shape, generator=gen)
        elif p.dim() == 2:
            new = 0.2 * torch.randn(p.shape, generator=gen)
        else:
            raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
        p.copy_(new.to(p.dtype))


def build_and_save(name, seed, config, out_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomise(model, seed)
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight, name
    else:
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight), name
    model.eval()
    path = os.path.join(out_dir, name)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path, model


@torch.no_grad()
def reference_logits(name, seed, path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 7)
    ids = torch.randint(0, vocab, (SEQ_LEN,), generator=gen).tolist()
    logits = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0]
    assert logits.dtype == torch.float32 and tuple(logits.shape) == (SEQ_LEN, vocab)
    top2 = torch.topk(logits, 2, dim=-1).values
    return model, {
        "model": name,
        "generator": "tests/reference/tiny_models.py",
        "dtype": "float32",
        "attn_implementation": "eager",
        "input_ids": ids,
        "greedy_next": torch.argmax(logits, dim=-1).tolist(),
        "top2_gap": [float(g) for g in (top2[:, 0] - top2[:, 1])],
        "logits_shape": [SEQ_LEN, vocab],
        "logits": [[float(x) for x in row] for row in logits],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=HERE)
    ap.add_argument("--only", help="build only the checkpoint of this name")
    args = ap.parse_args()

    import transformers

    torch.set_num_threads(1)  # keep the reduction order simple and reproducible
    for name, seed, config in model_specs():
        if args.only and name != args.only:
            continue
        path, built = build_and_save(name, seed, config, args.out_dir)
        reloaded, ref = reference_logits(name, seed, path)
        # The reloaded model must carry exactly the weights that were built.
        b, r = built.state_dict(), reloaded.state_dict()
        assert b.keys() == r.keys(), (name, set(b) ^ set(r))
        for k in b:
            assert torch.equal(b[k], r[k]), (name, k)
        ref["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__}
        ref["init"] = {
            "seed": seed,
            "matrices": "N(0, 0.2^2)",
            "norm_weights": "1 + 0.1*N(0,1)",
            "biases": "0.1*N(0,1)",
            "input_ids_seed": seed + 7,
        }
        with open(os.path.join(path, "hf_logits.json"), "w") as f:
            json.dump(ref, f, indent=0)
            f.write("\n")
        print(
            f"{name}: ids {ref['input_ids']} greedy {ref['greedy_next']} "
            f"min gap {min(ref['top2_gap']):.4f} tied={reloaded.config.tie_word_embeddings}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
