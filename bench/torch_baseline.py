#!/usr/bin/env python3
"""The strongest simple PyTorch baseline for one batch-1 decode step of a Llama-shaped model.

Method
------
One decode step takes one token at position ``pos`` and returns the logits of the next one:
embedding lookup; per layer RMSNorm -> one fused QKV matmul -> rotate-half RoPE on q and k ->
write k and v into a static KV cache at row ``pos`` -> attention of the single query over cache
rows [0, pos] (GQA) -> o_proj -> residual add -> RMSNorm -> one fused gate/up matmul ->
silu(gate) * up -> down_proj -> residual add; final RMSNorm -> LM head. Everything is bf16 on
the GPU; RMSNorm, RoPE and softmax compute in fp32 inside and cast back, as HuggingFace does.

Weights are random, drawn on the device from a seeded ``torch.Generator``: q/k/v and gate/up
weights uniform in [-0.02, 0.02); o_proj and down_proj, the projections that feed the
residual stream, uniform in +-0.02 / sqrt(2 * layers) (GPT-2's scaled initialisation); the
embedding uniform in [-0.2, 0.2); an untied LM head starts as a copy of the embedding (still a
separate tensor, read in full); norm weights 1 + 0.1 * uniform(-1, 1). Values do not change
the cost of a step, only how well the bf16 step can be checked: with +-0.02 everywhere the
bf16 rounding error compounds through 20-30 layers to 2-4 % of the largest logit (half of the
points would fail the 2e-2 gate) and the flat logits leave the argmax to bf16 rounding. With
these scales the error stays near 0.5 %, the argmax has a wide margin, and a wrong position
(a graph that ignores ``pos``) still misses by 4 to 30 times the tolerance. Before each
measured point the whole KV cache is filled with uniform(-0.5, 0.5) values, standing in for
a real prefix, and a random input token is drawn.

Every shape is static, so one CUDA graph serves every position: the token and the position
are device tensors read by the graph, the cache row is written with ``index_copy_`` at the
device position, and attention runs over all ``--max-seq`` cache rows with an additive mask
(0 for rows <= pos, -inf after) built from the device position. The baseline therefore reads
``max_seq`` cache rows per layer at every position: at ``--max-seq 1024`` that adds about 1 %
to the bytes of the 1B and 8B shapes and 9 % to smollm2-135m's, so pass the smallest
``--max-seq`` the positions allow (compare.py does).

Variants (one per run):
  compile+graph  torch.compile(mode="max-autotune-no-cudagraphs", fullgraph=True,
                 dynamic=False), falling back to mode="default" when max-autotune fails (the
                 output says which mode ran), then captured by hand into a torch.cuda.CUDAGraph.
  eager+graph    (--no-compile) the eager step captured into a torch.cuda.CUDAGraph.
Compilation and graph capture follow PyTorch's recipe: the step runs first (compiling and
autotuning), then a few times on a side stream, and only then is it captured.

Correctness gate, before any time is reported: the same step runs eagerly in fp32 (weights and
cache contents are the bf16 values upcast), and the bf16 graph-replay logits must satisfy
max|bf16 - fp32| / max|fp32| <= 2e-2 with the same argmax. A point that fails the gate reports
why and no time, and the run exits 1. The fp32 model is freed before timing.

Timing: ``--warmup`` replays, then the logits buffer is poisoned with NaN and ``--iters``
replays are timed, each between its own pair of CUDA events; the buffer must hold finite
logits afterwards. Reported: median, p10 and p90 in ms per token; bytes = bf16 weight bytes
(tied embedding counted once) + KV bytes read for rows [0, pos]; GB/s = bytes / median.

Output: a table on stdout, or with --json one JSON object; progress goes to stderr.
Exit status: 0 all points passed, 1 a gate or a run failed, 2 bad usage or no usable GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError:  # --help and --selftest work without PyTorch
    torch = None
    F = None

BF16_BYTES = 2
TOLERANCE = 2e-2
LINEAR_SCALE = 0.02
EMBED_SCALE = 0.2
NORM_SPREAD = 0.1
KV_SCALE = 0.5
COMPILE_MODES = ("max-autotune-no-cudagraphs", "default")
SIDE_STREAM_WARMUPS = 3


@dataclass(frozen=True)
class Shape:
    """A Llama-architecture model shape (SwiGLU MLP, RMSNorm, rotate-half RoPE, GQA)."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    tied: bool
    rope_theta: float
    eps: float = 1e-5

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def parameters(self) -> int:
        """Parameter count, the tied embedding counted once."""
        per_layer = (
            2 * self.hidden  # the two RMSNorm weights
            + (self.q_dim + 2 * self.kv_dim) * self.hidden  # fused QKV
            + self.hidden * self.q_dim  # o_proj
            + 2 * self.intermediate * self.hidden  # fused gate/up
            + self.hidden * self.intermediate  # down_proj
        )
        embeddings = (1 if self.tied else 2) * self.vocab * self.hidden
        return embeddings + self.layers * per_layer + self.hidden

    def weight_bytes(self) -> int:
        return BF16_BYTES * self.parameters()

    def kv_bytes(self, pos: int) -> int:
        """Bytes of K and V read by attention at position ``pos`` (rows 0..pos)."""
        return 2 * self.layers * (pos + 1) * self.kv_heads * self.head_dim * BF16_BYTES


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("llama-3.2-1b", 2048, 8192, 32, 8, 64, 16, 128256, True, 500000.0),
        Shape("llama-3.1-8b", 4096, 14336, 32, 8, 128, 32, 128256, False, 500000.0),
        Shape("smollm2-135m", 576, 1536, 9, 3, 64, 30, 49152, True, 100000.0),
        Shape("tinyllama-1.1b", 2048, 5632, 32, 4, 64, 22, 32000, False, 10000.0),
    )
}


