"""The official `openai` Python client against `amk serve` (started by the Rust test
`openai_python_client` in cli/tests/serve_cli.rs, which sets AMK_SERVER_URL to it).

Run by hand:  amk serve --port 8000 &  AMK_SERVER_URL=http://127.0.0.1:8000 pytest cli/tests/python
"""

import os

import openai
import pytest

URL = os.environ.get("AMK_SERVER_URL")
pytestmark = pytest.mark.skipif(URL is None, reason="AMK_SERVER_URL is not set")


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=f"{URL}/v1", api_key="unused", max_retries=0, timeout=300)


def ask(client, content, **kw):
    return client.chat.completions.create(
        model="amk", messages=[{"role": "user", "content": content}], **kw
    )


def test_models_lists_the_served_model(client):
    ids = [m.id for m in client.models.list()]
    assert len(ids) == 1 and ids[0]


def test_greedy_chat_is_reproducible_and_counted(client):
    a = ask(client, "Name a colour.", max_tokens=10, temperature=0)
    b = ask(client, "Name a colour.", max_tokens=10, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.role == "assistant"
    assert a.choices[0].finish_reason in ("stop", "length")
    u = a.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 10
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_streamed_chat_adds_up_to_the_whole_answer(client):
    whole = ask(client, "Count to five.", max_tokens=12, temperature=0)
    stream = ask(
        client,
        "Count to five.",
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_seeded_sampling_repeats(client):
    kw = dict(max_tokens=10, temperature=0.8, top_p=0.9, seed=1234, extra_body={"top_k": 50})
    a = ask(client, "Tell me a fact.", **kw)
    b = ask(client, "Tell me a fact.", **kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_logprobs_and_alternatives(client):
    r = ask(client, "Say yes.", max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert 0 < len(content) <= 5
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5
        assert [a.logprob for a in t.top_logprobs] == sorted(
            (a.logprob for a in t.top_logprobs), reverse=True
        )


def test_sampled_tokens_carry_their_own_log_probabilities(client):
    r = ask(
        client,
        "Tell me a fact.",
        max_tokens=8,
        temperature=0.7,
        seed=11,
        logprobs=True,
        top_logprobs=20,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens or len(content) == r.usage.completion_tokens - 1
    found = 0
    for t in content:
        same = [a for a in t.top_logprobs if a.bytes == t.bytes]
        if same:
            found += 1
            assert abs(same[0].logprob - t.logprob) < 1e-5
    assert found > 0


def test_text_completion_with_a_stop_string(client):
    whole = client.completions.create(
        model="amk", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0
    )
    text = whole.choices[0].text
    assert text
    stop = text[len(text) // 2 :][:3]
    cut = client.completions.create(
        model="amk", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="amk", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text


def test_bad_requests_raise_the_clients_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="amk", messages=[])
    assert "at least one message" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "hi", max_tokens=10**6)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        ask(client, "hi", temperature=5)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
