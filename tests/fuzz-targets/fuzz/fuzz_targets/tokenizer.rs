//! libFuzzer on [`amk_fuzz_targets::tokenizer`] (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| amk_fuzz_targets::tokenizer(data));