class BenchError(Exception):
    """An expected failure: reported as a message, never as a traceback."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send whatever is written to stdout, by Python or native code, to stderr meanwhile.

    Keeps stdout for the results alone (compiler and autotuning chatter goes to stderr).
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def describe(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HuggingFace LlamaRMSNorm: fp32 inside, cast back, times the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` [heads, head_dim] with fp32 ``cos``/``sin`` [1, head_dim/2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Layer:
    """One decoder layer's weights and its part of the static KV cache."""

    def __init__(self, shape: Shape, max_seq: int, dtype: torch.dtype, device: torch.device):
        def empty(*size: int) -> torch.Tensor:
            return torch.empty(size, dtype=dtype, device=device)

        self.attn_norm = empty(shape.hidden)
        self.wqkv = empty(shape.q_dim + 2 * shape.kv_dim, shape.hidden)
        self.wo = empty(shape.hidden, shape.q_dim)
        self.mlp_norm = empty(shape.hidden)
        self.w_gate_up = empty(2 * shape.intermediate, shape.hidden)
        self.w_down = empty(shape.hidden, shape.intermediate)
        self.k_cache = empty(max_seq, shape.kv_heads, shape.head_dim)
        self.v_cache = empty(max_seq, shape.kv_heads, shape.head_dim)

    def norms(self) -> list[torch.Tensor]:
        return [self.attn_norm, self.mlp_norm]

    def linears(self) -> list[torch.Tensor]:
        return [self.wqkv, self.wo, self.w_gate_up, self.w_down]

    def caches(self) -> list[torch.Tensor]:
        return [self.k_cache, self.v_cache]


