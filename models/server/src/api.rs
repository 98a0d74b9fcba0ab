//! The OpenAI wire format: request bodies as they arrive (fields of the wrong type are refused
//! by the parser; fields amk does not know are ignored, as clients send many) and the checks
//! that turn one into a [`Plan`]: what to generate, how, and when to stop.

use crate::error::ApiError;
use amk_engine::{MAX_TOP_LOGPROBS, Sampling};
use serde::Deserialize;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// A message's `content`: a string, or a list of parts of which amk reads the text ones.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (`{"type": "text", "text": ...}`).
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// The part's type: only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (or `developer`, read as `system`).
    pub role: String,
    /// Its text.
    pub content: Option<Content>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the token counts before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and stopping fields that chat and text completions share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// The model's name: any name is accepted (the server has one model); it is read so that
    /// one that is not a string is refused like any other mistyped field.
    #[allow(dead_code)]
    pub model: Option<String>,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Tokens to generate at most (default: what the KV cache has room for).
    pub max_tokens: Option<u64>,
    /// Sampling temperature in [0, 2] (default 1; 0 is greedy).
    pub temperature: Option<f64>,
    /// Nucleus mass in (0, 1] (default 1).
    pub top_p: Option<f64>,
    /// Keep the K most likely tokens (0: all; an extension many servers accept).
    pub top_k: Option<i64>,
    /// The sampler's seed (the same seed gives the same text).
    pub seed: Option<i64>,
    /// Up to 4 stop strings.
    pub stop: Option<Stop>,
    /// Choices to generate: only 1.
    pub n: Option<u64>,
    /// Unsupported unless 0.
    pub presence_penalty: Option<f64>,
    /// Unsupported unless 0.
    pub frequency_penalty: Option<f64>,
    /// Unsupported unless empty.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Generate past the model's end tokens (an extension, as other local servers have: a
    /// benchmark's fixed number of tokens).
    pub ignore_eos: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Also `max_completion_tokens`, the newer name of `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Return each token's log-probability.
    pub logprobs: Option<bool>,
    /// And this many most likely alternatives at each position (0..=20; needs `logprobs`).
    pub top_logprobs: Option<u64>,
    /// Tools are not supported.
    pub tools: Option<serde_json::Value>,
    /// Fields shared with text completions.
    #[serde(flatten)]
    pub common: Common,
}

/// A text completion's `prompt`: a string, or token ids, or a list of one of those.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// A list of texts (only one is supported).
    Texts(Vec<String>),
    /// A list of token-id lists (only one is supported).
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Return the log-probabilities of each token and of this many most likely alternatives
    /// (0..=20).
    pub logprobs: Option<u64>,
    /// Return the prompt before the completion.
    pub echo: Option<bool>,
    /// Unsupported unless 1.
    pub best_of: Option<u64>,
    /// Unsupported.
    pub suffix: Option<String>,
    /// Fields shared with chat completions.
    #[serde(flatten)]
    pub common: Common,
}

/// What a request asks for, checked: everything but the prompt's tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `max_tokens` as asked (`None`: what the cache has room for).
    pub max_tokens: Option<u64>,
    /// How to sample.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// `None`: no log-probabilities; `Some(k)`: each token's and `k` alternatives.
    pub logprobs: Option<usize>,
    /// Stream the answer.
    pub stream: bool,
    /// Send the token counts in a last chunk of a stream.
    pub include_usage: bool,
    /// Generate past end tokens.
    pub ignore_eos: bool,
}

/// Stop strings a request may give at most (OpenAI's bound).
pub const MAX_STOPS: usize = 4;

/// The longest stop string accepted, in bytes.
pub const MAX_STOP_BYTES: usize = 256;

impl Common {
    /// Checks the shared fields; `logprobs` is what the endpoint's own fields asked for.
    /// `seed`: the seed to use when the request names none (a fresh one per request, so
    /// unseeded sampling differs from call to call as users expect).
    pub fn plan(&self, logprobs: Option<usize>, seed: u64) -> Result<Plan, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(
                Some("n"),
                "n must be 1: the server decodes one sequence at a time",
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::invalid(
                    Some(name),
                    format!("{name} is not supported (only 0)"),
                ));
            }
        }
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid(
                Some("logit_bias"),
                "logit_bias is not supported",
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                "max_tokens must be at least 1",
            ));
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                Some("temperature"),
                format!("temperature {temperature} must be in [0, 2]"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        // Checked as the sampler will see it (an f32: 1e-46 would become 0).
        if !(top_p as f32 > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                Some("top_p"),
                format!("top_p {top_p} must be in (0, 1]"),
            ));
        }
        let top_k = self.top_k.unwrap_or(0);
        let top_k = u32::try_from(top_k)
            .ok()
            .filter(|&k| i32::try_from(k).is_ok())
            .ok_or_else(|| {
                ApiError::invalid(Some("top_k"), format!("top_k {top_k} must be in [0, 2^31)"))
            })?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::invalid(
                Some("stop"),
                format!("at most {MAX_STOPS} stop strings, got {}", stop.len()),
            ));
        }
        if stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid(
                Some("stop"),
                format!("a stop string is longer than {MAX_STOP_BYTES} bytes"),
            ));
        }
        Ok(Plan {
            max_tokens: self.max_tokens,
            sampling: Sampling {
                temperature: temperature as f32,
                top_p: top_p as f32,
                top_k,
                seed: self.seed.map_or(seed, |s| s as u64),
            },
            stop,
            logprobs,
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            ignore_eos: self.ignore_eos.unwrap_or(false),
        })
    }
}

/// `top_logprobs` / `logprobs` as a count of alternatives, checked against the bound.
fn alternatives(param: &str, k: u64) -> Result<usize, ApiError> {
    usize::try_from(k)
        .ok()
        .filter(|&k| k <= MAX_TOP_LOGPROBS)
        .ok_or_else(|| {
            ApiError::invalid(
                Some(param),
                format!("{param} must be in [0, {MAX_TOP_LOGPROBS}], got {k}"),
            )
        })
}

impl ChatRequest {
    /// The checked plan of a chat request.
    pub fn plan(&self, seed: u64) -> Result<Plan, ApiError> {
        let no_tools =
            |t: &serde_json::Value| t.is_null() || t.as_array().is_some_and(Vec::is_empty);
        if self.tools.as_ref().is_some_and(|t| !no_tools(t)) {
            return Err(ApiError::invalid(Some("tools"), "tools are not supported"));
        }
        let top = self.top_logprobs.map(|k| alternatives("top_logprobs", k));
        let logprobs = match (self.logprobs.unwrap_or(false), top) {
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "top_logprobs needs logprobs: true",
                ));
            }
            (false, None) => None,
            (true, None) => Some(0),
            (true, Some(k)) => Some(k?),
        };
        let mut common = self.common.clone();
        if common.max_tokens.is_none() {
            common.max_tokens = self.max_completion_tokens;
        }
        common.plan(logprobs, seed)
    }

    /// The conversation as (role, text) pairs for the chat template; refuses an empty one,
    /// unknown roles and non-text content.
    pub fn turns(&self) -> Result<Vec<(String, String)>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                Some("messages"),
                "messages must hold at least one message",
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "system" | "developer" => "system",
                    "user" => "user",
                    "assistant" => "assistant",
                    other => {
                        return Err(ApiError::invalid(
                            Some("messages"),
                            format!(
                                "messages[{i}].role '{other}' is not one of system, developer, user, assistant"
                            ),
                        ));
                    }
                };
                Ok((role.to_string(), message_text(i, m)?))
            })
            .collect()
    }
}

fn message_text(i: usize, m: &Message) -> Result<String, ApiError> {
    match &m.content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t.clone()),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            Some("messages"),
                            format!(
                                "messages[{i}]: content parts of type '{kind}' are not supported (text only)"
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
    }
}

/// A text completion's prompt, resolved to text or ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text to encode.
    Text(String),
    /// Token ids as given.
    Ids(Vec<u32>),
}

impl CompletionRequest {
    /// The checked plan of a text completion.
    pub fn plan(&self, seed: u64) -> Result<Plan, ApiError> {
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid(
                Some("best_of"),
                "best_of must be 1: the server decodes one sequence at a time",
            ));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid(Some("suffix"), "suffix is not supported"));
        }
        let logprobs = self
            .logprobs
            .map(|k| alternatives("logprobs", k))
            .transpose()?;
        self.common.plan(logprobs, seed)
    }

    /// The one prompt (a list must hold exactly one).
    pub fn input(&self) -> Result<PromptInput, ApiError> {
        let one = |n: usize| {
            ApiError::invalid(
                Some("prompt"),
                format!("prompt must be one prompt; a list of {n} was given"),
            )
        };
        let input = match &self.prompt {
            Prompt::Text(t) => PromptInput::Text(t.clone()),
            Prompt::Ids(ids) => PromptInput::Ids(ids.clone()),
            Prompt::Texts(v) if v.len() == 1 => PromptInput::Text(v[0].clone()),
            Prompt::IdLists(v) if v.len() == 1 => PromptInput::Ids(v[0].clone()),
            Prompt::Texts(v) => return Err(one(v.len())),
            Prompt::IdLists(v) => return Err(one(v.len())),
        };
        match &input {
            PromptInput::Text(t) if t.is_empty() => {
                Err(ApiError::invalid(Some("prompt"), "prompt is empty"))
            }
            PromptInput::Ids(ids) if ids.is_empty() => Err(ApiError::invalid(
                Some("prompt"),
                "prompt holds no token ids",
            )),
            _ => Ok(input),
        }
    }
}

/// Parses a request body, turning serde's message into a 400.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not valid JSON"
        } else {
            "the body does not match the request format"
        };
        ApiError::invalid(None, format!("{what}: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn chat(body: &str) -> Result<Plan, ApiError> {
        parse::<ChatRequest>(body.as_bytes())?.plan(7)
    }

    #[test]
    fn defaults_follow_openai() {
        let p = chat(r#"{"model":"x","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.sampling.top_p, 1.0);
        assert_eq!(p.sampling.seed, 7);
        assert_eq!(p.max_tokens, None);
        assert!(!p.stream && p.logprobs.is_none());
    }

    #[test]
    fn every_field_is_read() {
        let p = chat(
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0,
                "top_p":0.5,"top_k":3,"seed":11,"stop":["a","b"],"n":1,"stream":true,
                "stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,
                "unknown_field":{"ignored":true}}"#,
        )
        .unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!(p.sampling.temperature, 0.0);
        assert_eq!(p.sampling.top_p, 0.5);
        assert_eq!(p.sampling.top_k, 3);
        assert_eq!(p.sampling.seed, 11);
        assert_eq!(p.stop, vec!["a".to_string(), "b".to_string()]);
        assert!(p.stream && p.include_usage);
        assert_eq!(p.logprobs, Some(2));
    }

    #[rstest]
    #[case::not_json("{", "not valid JSON")]
    #[case::wrong_type(r#"{"messages":[],"max_tokens":"many"}"#, "does not match")]
    #[case::missing_messages(r#"{"model":"x"}"#, "does not match")]
    #[case::n(r#"{"messages":[],"n":2}"#, "n must be 1")]
    #[case::temperature(r#"{"messages":[],"temperature":3}"#, "temperature")]
    #[case::top_p(r#"{"messages":[],"top_p":0}"#, "top_p")]
    #[case::top_k(r#"{"messages":[],"top_k":-1}"#, "top_k")]
    #[case::max_tokens(r#"{"messages":[],"max_tokens":0}"#, "at least 1")]
    #[case::negative_max_tokens(r#"{"messages":[],"max_tokens":-1}"#, "does not match")]
    #[case::stops(r#"{"messages":[],"stop":["a","b","c","d","e"]}"#, "at most 4")]
    #[case::top_logprobs(r#"{"messages":[],"logprobs":true,"top_logprobs":21}"#, "[0, 20]")]
    #[case::top_without_logprobs(r#"{"messages":[],"top_logprobs":2}"#, "needs logprobs")]
    #[case::penalty(r#"{"messages":[],"presence_penalty":0.5}"#, "not supported")]
    #[case::tools(r#"{"messages":[],"tools":[{"type":"function"}]}"#, "tools")]
    #[case::tiny_top_p(r#"{"messages":[],"top_p":1e-46}"#, "top_p")]
    fn bad_chat_requests_are_400s(#[case] body: &str, #[case] needle: &str) {
        let e = chat(body).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains(needle), "{}", e.message);
    }

    #[test]
    fn turns_read_text_parts_and_refuse_the_rest() {
        let r: ChatRequest = parse(
            br#"{"messages":[{"role":"developer","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            r.turns().unwrap(),
            vec![
                ("system".to_string(), "be brief".to_string()),
                ("user".to_string(), "ab".to_string())
            ]
        );
        for body in [
            r#"{"messages":[]}"#,
            r#"{"messages":[{"role":"wizard","content":"x"}]}"#,
            r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
        ] {
            let r: ChatRequest = parse(body.as_bytes()).unwrap();
            assert!(r.turns().is_err(), "{body}");
        }
    }

    #[test]
    fn completion_prompts_are_one_text_or_one_id_list() {
        let input = |body: &str| parse::<CompletionRequest>(body.as_bytes())?.input();
        assert_eq!(
            input(r#"{"prompt":"hi"}"#).unwrap(),
            PromptInput::Text("hi".into())
        );
        assert_eq!(
            input(r#"{"prompt":["hi"]}"#).unwrap(),
            PromptInput::Text("hi".into())
        );
        assert_eq!(
            input(r#"{"prompt":[1,2]}"#).unwrap(),
            PromptInput::Ids(vec![1, 2])
        );
        assert_eq!(
            input(r#"{"prompt":[[3]]}"#).unwrap(),
            PromptInput::Ids(vec![3])
        );
        assert!(input(r#"{"prompt":["a","b"]}"#).is_err());
        assert!(input(r#"{"prompt":""}"#).is_err());
        assert!(input(r#"{"prompt":[]}"#).is_err());
        let plan = |body: &str| parse::<CompletionRequest>(body.as_bytes())?.plan(0);
        assert_eq!(
            plan(r#"{"prompt":"x","logprobs":3}"#).unwrap().logprobs,
            Some(3)
        );
        assert!(plan(r#"{"prompt":"x","best_of":2}"#).is_err());
        assert!(plan(r#"{"prompt":"x","suffix":"y"}"#).is_err());
    }
}
