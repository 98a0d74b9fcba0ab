#!/usr/bin/env python3
"""Decode speed through `amk serve` against `amk generate`, same model, prompt and token count.

The server streams a completion of N tokens past the end token (`ignore_eos`); its decode rate
is (tokens - 1) / (time of the last chunk - time of the first), as `amk generate --json`
reports its own (`tokens_per_s`, from token arrival times). Both run R times; medians are
compared. Standard library only, so it runs on a GPU machine without network.

  bench/serve_bench.py --amk ./amk [--model F.gguf] [--backend cuda] [--dtype bf16]
                       [-p PROMPT_WORDS] [-n TOKENS] [-r REPS] [--json]
  bench/serve_bench.py --selftest        # argument handling and the arithmetic, no amk needed
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import time


def prompt_text(words):
    base = "The history of the city is long and full of change, and many people have written about it. "
    text = (base * (words // len(base.split()) + 1)).split()[:words]
    return " ".join(text)


def decode_rate(times, tokens):
    """Tokens per second after the first, from chunk arrival times."""
    if tokens < 2 or len(times) < 2 or times[-1] <= times[0]:
        return None
    return (tokens - 1) / (times[-1] - times[0])


def model_args(a):
    args = ["--backend", a.backend, "--dtype", a.dtype, "--max-seq", str(a.max_seq)]
    if a.model:
        args += ["--model", a.model]
    return args


def generate_once(a, prompt):
    cmd = [a.amk, "-q", "generate", "--json", "--ignore-eos", "-n", str(a.n), "--prompt", prompt]
    o = subprocess.run(cmd + model_args(a), capture_output=True, text=True, check=True)
    v = json.loads(o.stdout)
    return v["tokens_per_s"], len(v["generated_ids"])


def stream_once(host, port, prompt, n):
    body = json.dumps({
        "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
        "ignore_eos": True, "stream_options": {"include_usage": True},
    })
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:500]!r}")
    times, tokens = [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif chunk["choices"] and chunk["choices"][0].get("text"):
            times.append(time.perf_counter())
    c.close()
    return decode_rate(times, tokens or 0), tokens


def run(a):
    prompt = prompt_text(a.prompt_words)
    gen = [generate_once(a, prompt) for _ in range(a.reps)]
    server = subprocess.Popen(
        [a.amk, "-q", "serve", "--json", "--port", "0"] + model_args(a),
        stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(server.stdout.readline())
        host, port = ready["listening"][len("http://"):].rsplit(":", 1)
        srv = [stream_once(host, int(port), prompt, a.n) for _ in range(a.reps)]
    finally:
        server.terminate()
        server.wait()
    g = statistics.median(r[0] for r in gen)
    s = statistics.median(r[0] for r in srv)
    out = {"backend": a.backend, "dtype": a.dtype, "model": a.model or "default",
           "prompt_words": a.prompt_words, "tokens": a.n, "reps": a.reps,
           "generate_tok_s": g, "serve_tok_s": s, "serve_over_generate": s / g,
           "tokens_seen": [r[1] for r in srv]}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"| path | decode tok/s (median of {a.reps}) |\n|---|---|")
        print(f"| amk generate | {g:.1f} |\n| amk serve (streamed) | {s:.1f} |")
        print(f"\nserve / generate = {s / g:.3f}")


def selftest():
    assert decode_rate([0.0, 1.0], 3) == 2.0
    assert decode_rate([0.0], 3) is None and decode_rate([0.0, 1.0], 1) is None
    assert len(prompt_text(50).split()) == 50
    a = parse(["--amk", "x", "--model", "m.gguf", "--backend", "cuda", "-n", "8"])
    assert model_args(a)[:2] == ["--backend", "cuda"] and "m.gguf" in model_args(a)
    print("selftest ok")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--amk", default="amk")
    p.add_argument("--model")
    p.add_argument("--backend", default="auto")
    p.add_argument("--dtype", default="f32")
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("-p", "--prompt-words", type=int, default=64)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("-r", "--reps", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--selftest", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    if args.selftest:
        selftest()
    else:
        run(args)