class Decoder:
    """A Llama-shaped decoder for batch-1 decode over a static KV cache of ``max_seq`` rows.

    The same code runs the bf16 model (eager or compiled, captured in a CUDA graph) and the
    fp32 reference of the correctness gate.
    """

    def __init__(self, shape: Shape, max_seq: int, dtype: torch.dtype, device: torch.device):
        self.shape = shape
        self.device = device
        self.embed = torch.empty(shape.vocab, shape.hidden, dtype=dtype, device=device)
        self.layers = [Layer(shape, max_seq, dtype, device) for _ in range(shape.layers)]
        self.final_norm = torch.empty(shape.hidden, dtype=dtype, device=device)
        self.lm_head = (
            self.embed
            if shape.tied
            else torch.empty(shape.vocab, shape.hidden, dtype=dtype, device=device)
        )
        half = torch.arange(0, shape.head_dim, 2, dtype=torch.float64, device=device)
        inv_freq = shape.rope_theta ** (-half / shape.head_dim)
        positions = torch.arange(max_seq, device=device)
        angles = positions.double()[:, None] * inv_freq[None, :]
        self.cos = angles.cos().float()
        self.sin = angles.sin().float()
        self.positions = positions
        self.scale = 1.0 / math.sqrt(shape.head_dim)

    def _norms(self) -> list[torch.Tensor]:
        return [*(w for layer in self.layers for w in layer.norms()), self.final_norm]

    def _caches(self) -> list[torch.Tensor]:
        return [c for layer in self.layers for c in layer.caches()]

    def _tensors(self) -> list[torch.Tensor]:
        """Every weight (the tied embedding once) and cache tensor, in a fixed order."""
        head = [] if self.shape.tied else [self.lm_head]
        linears = [w for layer in self.layers for w in layer.linears()]
        return [self.embed, *head, *linears, *self._norms(), *self._caches()]

    def init_weights(self, seed: int) -> None:
        """Random weights generated on the device, scaled as the module docstring explains."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        branch_scale = LINEAR_SCALE / math.sqrt(2 * self.shape.layers)
        self.embed.uniform_(-EMBED_SCALE, EMBED_SCALE, generator=gen)
        if not self.shape.tied:
            self.lm_head.copy_(self.embed)
        for layer in self.layers:
            layer.wqkv.uniform_(-LINEAR_SCALE, LINEAR_SCALE, generator=gen)
            layer.w_gate_up.uniform_(-LINEAR_SCALE, LINEAR_SCALE, generator=gen)
            layer.wo.uniform_(-branch_scale, branch_scale, generator=gen)
            layer.w_down.uniform_(-branch_scale, branch_scale, generator=gen)
        for w in self._norms():
            w.uniform_(-1.0, 1.0, generator=gen).mul_(NORM_SPREAD).add_(1.0)

    def fill_cache(self, gen: torch.Generator) -> None:
        """Fill every cache row with random values, like the K/V of a real prefix."""
        for c in self._caches():
            c.uniform_(-KV_SCALE, KV_SCALE, generator=gen)

    def copy_from(self, other: Decoder) -> None:
        """Copy (and so up- or down-cast) every weight and cache tensor of ``other``."""
        for dst, src in zip(self._tensors(), other._tensors(), strict=True):
            dst.copy_(src)

    def attention(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """One query [heads, head_dim] over all cache rows, masked to rows <= pos (GQA)."""
        s = self.shape
        qg = q.view(s.kv_heads, s.heads // s.kv_heads, s.head_dim)  # query head h -> kv h // group
        scores = torch.matmul(qg, k_cache.permute(1, 2, 0)).float() * self.scale + mask
        probs = torch.softmax(scores, dim=-1).to(v_cache.dtype)
        return torch.matmul(probs, v_cache.transpose(0, 1)).reshape(1, s.q_dim)

    def forward(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One decode step: ``token`` and ``pos`` are int64 device tensors of shape [1]."""
        s = self.shape
        x = F.embedding(token, self.embed)  # [1, hidden]
        cos = self.cos.index_select(0, pos)
        sin = self.sin.index_select(0, pos)
        mask = torch.where(self.positions <= pos, 0.0, float("-inf"))  # [max_seq] fp32
        for layer in self.layers:
            h = rms_norm(x, layer.attn_norm, s.eps)
            q, k, v = F.linear(h, layer.wqkv).split([s.q_dim, s.kv_dim, s.kv_dim], dim=-1)
            q = rope(q.view(s.heads, s.head_dim), cos, sin)
            k = rope(k.view(s.kv_heads, s.head_dim), cos, sin)
            layer.k_cache.index_copy_(0, pos, k.view(1, s.kv_heads, s.head_dim))
            layer.v_cache.index_copy_(0, pos, v.view(1, s.kv_heads, s.head_dim))
            x = x + F.linear(self.attention(q, layer.k_cache, layer.v_cache, mask), layer.wo)
            h = rms_norm(x, layer.mlp_norm, s.eps)
            gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
        return F.linear(rms_norm(x, self.final_norm, s.eps), self.lm_head).view(s.vocab)


