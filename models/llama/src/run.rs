//! Host-driven decoding: one forward pass per token on any [`Backend`], the KV cache living in
//! the session between passes.
//!
//! The program is lowered and validated once; moving to the next position patches its
//! position params through [`ValidatedProgram::check_patch`] (so every pass runs a program the
//! validator accepted) and sets the `pos` input. Prompt tokens are fed one per pass (batch-1
//! decode is exactly what the megakernel runs; a prompt is short next to its generation).

use crate::error::ModelError;
use crate::lower::{Lowered, PositionPlan};
use amk_core::{Backend, DType, Registry, Session, Tensor, ValidatedProgram, validate_owned};

/// A loaded decode program plus its position.
pub struct Engine {
    session: Box<dyn Session>,
    program: ValidatedProgram,
    plan: PositionPlan,
    registry: Registry,
    pos: u64,
    vocab: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("tasks", &self.program.program().tasks.len())
            .field("pos", &self.pos)
            .field("max_seq", &self.plan.max_seq)
            .finish()
    }
}

impl Engine {
    /// Validates `lowered.program` and loads it with its weights on `backend`.
    pub fn new(
        lowered: Lowered,
        backend: &dyn Backend,
        registry: &Registry,
    ) -> Result<Engine, ModelError> {
        let Lowered {
            program,
            weights,
            positions,
            ..
        } = lowered;
        let vocab = program
            .buffers
            .iter()
            .find(|b| b.name == "logits")
            .and_then(|b| b.shape.last().copied())
            .ok_or_else(|| ModelError::Lower("the program has no 'logits' output".into()))?
            as usize;
        let program =
            validate_owned(program, registry).map_err(|r| ModelError::Invalid(r.report()))?;
        let session = backend.load(&program, &weights, registry)?;
        Ok(Engine {
            session,
            program,
            plan: positions,
            registry: registry.clone(),
            pos: 0,
            vocab,
        })
    }

    /// The next position to be written.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The model's vocabulary (the logits' width).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// KV-cache length (the most tokens one sequence may hold).
    pub fn max_seq(&self) -> u64 {
        self.plan.max_seq
    }

    /// The validated program being run.
    pub fn program(&self) -> &ValidatedProgram {
        &self.program
    }

    /// Starts a new sequence (older cache rows are never read: attention covers `[0, pos]`).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Feeds `token` at the current position and returns the next-token logits (f32).
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, ModelError> {
        if self.pos >= self.plan.max_seq {
            return Err(ModelError::ContextFull {
                max_seq: self.plan.max_seq,
            });
        }
        if token as usize >= self.vocab {
            return Err(ModelError::Run(format!(
                "token id {token} is outside the model's vocabulary of {}",
                self.vocab
            )));
        }
        let edits = self.plan.edits(self.pos);
        let patch = self
            .program
            .check_patch(&self.registry, &edits)
            .map_err(|r| ModelError::Invalid(r.report()))?;
        self.session.set_params(&patch)?;
        let scalar = |v: i64| Tensor::from_i64(DType::I32, &[1], &[v]);
        let inputs = [
            ("token_id", scalar(token as i64)),
            ("pos", scalar(self.pos as i64)),
            ("reshape_id0", scalar(0)),
        ];
        let mut named = Vec::with_capacity(3);
        for (n, t) in inputs {
            named.push((n, t.map_err(|e| ModelError::Run(e.to_string()))?));
        }
        let out = self.session.step(&named)?;
        self.pos += 1;
        let logits = out
            .get("logits")
            .ok_or_else(|| ModelError::Run("the pass returned no 'logits'".into()))?;
        Ok(logits.to_f32_vec())
    }
}

/// Index of the largest logit (lowest index on ties; NaN never wins) — the same rule as
/// SAMPLE_ARGMAX and `torch.argmax` on finite logits.
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

/// What to do with each generated token: return `false` to stop early.
pub type OnToken<'a> = dyn FnMut(u32) -> bool + 'a;

/// Greedy decoding: feeds `prompt` (from position 0), then generates up to `n` tokens, stopping
/// after a token in `stop` (which is included in the result). `on_token` sees each generated
/// token as soon as it exists (for streaming).
pub fn generate_greedy(
    engine: &mut Engine,
    prompt: &[u32],
    n: usize,
    stop: &[u32],
    on_token: &mut OnToken<'_>,
) -> Result<Vec<u32>, ModelError> {
    generate(
        engine,
        prompt,
        n,
        stop,
        &mut |l: &[f32]| argmax(l),
        on_token,
    )
}

