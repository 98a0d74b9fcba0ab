//! How the next token is chosen: the settings the device's sampler reads (the NEXT_TOKEN op,
//! `amk_core::decode::SAMPLING` and `LIMITS`).

use crate::EngineError;

/// Sampling settings. Greedy (the default) picks the most likely token; otherwise tokens are
/// drawn from the softmax of `logits / temperature`, restricted to the `top_k` most likely
/// and to the smallest set whose probability reaches `top_p`, by a generator seeded with
/// `seed` and the position: the same seed gives the same text on every run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 is greedy; otherwise > 0.
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps every token.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 keeps every token.
    pub top_k: u32,
    /// The sampler's seed.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::greedy()
    }
}

impl Sampling {
    /// Greedy decoding.
    pub const fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }

    /// Checks the ranges: a finite temperature ≥ 0, `top_p` in (0, 1], `top_k` below 2^31.
    pub fn check(&self) -> Result<(), EngineError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(EngineError::Request(format!(
                "temperature {} must be a finite number >= 0",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::Request(format!(
                "top-p {} must be in (0, 1]",
                self.top_p
            )));
        }
        if i32::try_from(self.top_k).is_err() {
            return Err(EngineError::Request(format!(
                "top-k {} must be below 2^31",
                self.top_k
            )));
        }
        Ok(())
    }
}
