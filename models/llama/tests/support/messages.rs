//! A conversation as the reference files write it (`[[role, content], ..]`), shared by the
//! tokenizer's and the chat templates' tests (included by path).

use amk_core::json::Value;

/// The `(role, content)` pairs of a `[[role, content], ..]` array.
pub fn message_pairs(v: &Value) -> Vec<(&str, &str)> {
    v.as_array()
        .expect("messages: an array")
        .iter()
        .map(|m| {
            let pair = m.as_array().expect("a [role, content] pair");
            (as_str(&pair[0]), as_str(&pair[1]))
        })
        .collect()
}

fn as_str(v: &Value) -> &str {
    v.as_str().expect("a string")
}
