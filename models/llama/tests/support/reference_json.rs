//! Reading the reference files' JSON (`tests/reference/*.json`), shared by the tokenizer tests
//! (included by path).

use amk_core::json::Value;

/// `v[key]`; a missing key fails the test naming it.
pub fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_object()
        .and_then(|o| o.get(key))
        .unwrap_or_else(|| panic!("reference file: missing '{key}'"))
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| {
            x.as_i64()
                .and_then(|i| u32::try_from(i).ok())
                .expect("a token id")
        })
        .collect()
}
