//! Chat templates rendered as transformers renders them: real checkpoints' templates (Llama
//! 3.1, Qwen3, Qwen2.5, Mistral Nemo) on twelve conversations each, with and without the
//! generation prompt, against `tests/reference/chat_template_cases.json` (written by
//! transformers' own renderer, `tests/reference/chat_template_reference.py`), refusals
//! included; and the calendar arithmetic behind `strftime_now`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/messages.rs"]
mod messages;
use amk_core::json::Value;
use amk_model_llama::ModelError;
use amk_model_llama::chat::{Conversation, DateTime, from_unix, render, strftime};

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_object()
        .and_then(|o| o.get(key))
        .unwrap_or_else(|| panic!("chat_template_cases.json: no '{key}'"))
}

fn text(v: &Value) -> &str {
    v.as_str().expect("a string")
}

#[test]
fn chat_templates_match_transformers() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/reference/chat_template_cases.json");
    let doc = amk_core::json::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let templates = get(&doc, "templates").as_object().unwrap();
    let cases = get(&doc, "cases").as_array().unwrap();
    assert!(cases.len() >= 4 * 20, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = text(get(case, "template"));
        let t = templates.get(name).unwrap();
        let messages = messages::message_pairs(get(case, "messages"));
        let add = matches!(get(case, "add_generation_prompt"), Value::Bool(true));
        let got = render(
            text(get(t, "template")),
            &Conversation {
                messages: &messages,
                add_generation_prompt: add,
                bos_token: Some(text(get(t, "bos_token"))),
                eos_token: Some(text(get(t, "eos_token"))),
            },
        );
        let obj = case.as_object().unwrap();
        let ok = match (obj.get("rendered"), obj.get("raises"), &got) {
            (Some(want), _, Ok(g)) => g == text(want),
            (_, Some(why), Err(ModelError::Tokenizer(m))) => m.contains(text(why)),
            _ => false,
        };
        if !ok {
            failures.push(format!(
                "{name} {messages:?} add={add}: got {got:?}, transformers {:?}",
                obj.get("rendered").or(obj.get("raises"))
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `strftime_now`'s calendar: Unix times to UTC dates (a leap day, the epoch, before it) and
/// the directives templates use, as Python's `strftime` writes them.
#[test]
fn strftime_follows_python() {
    let t = from_unix(1_721_999_109);
    assert_eq!(
        t,
        DateTime {
            ymd: (2024, 7, 26),
            hms: (13, 5, 9)
        }
    );
    assert_eq!(
        strftime("%d %b %Y|%B %m %y %H:%M:%S %%", t),
        "26 Jul 2024|July 07 24 13:05:09 %"
    );
    assert_eq!(from_unix(951_868_799).ymd, (2000, 2, 29));
    assert_eq!(from_unix(0).ymd, (1970, 1, 1));
    assert_eq!(from_unix(-86_400).ymd, (1969, 12, 31));
    assert_eq!(
        strftime("%q", t),
        "%q",
        "unknown directives stay as written"
    );
}
