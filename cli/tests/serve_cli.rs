//! `amk serve`: the real server on a loopback port, driven with raw HTTP (and, in
//! `openai_python_client`, with the official `openai` Python client). The default model's
//! greedy answers are checked against HuggingFace's (`tests/reference/smollm2_hf.json`); every
//! bad request must be an OpenAI error object with a 4xx status and leave the server serving.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

mod tiny;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `amk serve`, stopped when dropped.
struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    addr: String,
    stderr: PathBuf,
}

impl Server {
    /// `amk serve --port 0 --json ARGS` with `envs`, once it listens.
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Server {
        let dir = tiny::scratch(&format!("serve-{}", args.join("-").replace('/', "_")));
        let stderr = dir.join("stderr.txt");
        let mut c = Command::new(env!("CARGO_BIN_EXE_amk"));
        c.args(["serve", "--port", "0", "--json"])
            .args(args)
            .env_remove("AMK_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (k, v) in envs {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        if line.is_empty() {
            let _ = child.wait();
            panic!(
                "amk serve did not start:\n{}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        let v: Value = serde_json::from_str(&line).unwrap();
        let url = v["listening"].as_str().unwrap();
        Server {
            child,
            addr: url.trim_start_matches("http://").to_string(),
            stderr,
        }
    }

    /// The default model (or `$AMK_TEST_GGUF`) with a 256-token context.
    fn default_model(args: &[&str], envs: &[(&str, &str)]) -> Server {
        let mut all: Vec<String> = ["--max-seq", "256"].map(String::from).to_vec();
        if let Some(g) = std::env::var_os("AMK_TEST_GGUF") {
            all.push("--model".into());
            all.push(g.to_string_lossy().into_owned());
        }
        all.extend(args.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        Server::start(&refs, envs)
    }

    fn post(&self, path: &str, body: &Value) -> Reply {
        request(&self.addr, "POST", path, &[], body.to_string().as_bytes())
    }

    fn get(&self, path: &str) -> Reply {
        request(&self.addr, "GET", path, &[], b"")
    }

    /// A metric's value from `/metrics`.
    fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").body;
        let line = text
            .lines()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// Fails unless the process is still running.
    fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the server exited:\n{}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
        assert_eq!(self.get("/health").status, 200);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of a server-sent event stream.
    fn events(&self) -> Vec<String> {
        sse_data(&self.body)
    }

    /// Checks an OpenAI error object with `status` whose message holds `needle`.
    fn assert_error(&self, status: u16, needle: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        let e = &v["error"];
        assert!(e["type"].is_string(), "{v}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{needle} not in {v}"
        );
        v
    }
}

fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// One HTTP/1.0 exchange (the answer ends when the server closes the connection).
fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    // The server may answer (413) and close before reading all of a large body.
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body));
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    Reply {
        status,
        body: body.to_string(),
    }
}

