//! libFuzzer on [`amk_fuzz_targets::safetensors`] (`docs/fuzzing.md`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| amk_fuzz_targets::safetensors(data));