/// Decoding with any token picker (greedy, [`Sampler`], …): feeds `prompt` from position 0,
/// then generates up to `n` tokens, stopping after a token in `stop` (included in the result).
pub fn generate(
    engine: &mut Engine,
    prompt: &[u32],
    n: usize,
    stop: &[u32],
    pick: &mut dyn FnMut(&[f32]) -> u32,
    on_token: &mut OnToken<'_>,
) -> Result<Vec<u32>, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Run("the prompt has no tokens".into()));
    }
    let need = prompt.len() as u64 + n.saturating_sub(1) as u64;
    if need > engine.max_seq() {
        return Err(ModelError::ContextFull {
            max_seq: engine.max_seq(),
        });
    }
    engine.reset();
    let mut logits = Vec::new();
    for &t in prompt {
        logits = engine.step(t)?;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let next = pick(&logits);
        out.push(next);
        if !on_token(next) || stop.contains(&next) || i + 1 == n {
            break;
        }
        logits = engine.step(next)?;
    }
    Ok(out)
}

/// Temperature + nucleus (top-p) sampling with a seeded generator, so a run is repeatable.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f64,
    top_p: f64,
    rng: amk_core::sim::SplitMix,
}

impl Sampler {
    /// `temperature` > 0 (0 means greedy), `top_p` in (0, 1].
    pub fn new(temperature: f64, top_p: f64, seed: u64) -> Result<Sampler, ModelError> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ModelError::Run(format!(
                "temperature {temperature} must be a finite number >= 0"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ModelError::Run(format!("top-p {top_p} must be in (0, 1]")));
        }
        Ok(Sampler {
            temperature,
            top_p,
            rng: amk_core::sim::SplitMix(seed),
        })
    }

    /// Picks the next token from `logits`.
    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.temperature == 0.0 || logits.is_empty() {
            return argmax(logits);
        }
        let m = logits
            .iter()
            .filter(|x| !x.is_nan())
            .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        let mut probs: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .filter(|(_, x)| !x.is_nan())
            .map(|(i, &x)| (i as u32, ((x as f64 - m) / self.temperature).exp()))
            .collect();
        let z: f64 = probs.iter().map(|p| p.1).sum();
        if !(z.is_finite() && z > 0.0) {
            return argmax(logits);
        }
        // Most likely first (lowest id on ties), then keep the smallest prefix whose mass
        // reaches top_p.
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut kept = 0.0;
        let mut end = probs.len();
        for (i, p) in probs.iter().enumerate() {
            kept += p.1 / z;
            if kept >= self.top_p {
                end = i + 1;
                break;
            }
        }
        let mass: f64 = probs[..end].iter().map(|p| p.1).sum();
        let u = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64 * mass;
        let mut acc = 0.0;
        for p in &probs[..end] {
            acc += p.1;
            if u < acc {
                return p.0;
            }
        }
        probs[end - 1].0
    }
}

/// Teacher-forced negative log-likelihood of `ids[1..]` given the preceding tokens: returns
/// `(predictions, mean NLL)` with the log-softmax taken in f64.
pub fn perplexity(engine: &mut Engine, ids: &[u32]) -> Result<(usize, f64), ModelError> {
    if ids.len() < 2 {
        return Err(ModelError::Run(
            "perplexity needs at least two tokens".into(),
        ));
    }
    if ids.len() as u64 > engine.max_seq() {
        return Err(ModelError::ContextFull {
            max_seq: engine.max_seq(),
        });
    }
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= engine.vocab) {
        return Err(ModelError::Run(format!(
            "token id {bad} is outside the model's vocabulary of {}",
            engine.vocab
        )));
    }
    engine.reset();
    let mut total = 0f64;
    for w in ids.windows(2) {
        let logits = engine.step(w[0])?;
        total += nll(&logits, w[1] as usize);
    }
    let n = ids.len() - 1;
    Ok((n, total / n as f64))
}

/// `-log softmax(logits)[target]`, in f64.
pub fn nll(logits: &[f32], target: usize) -> f64 {
    let m = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let lse = m + logits
        .iter()
        .map(|&x| (x as f64 - m).exp())
        .sum::<f64>()
        .ln();
    lse - logits.get(target).map_or(f64::NAN, |&x| x as f64)
}
