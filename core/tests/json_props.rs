//! Property: every JSON value the writer prints, the parser reads back as the same value
//! (`parse(to_pretty(v)) == v`), for values of every kind nested to any depth — strings of any
//! Unicode (escapes, surrogate pairs), integers across `i64`, finite floats of any magnitude,
//! objects with their keys in order. Programs and patches are written and read through this
//! pair, so a value that did not round-trip would change a program on its way to disk.

use amk_core::json::{Map, Value, parse, to_pretty};
use proptest::prelude::*;

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::Float),
        any::<String>().prop_map(Value::Str),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(Map(m.into_iter().collect()))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn printed_json_parses_back_to_the_same_value(v in value()) {
        let text = to_pretty(&v);
        let back = parse(&text);
        prop_assert!(back.is_ok(), "{text}: {:?}", back.err());
        prop_assert_eq!(back.ok(), Some(v));
    }
}
