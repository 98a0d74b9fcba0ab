//! The example schedule shipped in `docs/examples/` (the README's run command validates it)
//! is exactly what the Llama-shaped generator produces, and it validates. Regenerate it with
//! `AMK_BLESS=1 cargo test -p amk-conformance --test examples`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test file: a broken fixture aborts it

use amk_conformance::{LlamaConfig, llama_like_with};
use amk_core::{Program, validate};
use std::path::PathBuf;

fn example() -> Program {
    // Toy 2-layer Llama (H64, 4 query / 2 KV heads of 16, I128, V256), 32-wide GEMV tiles,
    // decode at position 5 with 2 split-KV shards, round-robin SMs on an H100, shared pages.
    let mut cfg = LlamaConfig::new(2, 64, 4, 2, 16, 128, 256, 32);
    cfg.pos = 5;
    cfg.max_seq = 64;
    cfg.split_kv = 2;
    cfg.sm_round_robin = true;
    cfg.pages = true;
    llama_like_with(&cfg)
}

#[test]
fn shipped_example_is_current_and_valid() {
    let reg = amk_ops::registry().unwrap();
    let p = example();
    let r = validate(&p, &reg);
    assert!(r.ok(), "{}", r.report());
    let text = p.to_json(&reg).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/toy-llama-2l.json");
    if std::env::var_os("AMK_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let shipped = std::fs::read_to_string(&path).expect("docs/examples/toy-llama-2l.json");
    assert_eq!(shipped, text, "regenerate with AMK_BLESS=1");
    let back = Program::load(&path, &reg).unwrap();
    assert_eq!(back, p);
}
