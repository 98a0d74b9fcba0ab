"""`import amk` against the default model (or $AMK_TEST_GGUF) on the CPU VM: greedy text equals
HuggingFace's own continuation (tests/reference/smollm2_hf.json); streams, chats, stop strings,
seeds, errors and threads behave as documented (models/python/src/lib.rs)."""

import json
import os
import pathlib
import threading
import time

import pytest

import amk

REPO = pathlib.Path(__file__).resolve().parents[4]


def hf_case(name):
    doc = json.loads((REPO / "tests/reference/smollm2_hf.json").read_text())
    return next(p for p in doc["prompts"] if p["name"] == name)


@pytest.fixture(scope="module")
def model():
    return amk.Model(os.environ.get("AMK_TEST_GGUF"), backend="cpu", max_seq=256)


def test_the_model_describes_itself(model):
    assert model.backend == "cpu"
    assert model.max_seq == 256
    assert model.model_id
    assert "amk.Model(" in repr(model)
    assert amk.__version__


def test_greedy_text_is_huggingfaces(model):
    case = hf_case("python_function")
    text = model.generate(case["text"], max_tokens=16)
    assert text and case["generated_text"].startswith(text)
    assert model.tokenize(case["text"]) == case["prompt_ids"]


def test_a_stream_adds_up_to_the_whole_text(model):
    whole = model.generate("The quick brown fox", max_tokens=12)
    s = model.stream("The quick brown fox", max_tokens=12)
    pieces = list(s)
    assert "".join(pieces) == whole
    assert len(pieces) > 1
    assert s.finish_reason == "length"
    assert s.completion_tokens == 12 and s.prompt_tokens > 0
    assert list(s) == []  # an ended stream stays ended


def test_chat_answers_and_ends_at_the_end_of_turn(model):
    reply = model.chat(
        [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        max_tokens=40,
    )
    assert "Paris" in reply and "<|im_end|>" not in reply
    s = model.generate("What is the capital of France?", chat=True, max_tokens=40)
    assert s
    streamed = model.chat([{"role": "user", "content": "Say hi."}], max_tokens=8, stream=True)
    assert "".join(streamed) == model.chat([{"role": "user", "content": "Say hi."}], max_tokens=8)


def test_stop_strings_cut_the_text(model):
    whole = model.generate("1, 2, 3, 4,", max_tokens=12)
    stop = whole[len(whole) // 2 :][:3]
    cut = model.generate("1, 2, 3, 4,", max_tokens=12, stop=[stop])
    assert cut == whole[: whole.index(stop)]


def test_seeds_repeat(model):
    kw = dict(max_tokens=10, temperature=0.9, top_p=0.95, top_k=40)
    assert model.generate("Once", seed=3, **kw) == model.generate("Once", seed=3, **kw)
    texts = {model.generate("Once", seed=s, **kw) for s in range(1, 5)}
    assert len(texts) > 1


def test_bad_arguments_raise_amk_errors(model):
    with pytest.raises(amk.AmkError, match="max_tokens"):
        model.generate("x", max_tokens=0)
    with pytest.raises(amk.AmkError, match="temperature"):
        model.generate("x", temperature=-1.0)
    with pytest.raises(amk.AmkError, match="context"):
        model.generate("word " * 300)
    with pytest.raises(amk.AmkError, match="at least one message"):
        model.chat([])
    with pytest.raises(amk.AmkError, match="role"):
        model.chat([{"content": "no role"}])
    with pytest.raises(amk.AmkError, match="no such file"):
        amk.Model("/no/such/model.gguf")
    with pytest.raises(amk.AmkError, match="backend"):
        amk.Model(backend="tpu")
    with pytest.raises(TypeError):
        model.generate("x", max_tokens="many")


def test_closing_a_stream_stops_its_generation(model):
    # The time of a few tokens here, to compare with.
    t0 = time.time()
    model.generate("Hello", max_tokens=8)
    eight = time.time() - t0
    s = model.stream("Once upon a time", max_tokens=200)
    next(s)
    s.close()
    assert list(s) == []
    # The engine is free again at once: the closed generation stopped at its next token (had
    # it run on, its 199 other tokens would come first).
    t0 = time.time()
    assert model.generate("Hello", max_tokens=8)
    assert time.time() - t0 < 5 * eight


def test_another_thread_can_close_a_stream_being_read(model):
    s = model.stream("Once upon a time", max_tokens=200)
    got = []
    first = threading.Event()

    def read():
        for piece in s:
            got.append(piece)
            first.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert first.wait(60)
    s.close()  # while the reader waits for its next piece, the interpreter's lock released
    reader.join(60)
    assert not reader.is_alive(), "the reader never finished: close() deadlocked"
    assert 0 < len(got) < 200


def test_threads_share_one_model(model):
    want = model.generate("Hello there", max_tokens=6)
    got = []

    def run():
        got.append(model.generate("Hello there", max_tokens=6))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 4
