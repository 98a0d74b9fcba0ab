#!/usr/bin/env python3
"""Renders real checkpoints' chat templates with transformers' own renderer and records them.

The templates are the ones llama.cpp keeps under `models/templates/` (each copied from its
model's `tokenizer_config.json`), read from the llama.cpp source that PyPI's
`llama-cpp-python` sdist vendors:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz
    python3 tests/reference/chat_template_reference.py \
        llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates

Every conversation below is rendered with `add_generation_prompt` on and off through
`transformers.utils.chat_template_utils.render_jinja_template` (what `apply_chat_template`
calls), with the model's BOS and EOS tokens; a conversation a template refuses
(`raise_exception`) is recorded with the template's message. Writes
`chat_template_cases.json` beside this script; the Rust test
`models/llama/tests/tokenizer.rs` (`chat_templates_match_transformers`) reads it.
"""

import json
import sys
from pathlib import Path

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

# file stem -> (BOS, EOS) as the model's tokenizer_config.json names them
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
}

CONVERSATIONS = [
    [("user", "hi")],
    [("system", "You are terse."), ("user", "What is 2+2?")],
    [("user", "Name a colour."), ("assistant", "Blue."), ("user", "Another?")],
    [
        ("system", "Answer in French."),
        ("user", "Hello"),
        ("assistant", "Bonjour"),
        ("user", "Thanks"),
    ],
    [("user", "héllo 世界 🎉 — “quotes” & <tags>")],
    [("user", "  padded text  \n")],
    [("user", "line one\nline two\n\nline four")],
    [("system", "S"), ("user", "U"), ("assistant", "A")],
    [
        ("user", "one"),
        ("assistant", "1"),
        ("user", "two"),
        ("assistant", "2"),
        ("user", "three"),
    ],
    [("user", "Think first."), ("assistant", "<think>\nsum\n</think>\n\n4"), ("user", "Why?")],
    [("user", "")],
    [("assistant", "I start."), ("user", "Then I answer.")],
]


def render(template, messages, add_generation_prompt, bos, eos):
    conversation = [{"role": r, "content": c} for r, c in messages]
    try:
        out, _ = render_jinja_template(
            conversations=[conversation],
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
        )
        return {"rendered": out[0]}
    except Exception as e:  # the template's raise_exception (jinja2 TemplateError)
        return {"raises": str(e)}


def main():
    root = Path(sys.argv[1])
    templates, cases = {}, []
    for stem, (bos, eos) in TEMPLATES.items():
        text = (root / f"{stem}.jinja").read_text()
        templates[stem] = {"template": text, "bos_token": bos, "eos_token": eos}
        for messages in CONVERSATIONS:
            for add in (True, False):
                case = {"template": stem, "messages": messages, "add_generation_prompt": add}
                case.update(render(text, messages, add, bos, eos))
                cases.append(case)
    out = {
        "generator": "tests/reference/chat_template_reference.py",
        "versions": {"transformers": transformers.__version__},
        "templates": templates,
        "cases": cases,
    }
    path = Path(__file__).with_name("chat_template_cases.json")
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    raised = sum("raises" in c for c in cases)
    print(f"{len(cases)} cases over {len(templates)} templates ({raised} raise) -> {path}")


if __name__ == "__main__":
    main()
