//! libFuzzer on [`amk_fuzz_targets::program`] (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| amk_fuzz_targets::program(data));
