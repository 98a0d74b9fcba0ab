//! The decode loop's interface: the buffers a decode program exposes to the engine that runs
//! it, by name, and the layout of its control inputs.
//!
//! A lowering that emits a decode program with a step loop ([`crate::StepLoop`]) names its
//! buffers so; an engine drives any such program through these names alone, whatever the
//! architecture behind it. One pass feeds `TOKEN` at position `POS`, produces `LOGITS`, and
//! its tail (the NEXT_TOKEN op) picks the next token — the prompt's next one while the prompt
//! lasts, else a sampled one, recorded in `EMITTED` — advances `POS` and sets `HALT`.

/// STATE I32 `[1]`: the token the next pass feeds.
pub const TOKEN: &str = "token_id";
/// STATE I32 `[1]` (IO_INPUT in a program without a loop): the next pass's position.
pub const POS: &str = "pos";
/// IO_INPUT I32 `[max_seq]`: the sequence's known tokens (the prompt), by position.
pub const PROMPT: &str = "prompt";
/// IO_INPUT I32 `[stop slots]`: stop token ids, negative entries unused.
pub const STOP: &str = "stop";
/// IO_INPUT I32 `[LIMITS_LEN]`: see the `LIMIT_*` indices.
pub const LIMITS: &str = "limits";
/// IO_INPUT F32 `[SAMPLING_LEN]`: see the `SAMPLING_*` indices.
pub const SAMPLING: &str = "sampling";
/// STATE I32 `[1]`: non-zero after a pass ends the loop (the step loop's halt word).
pub const HALT: &str = "halt";
/// STATE I32 `[max_seq, 2]`, host-mapped: row `q` = (token id, f32 bits of its
/// log-probability) for every sampled token at position `q`.
pub const EMITTED: &str = "emitted";
/// IO_OUTPUT float `[1, vocab]`: the last pass's logits.
pub const LOGITS: &str = "logits";
/// IO_INPUT I32 `[1]` = 0: the row reshape bridges embed (unfused programs).
pub const RESHAPE_ID: &str = "reshape_id0";

/// `limits[LIMIT_PROMPT_LEN]`: positions below it are teacher-forced from `PROMPT`.
pub const LIMIT_PROMPT_LEN: usize = 0;
/// `limits[LIMIT_END]`: the loop halts once the sequence holds this many tokens.
pub const LIMIT_END: usize = 1;
/// `limits[LIMIT_TOP_K]`: top-k (0 = off).
pub const LIMIT_TOP_K: usize = 2;
/// `limits[LIMIT_SEED_LO]`, `limits[LIMIT_SEED_HI]`: the sampler's 64-bit seed.
pub const LIMIT_SEED_LO: usize = 3;
/// See [`LIMIT_SEED_LO`].
pub const LIMIT_SEED_HI: usize = 4;
/// `limits[LIMIT_VOCAB]`: ids at or above it are never chosen (0 = the logits' width).
pub const LIMIT_VOCAB: usize = 5;
/// Elements of `LIMITS`.
pub const LIMITS_LEN: u64 = 6;

/// `sampling[SAMPLING_TEMPERATURE]`: ≤ 0 (or not finite) is greedy.
pub const SAMPLING_TEMPERATURE: usize = 0;
/// `sampling[SAMPLING_TOP_P]`: nucleus mass (≥ 1 = off).
pub const SAMPLING_TOP_P: usize = 1;
/// Elements of `SAMPLING`.
pub const SAMPLING_LEN: u64 = 2;

/// What an input of the decode interface holds, in a line (for messages that name a missing
/// input); `None` for a name outside the interface.
pub fn input_meaning(name: &str) -> Option<&'static str> {
    Some(match name {
        TOKEN => "the token this pass feeds",
        POS => "this pass's position, from 0",
        PROMPT => "the prompt's token ids, by position",
        STOP => "stop token ids, negative entries unused",
        LIMITS => "prompt length, end, top-k, seed (low, high), vocabulary limit",
        SAMPLING => "temperature, top-p",
        RESHAPE_ID => "the row the reshape bridges embed: always 0",
        _ => return None,
    })
}

/// The value an input of the decode interface always has, when it has one: a front end that
/// runs a program by hand (`amk run`) sets it unless told otherwise.
pub fn input_default(name: &str) -> Option<i64> {
    (name == RESHAPE_ID).then_some(0)
}

/// Index of the largest logit (lowest index on ties; NaN never wins) — the rule of
/// SAMPLE_ARGMAX, NEXT_TOKEN's greedy choice and `torch.argmax` on finite logits.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &x) in logits.iter().enumerate() {
        if x > bv {
            bv = x;
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_fixed_input_has_a_default_and_every_input_a_meaning() {
        for name in [TOKEN, POS, PROMPT, STOP, LIMITS, SAMPLING, RESHAPE_ID] {
            assert!(input_meaning(name).is_some(), "{name}");
            assert_eq!(input_default(name).is_some(), name == RESHAPE_ID, "{name}");
        }
        assert_eq!(input_default(RESHAPE_ID), Some(0));
        assert_eq!(input_meaning("x"), None);
        assert_eq!(input_meaning(LOGITS), None, "an output, not an input");
    }
}