# --------------------------------------------------------------------------------------------
# Compilation, graph capture, gate and timing
# --------------------------------------------------------------------------------------------

Step = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def compile_step(model: Decoder, token: torch.Tensor, pos: torch.Tensor) -> tuple[Step, str]:
    """torch.compile the step, trying each of COMPILE_MODES; compiles (and autotunes) now."""
    failures = []
    for mode in COMPILE_MODES:
        torch._dynamo.reset()
        log(f"  torch.compile mode={mode} ...")
        try:
            step = torch.compile(model.forward, mode=mode, fullgraph=True, dynamic=False)
            step(token, pos)
            torch.cuda.synchronize()
        except Exception as exc:  # inductor and autotuning failures come in many types
            reason = describe(exc)
            log(f"  torch.compile mode={mode} failed ({reason})")
            failures.append(f"{mode}: {reason}")
            continue
        if failures:
            log(f"  NOTE: fell back to torch.compile mode={mode}")
        return step, mode
    raise BenchError("torch.compile failed in every mode: " + "; ".join(failures))


def capture(
    step: Step, token: torch.Tensor, pos: torch.Tensor
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Capture ``step`` into a CUDA graph after warm-up runs on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(SIDE_STREAM_WARMUPS):
            step(token, pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step(token, pos)
    torch.cuda.synchronize()
    return graph, logits


@dataclass
class Gate:
    """The verdict of the correctness gate for one point."""

    passed: bool
    max_rel_err: float | None
    argmax: int
    argmax_ref: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        gate = {
            "passed": self.passed,
            "max_rel_err": self.max_rel_err,
            "tolerance": TOLERANCE,
            "argmax": self.argmax,
            "argmax_ref": self.argmax_ref,
        }
        if not self.passed:
            gate["reason"] = self.reason
        return gate


def check_gate(logits: torch.Tensor, ref: torch.Tensor) -> Gate:
    """Compare bf16 logits with the fp32 reference: relative max error and argmax."""
    out = logits.float()
    argmax, argmax_ref = int(out.argmax()), int(ref.argmax())
    if not bool(torch.isfinite(out).all()):
        return Gate(False, None, argmax, argmax_ref, "bf16 logits hold NaN or Inf")
    rel = float((out - ref).abs().max() / ref.abs().max())
    if not math.isfinite(rel):
        return Gate(False, None, argmax, argmax_ref, "fp32 reference logits are not finite")
    reasons = []
    if rel > TOLERANCE:
        reasons.append(f"max relative error {rel:.3e} > {TOLERANCE:g}")
    if argmax != argmax_ref:
        reasons.append(f"argmax {argmax} != reference argmax {argmax_ref}")
    return Gate(not reasons, rel, argmax, argmax_ref, "; ".join(reasons))


def time_replays(
    graph: torch.cuda.CUDAGraph, logits: torch.Tensor, warmup: int, iters: int
) -> list[float]:
    """Milliseconds of each of ``iters`` replays, each between its own pair of CUDA events."""
    for _ in range(warmup):
        graph.replay()
    logits.fill_(float("nan"))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    if not bool(torch.isfinite(logits).all()):
        raise BenchError("the timed replays did not overwrite the NaN-poisoned logits")
    return [start.elapsed_time(end) for start, end in events]


def summarize(times_ms: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90) of the samples."""
    deciles = statistics.quantiles(times_ms, n=10, method="inclusive")
    return statistics.median(times_ms), deciles[0], deciles[-1]


# --------------------------------------------------------------------------------------------
# Running one shape
# --------------------------------------------------------------------------------------------


def variant_of(args: argparse.Namespace) -> str:
    return "eager+graph" if args.no_compile else "compile+graph"


def point_json(
    shape: Shape, variant: str, compile_mode: str | None, pos: int, iters: int
) -> dict[str, Any]:
    """A result point with its time fields and gate still empty."""
    return {
        "model": shape.name,
        "variant": variant,
        "compile_mode": compile_mode,
        "dtype": "bf16",
        "pos": pos,
        "iters": iters,
        "median_ms": None,
        "p10_ms": None,
        "p90_ms": None,
        "bytes": shape.weight_bytes() + shape.kv_bytes(pos),
        "gbs": None,
        "gate": None,
    }


def set_point(model: Decoder, token: torch.Tensor, pos: torch.Tensor, seed: int, p: int) -> None:
    """Deterministic inputs of the point at position ``p``: cache contents and the token."""
    gen = torch.Generator(device=model.device).manual_seed(seed * 1_000_003 + p + 1)
    model.fill_cache(gen)
    token.copy_(torch.randint(model.shape.vocab, (1,), generator=gen, device=model.device))
    pos.fill_(p)


def run_shape(shape: Shape, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Gate and time every position of one shape; returns its result points."""
    device = torch.device("cuda")
    variant = variant_of(args)
    log(f"{shape.name}: {variant}, random bf16 weights ({shape.weight_bytes() / 1e9:.2f} GB)")
    model = Decoder(shape, args.max_seq, torch.bfloat16, device)
    model.init_weights(args.seed)
    token = torch.zeros(1, dtype=torch.long, device=device)
    pos = torch.zeros(1, dtype=torch.long, device=device)
    set_point(model, token, pos, args.seed, args.pos[0])

    if args.no_compile:
        step, mode = model.forward, None
    else:
        step, mode = compile_step(model, token, pos)
    log("  capturing the CUDA graph")
    graph, logits = capture(step, token, pos)
    points = {p: point_json(shape, variant, mode, p, args.iters) for p in args.pos}

    log("  correctness gate against the fp32 eager step")
    ref = Decoder(shape, args.max_seq, torch.float32, device)
    for p in args.pos:
        set_point(model, token, pos, args.seed, p)
        ref.copy_from(model)
        logits.fill_(float("nan"))
        graph.replay()
        gate = check_gate(logits, ref.forward(token, pos))
        points[p]["gate"] = gate.to_json()
        if gate.passed:
            log(f"  pos {p}: gate passed (max rel err {gate.max_rel_err:.2e})")
        else:
            log(f"  pos {p}: GATE FAILED: {gate.reason}")
    del ref
    torch.cuda.empty_cache()

    for p in args.pos:
        if not points[p]["gate"]["passed"]:
            continue
        set_point(model, token, pos, args.seed, p)
        median, p10, p90 = summarize(time_replays(graph, logits, args.warmup, args.iters))
        points[p].update(
            median_ms=median,
            p10_ms=p10,
            p90_ms=p90,
            gbs=points[p]["bytes"] / (median * 1e-3) / 1e9,
        )
        log(f"  pos {p}: median {median:.4f} ms")
    return list(points.values())


def failed_points(shape: Shape, args: argparse.Namespace, error: str) -> list[dict[str, Any]]:
    """Points for a shape whose run failed before it could be gated or timed."""
    points = [point_json(shape, variant_of(args), None, p, args.iters) for p in args.pos]
    for point in points:
        point["error"] = error
    return points


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def point_ok(point: dict[str, Any]) -> bool:
    return "error" not in point and point["gate"]["passed"] and point["median_ms"] is not None


def format_table(
    device: str, torch_version: str, max_seq: int, points: list[dict[str, Any]]
) -> str:
    """The human-readable report."""
    header = ("model", "variant", "compile mode", "pos", "median ms", "p10 ms", "p90 ms", "MB",
              "GB/s", "gate")
    rows = []
    for pt in points:
        gate = pt["gate"]
        if "error" in pt:
            times = ["error", "", "", "", ""]
            verdict = pt["error"]
        elif not gate["passed"]:
            times = ["gate failed", "", "", "", ""]
            verdict = "FAILED: " + gate["reason"]
        else:
            times = [f"{pt['median_ms']:.4f}", f"{pt['p10_ms']:.4f}", f"{pt['p90_ms']:.4f}",
                     f"{pt['bytes'] / 1e6:.1f}", f"{pt['gbs']:.0f}"]
            verdict = f"pass (rel err {gate['max_rel_err']:.2e}, argmax {gate['argmax']})"
        rows.append((pt["model"], pt["variant"], pt["compile_mode"] or "-", str(pt["pos"]),
                     *times, verdict))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    numeric = {3, 4, 5, 6, 7, 8}

    def line(cells: tuple[str, ...]) -> str:
        padded = (c.rjust(w) if i in numeric else c.ljust(w)
                  for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    out = [f"device: {device}   torch {torch_version}   max_seq {max_seq}", "",
           line(header), line(tuple("-" * w for w in widths)), *map(line, rows)]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def parse_positions(text: str) -> list[int]:
    try:
        positions = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pos takes comma-separated integers, not {text!r}")
    if not positions:
        raise argparse.ArgumentTypeError("--pos needs at least one position")
    return positions


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Time one bf16 batch-1 decode step in PyTorch (CUDA graph replay), "
        "correctness-gated against an fp32 eager step.",
    )
    parser.add_argument("--shape", action="append", default=[],
                        help=f"model shape, repeatable or comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--pos", type=parse_positions, default=[0, 511],
                        help="comma-separated decode positions (default 0,511)")
    parser.add_argument("--iters", type=int, default=200, help="timed replays per point")
    parser.add_argument("--warmup", type=int, default=20, help="untimed replays before timing")
    parser.add_argument("--max-seq", type=int, default=1024, help="KV cache rows (default 1024)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (0, as amk's)")
    parser.add_argument("--no-compile", action="store_true",
                        help="time the eager step in a CUDA graph instead of the compiled one")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--selftest", action="store_true",
                        help="check the pure-Python parts (no GPU or PyTorch needed) and exit")
    return parser


def validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Shape]:
    """Check the arguments; returns the shapes to run. Exits 2 on bad usage."""
    names = [n.strip() for arg in args.shape for n in arg.split(",") if n.strip()]
    if not names:
        parser.error("--shape is required")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        parser.error(f"unknown shape {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    if args.iters < 2:
        parser.error("--iters must be at least 2")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if args.max_seq < 1:
        parser.error("--max-seq must be positive")
    bad = [p for p in args.pos if not 0 <= p < args.max_seq]
    if bad:
        parser.error(f"position(s) {', '.join(map(str, bad))} outside [0, {args.max_seq}) "
                     "(raise --max-seq)")
    return [SHAPES[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.selftest:
        return selftest()
    shapes = validate(parser, args)
    if torch is None:
        log("error: PyTorch is not installed")
        return 2
    if not torch.cuda.is_available():
        log("error: no CUDA device is available to PyTorch")
        return 2

    torch.set_grad_enabled(False)
    torch.set_float32_matmul_precision("highest")  # the fp32 reference is true fp32
    device_name = torch.cuda.get_device_name()
    log(f"device: {device_name}, torch {torch.__version__}")

    points: list[dict[str, Any]] = []
    with stdout_to_stderr():
        for shape in shapes:
            try:
                points += run_shape(shape, args)
            except (BenchError, torch.cuda.OutOfMemoryError) as exc:
                log(f"{shape.name}: error: {describe(exc)}")
                points += failed_points(shape, args, describe(exc))
            except Exception as exc:  # unexpected: keep the traceback, go on with the next shape
                log(traceback.format_exc())
                log(f"{shape.name}: error: {describe(exc)}")
                points += failed_points(shape, args, describe(exc))
            torch._dynamo.reset()
            torch.cuda.empty_cache()

    if args.json:
        print(json.dumps({"tool": "torch", "torch": torch.__version__, "device": device_name,
                          "max_seq": args.max_seq, "points": points}))
    else:
        print(format_table(device_name, torch.__version__, args.max_seq, points))
    return 0 if all(point_ok(p) for p in points) else 1


# --------------------------------------------------------------------------------------------
# Self-test of the pure-Python parts
# --------------------------------------------------------------------------------------------


# Parameter counts of the HuggingFace checkpoints with these shapes.
HF_PARAMETERS = {
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "smollm2-135m": 134_515_008,
    "tinyllama-1.1b": 1_100_048_384,
}


def selftest() -> int:
    """Check parameter counts, argument handling and the report on made-up data."""
    checks: list[tuple[str, Callable[[], bool]]] = [
        *(
            (f"{name} parameters", lambda name=name, n=n: SHAPES[name].parameters() == n)
            for name, n in HF_PARAMETERS.items()
        ),
        ("kv bytes", lambda: SHAPES["llama-3.2-1b"].kv_bytes(511) == 2 * 16 * 512 * 8 * 64 * 2),
        ("positions", lambda: parse_positions("0, 511,") == [0, 511]),
        ("summary", lambda: summarize([float(i) for i in range(1, 102)]) == (51.0, 11.0, 91.0)),
        ("table", _selftest_table),
        ("usage errors", _selftest_usage),
    ]
    failed = 0
    for name, check in checks:
        ok = check()
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"selftest: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _selftest_table() -> bool:
    shape = SHAPES["llama-3.2-1b"]
    good = point_json(shape, "compile+graph", COMPILE_MODES[0], 0, 200)
    good.update(median_ms=0.9, p10_ms=0.89, p90_ms=0.95, gbs=2746.0,
                gate={"passed": True, "max_rel_err": 3.1e-3, "tolerance": TOLERANCE,
                      "argmax": 17, "argmax_ref": 17})
    bad = point_json(shape, "compile+graph", COMPILE_MODES[0], 511, 200)
    bad.update(gate={"passed": False, "max_rel_err": 0.5, "tolerance": TOLERANCE,
                     "argmax": 3, "argmax_ref": 17,
                     "reason": "argmax 3 != reference argmax 17"})
    args = argparse.Namespace(no_compile=True, pos=[0], iters=200)
    broken = failed_points(SHAPES["llama-3.1-8b"], args, "OutOfMemoryError: CUDA out of memory")
    points = [good, bad, *broken]
    table = format_table("Fake GPU", "0.0", 1024, points)
    print(table)
    json.loads(json.dumps({"points": points}, allow_nan=False))
    return ("gate failed" in table and "0.9000" in table and "CUDA out of memory" in table
            and [point_ok(p) for p in points] == [True, False, False])


def _selftest_usage() -> bool:
    parser = build_parser()
    for argv in (["--shape", "gpt-2"], ["--shape", "smollm2-135m", "--pos", "1024"], []):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                validate(parser, parser.parse_args(argv))
        except SystemExit as exc:
            if exc.code != 2:
                return False
        else:
            return False
    args = parser.parse_args(["--shape", "smollm2-135m,llama-3.2-1b", "--shape", "tinyllama-1.1b"])
    names = [s.name for s in validate(parser, args)]
    return names == ["smollm2-135m", "llama-3.2-1b", "tinyllama-1.1b"]


if __name__ == "__main__":
    sys.exit(main())