fn hf_reference() -> Value {
    let text = std::fs::read_to_string(tiny::reference("smollm2_hf.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn hf_prompt(name: &str) -> Value {
    hf_reference()["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap()
        .clone()
}

/// The chat HuggingFace's `chat_template` case renders: its system and user turns.
fn hf_chat_messages() -> Value {
    json!([
        {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
        {"role": "user", "content": "Give me three tips for staying focused while studying."}
    ])
}

/// The text of a whole chat answer, after checking its shape.
fn chat_content(v: &Value) -> String {
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"), "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant", "{v}");
    c["message"]["content"].as_str().unwrap().to_string()
}

#[test]
fn chat_matches_huggingface_whole_and_streamed() {
    let hf = hf_prompt("chat_template");
    let want = hf["generated_text"].as_str().unwrap();
    let mut server = Server::default_model(&[], &[]);
    let body = json!({"model": "any name", "messages": hf_chat_messages(), "max_tokens": 24,
                      "temperature": 0});
    let r = server.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let content = chat_content(&v);
    // 24 of HF's 40 greedy tokens: a prefix of its text.
    assert!(
        !content.is_empty() && want.starts_with(&content),
        "{content:?} is not a prefix of HF's {want:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(
        u["prompt_tokens"],
        hf["prompt_ids"].as_array().unwrap().len()
    );
    assert_eq!(u["completion_tokens"], 24);
    assert_eq!(u["total_tokens"], u["prompt_tokens"].as_u64().unwrap() + 24);

    // Streamed: the role first, then deltas that add up to the same text, the finish reason,
    // the usage chunk asked for, and [DONE].
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = server.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = (events[..events.len() - 1].iter())
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = (chunks.iter())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length", "{finish}");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], v["usage"]);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    server.assert_alive();
}

#[test]
fn completions_match_huggingface_with_stops_logprobs_and_echo() {
    let hf = hf_prompt("python_function");
    let (prompt, want) = (
        hf["text"].as_str().unwrap(),
        hf["generated_text"].as_str().unwrap(),
    );
    let server = Server::default_model(&[], &[]);
    let complete = |extra: Value| {
        let mut body = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = server.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r
    };
    let v = complete(json!({"logprobs": 2})).json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(
        !text.is_empty() && want.starts_with(&text),
        "{text:?} is not a prefix of HF's {want:?}"
    );
    assert_eq!(
        v["usage"]["prompt_tokens"],
        hf["prompt_ids"].as_array().unwrap().len()
    );
    // Greedy: each token is the most likely of its alternatives, its log-probability theirs.
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 16);
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 2, "{top:?}");
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let own = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(own <= 0.0 && (own - best).abs() < 1e-5, "{own} vs {best}");
    }

    // The same prompt as token ids: the same text.
    let ids = hf["prompt_ids"].clone();
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(r.json()["choices"][0]["text"], text);

    // A stop string that spans tokens (two characters of one, two of the next) ends the text
    // before it, whole and streamed.
    let toks: Vec<&str> = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    let i = (1..toks.len() - 1)
        .find(|&i| toks[i].chars().count() >= 2 && toks[i + 1].chars().count() >= 2)
        .expect("two neighbouring tokens of two characters");
    let tail: String = toks[i].chars().skip(toks[i].chars().count() - 2).collect();
    let head: String = toks[i + 1].chars().take(2).collect();
    let stop = format!("{tail}{head}");
    let cut = toks[..=i].iter().map(|t| t.len()).sum::<usize>() - tail.len();
    assert_eq!(text.find(&stop), Some(cut), "pick another stop string");
    let kept = &text[..cut];
    let v = complete(json!({"stop": [stop.clone(), "never appears"]})).json();
    assert_eq!(v["choices"][0]["text"], kept);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let r = complete(json!({"stop": stop, "stream": true}));
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = (events[..events.len() - 1].iter())
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed: String = (chunks.iter())
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, kept);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    // echo: the prompt, then the completion.
    let v = complete(json!({"echo": true})).json();
    assert_eq!(v["choices"][0]["text"], format!("{prompt}{text}"));

    // Streamed with log-probabilities and a stop string: the chunks' tokens are the whole
    // answer's, and their offsets count the tokens' text, also while text is held back.
    let r = complete(json!({"logprobs": 1, "stream": true, "stop": stop.clone()}));
    let events = r.events();
    let chunks: Vec<Value> = (events[..events.len() - 1].iter())
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut seen = String::new();
    for c in &chunks {
        let lp = &c["choices"][0]["logprobs"];
        if lp.is_null() {
            continue;
        }
        for (t, at) in lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .zip(lp["text_offset"].as_array().unwrap())
        {
            assert_eq!(at.as_u64().unwrap() as usize, seen.chars().count(), "{c}");
            seen.push_str(t.as_str().unwrap());
        }
    }
    assert!(seen.starts_with(kept) && seen.contains(&stop), "{seen:?}");
}

#[test]
fn sampling_is_seeded_and_end_tokens_stop() {
    let server = Server::default_model(&[], &[]);
    let ask = |seed: u64| {
        let r = server.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Write a word."}], "max_tokens": 12,
                    "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": seed}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        chat_content(&r.json())
    };
    assert_eq!(ask(5), ask(5));
    let texts: std::collections::HashSet<String> = (1..=4).map(ask).collect();
    assert!(texts.len() > 1, "four seeds gave one text: {texts:?}");
    // A short answer ends at the model's end-of-turn token, which is not in the text.
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                "max_tokens": 40, "temperature": 0}),
    );
    let v = r.json();
    let content = chat_content(&v);
    assert!(content.contains("Paris"), "{v}");
    assert!(!content.contains("<|im_end|>"), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // ignore_eos: past the end token, to max_tokens.
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                "max_tokens": 40, "temperature": 0, "ignore_eos": true}),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 40);
    assert!(chat_content(&v).starts_with(&content), "{v}");
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let mut server = Server::default_model(&["--max-body-bytes", "4096"], &[]);
    let chat = |body: &str| {
        request(
            &server.addr,
            "POST",
            "/v1/chat/completions",
            &[],
            body.as_bytes(),
        )
    };
    chat("{not json").assert_error(400, "not valid JSON");
    chat("").assert_error(400, "not valid JSON");
    chat(r#"{"messages": "hello"}"#).assert_error(400, "does not match");
    chat(r#"{"messages": [{"role":"user","content":"hi"}], "max_tokens": "ten"}"#)
        .assert_error(400, "does not match");
    chat(r#"{"messages": [{"role":"user","content":"hi"}], "temperature": true}"#)
        .assert_error(400, "does not match");
    chat(r#"{"messages": []}"#).assert_error(400, "at least one message");
    chat(r#"{"messages": [{"role":"robot","content":"hi"}]}"#).assert_error(400, "robot");
    chat(r#"{"messages": [{"role":"user","content":"hi"}], "n": 3}"#)
        .assert_error(400, "n must be 1");
    let v = chat(r#"{"messages": [{"role":"user","content":"hi"}], "max_tokens": 100000}"#)
        .assert_error(400, "context");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // A body over --max-body-bytes.
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(10_000)}]});
    let v = chat(&big.to_string()).assert_error(413, "");
    assert_eq!(v["error"]["code"], "request_too_large");
    let complete = |body: &str| {
        request(
            &server.addr,
            "POST",
            "/v1/completions",
            &[],
            body.as_bytes(),
        )
    };
    complete(r#"{"prompt": [1, 99999999]}"#).assert_error(400, "outside the vocabulary");
    complete(r#"{"prompt": ["a", "b"]}"#).assert_error(400, "one prompt");
    complete(r#"{"prompt": ""}"#).assert_error(400, "empty");
    complete(r#"{"prompt": "x", "logprobs": 50}"#).assert_error(400, "logprobs");
    complete(r#"{"prompt": "x", "stop": ["a","b","c","d","e"]}"#).assert_error(400, "stop");
    // Not declared JSON (what a web page's cross-origin "simple" request must send).
    let plain = request(
        &server.addr,
        "POST",
        "/v1/completions",
        &[("Content-Type", "text/plain")],
        br#"{"prompt": "hi"}"#,
    );
    let v = plain.assert_error(415, "application/json");
    assert_eq!(v["error"]["code"], "unsupported_media_type");
    server.get("/v2/nothing").assert_error(404, "no route");
    request(&server.addr, "DELETE", "/v1/models", &[], b"").assert_error(405, "DELETE");
    server
        .get("/v1/models/other")
        .assert_error(404, "does not exist");
    // A request line that is not HTTP at all: the connection is answered or closed, not hung.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"\x00\x01garbage\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    server.assert_alive();
    let models = server.get("/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["object"], "model");
}

#[test]
fn the_api_key_guards_every_route_but_health() {
    let server = Server::default_model(&[], &[("AMK_API_KEY", "s3cret")]);
    let get = |path: &str, key: Option<&str>| {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        request(&server.addr, "GET", path, &headers, b"")
    };
    assert_eq!(get("/health", None).status, 200);
    for path in ["/v1/models", "/metrics", "/v1/nothing"] {
        let v = get(path, None).assert_error(401, "API key");
        assert_eq!(v["error"]["code"], "invalid_api_key");
        get(path, Some("wrong")).assert_error(401, "API key");
    }
    assert_eq!(get("/v1/models", Some("s3cret")).status, 200);
    assert_eq!(get("/metrics", Some("s3cret")).status, 200);
    let r = request(
        &server.addr,
        "POST",
        "/v1/completions",
        &[],
        br#"{"prompt": "hi", "max_tokens": 1}"#,
    );
    r.assert_error(401, "API key");
}

/// Opens a streaming completion and returns the connection once its first text chunk came.
/// Sends a text completion request and returns the connection, its answer unread.
fn send_completion(addr: &str, body: &Value) -> TcpStream {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

fn open_stream(addr: &str, max_tokens: u32) -> TcpStream {
    let mut s = send_completion(
        addr,
        &json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
                "stream": true}),
    );
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: {") {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

#[test]
fn a_full_queue_answers_429_and_a_disconnect_cancels() {
    let server = Server::default_model(&["--queue", "1"], &[]);
    // A long generation runs; one request waits in the queue; the next is refused.
    let running = open_stream(&server.addr, 200);
    let addr = server.addr.clone();
    let waiting = std::thread::spawn(move || {
        request(
            &addr,
            "POST",
            "/v1/completions",
            &[],
            br#"{"prompt": "Hello", "max_tokens": 4, "temperature": 0}"#,
        )
    });
    let t0 = Instant::now();
    while server.metric("amk_queue_depth") < 2.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the request never queued"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = server
        .post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 4}))
        .assert_error(429, "busy");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    // The client of the long generation leaves: it stops at its next token, and the waiting
    // request runs.
    drop(running);
    let r = waiting.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let generated = server.metric("amk_generated_tokens_total");
    assert!(
        generated < 100.0,
        "{generated} tokens generated: the disconnected stream was not cancelled"
    );
    let text = server.get("/metrics").body;
    assert!(text.contains("amk_http_requests_total{route=\"/v1/completions\",status=\"429\"} 1"));
    assert!(text.contains("amk_time_to_first_token_seconds_count"));
}

#[test]
fn a_whole_request_whose_client_leaves_is_cancelled() {
    let server = Server::default_model(&[], &[]);
    let s = send_completion(
        &server.addr,
        &json!({"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}),
    );
    let t0 = Instant::now();
    while server.metric("amk_generated_tokens_total") < 2.0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no token came");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);
    while server.metric("amk_queue_depth") > 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the generation never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let generated = server.metric("amk_generated_tokens_total");
    assert!(generated < 100.0, "{generated} tokens: not cancelled");
}

/// Percentile `p` (0..=100) of `v` (sorted here).
fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p / 100.0).round() as usize]
}

/// One streamed completion: (time to its first text chunk, total time, its text).
fn timed_completion(addr: &str) -> (f64, f64, String) {
    let t0 = Instant::now();
    let mut s = send_completion(
        addr,
        &json!({"prompt": "hello hello", "max_tokens": 8, "temperature": 0, "stream": true}),
    );
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let mut first = None;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if first.is_none() && String::from_utf8_lossy(&raw).contains("data: {") {
            first = Some(t0.elapsed().as_secs_f64());
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let reply = parse_reply(&raw);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = reply.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let text: String = (events[..events.len() - 1].iter())
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    (first.unwrap_or(total), total, text)
}

/// 200 sequential requests, then 16 concurrent clients × 10: nothing lost, the same greedy
/// text every time; prints p50/p99 time to first token and tokens/s (a tiny model, so the
/// server's own overheads are what is measured).
#[test]
fn load_loses_nothing_and_answers_alike() {
    let d = tiny::tiny_with_tokenizer("tiny-mqa", "serve-load");
    let server = Server::start(&["--model", d.to_str().unwrap()], &[]);
    let t0 = Instant::now();
    let sequential: Vec<_> = (0..200).map(|_| timed_completion(&server.addr)).collect();
    let seq_s = t0.elapsed().as_secs_f64();
    let want = sequential[0].2.clone();
    assert!(sequential.iter().all(|r| r.2 == want), "texts differ");
    let t1 = Instant::now();
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let addr = server.addr.clone();
            std::thread::spawn(move || (0..10).map(|_| timed_completion(&addr)).collect::<Vec<_>>())
        })
        .collect();
    let concurrent: Vec<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let conc_s = t1.elapsed().as_secs_f64();
    assert_eq!(concurrent.len(), 160);
    assert!(concurrent.iter().all(|r| r.2 == want), "texts differ");
    let tokens = server.metric("amk_generated_tokens_total");
    assert_eq!(tokens, 8.0 * 360.0, "every request generated its 8 tokens");
    for (name, runs, secs) in [
        ("sequential", &sequential, seq_s),
        ("16 clients", &concurrent, conc_s),
    ] {
        let mut ttft: Vec<f64> = runs.iter().map(|r| r.0).collect();
        eprintln!(
            "load, {name}: {} requests in {secs:.2} s, time to first token p50 {:.1} ms, p99 {:.1} ms, {:.0} generated tok/s",
            runs.len(),
            percentile(&mut ttft, 50.0) * 1e3,
            percentile(&mut ttft, 99.0) * 1e3,
            8.0 * runs.len() as f64 / secs
        );
    }
}

/// The official `openai` Python client against the server (`cli/tests/python`). Skipped,
/// visibly, where Python lacks `openai` or `pytest`, unless `AMK_REQUIRE_PYTHON=1` (CI sets
/// it after installing them).
#[test]
fn openai_python_client() {
    let have = Command::new("python3")
        .args(["-c", "import openai, pytest"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("AMK_REQUIRE_PYTHON").as_deref() != Ok("1"),
            "AMK_REQUIRE_PYTHON=1 but python3 cannot import openai and pytest"
        );
        eprintln!(
            "SKIPPED openai_python_client: python3 with `openai` and `pytest` is needed (pip install openai pytest)"
        );
        return;
    }
    let server = Server::default_model(&[], &[]);
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python");
    let o = Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"])
        .arg(&tests)
        .env("AMK_SERVER_URL", format!("http://{}", server.addr))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "pytest failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Every test ran: none skipped, none missing.
    assert!(
        out.contains("8 passed") && !out.contains("skipped"),
        "{out}"
    );
}
