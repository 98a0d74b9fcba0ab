//! The engine: one validated decode-loop program loaded on a backend, and the requests it
//! serves. A request is one loop of passes on the device — the prompt teacher-forced, then
//! each sampled token fed back — so the host sets a few buffers, starts it, and receives the
//! tokens as they stream out.

use crate::interface::Interface;
use crate::prefill::{FeedTo, Logits, Prefill, PrefillShape, feed_chunks, prefill_interface};
use crate::short::{Bucket, ShortDecode, check_short, hand_over};
use crate::{EngineError, Sampling};
use amk_core::{
    Backend, DType, Program, Registry, RowWatch, Session, Tensor, ValidatedProgram, WeightStore,
    decode, validate_owned,
};
use amk_model_llama::lower::prefill::{NLL as PREFILL_NLL, STATS as PREFILL_STATS};
use std::time::Instant;

/// A generation request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The prompt's token ids (at least one).
    pub prompt: &'a [u32],
    /// Tokens to generate at most (fewer when the KV cache fills first: [`Finish::ContextFull`]).
    pub max_new: usize,
    /// How tokens are chosen.
    pub sampling: Sampling,
    /// Generation stops after any of these tokens (which is returned).
    pub stop: &'a [u32],
    /// Token ids at or above this are never generated (a tokenizer with fewer tokens than the
    /// model has rows); `None`: every id of the logits.
    pub vocab_limit: Option<usize>,
    /// At most this many passes per launch (`None`: the whole request in one). The loop's
    /// state stays on the device between launches, so the tokens are the same either way.
    pub passes_per_launch: Option<u64>,
    /// The most likely tokens to report at each generated position, with their
    /// log-probabilities ([`Engine::generate_with`]; at most [`MAX_TOP_LOGPROBS`]). Reading
    /// them costs a launch a generated token and a copy of the logits; 0 reads none.
    pub top_logprobs: usize,
}

/// The most alternatives a request may ask for at each position (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One of the most likely tokens at a generated position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alternative {
    /// Its id.
    pub id: u32,
    /// Its log-probability (temperature 1, over the allowed ids), as [`Token::logprob`].
    pub logprob: f32,
}

/// Who hears of the prompt's progress ([`Engine::generate_observed`]).
pub struct PromptWatch<'a> {
    /// At most this many passes a launch while the prompt is fed.
    pub every: u64,
    /// Called after each such launch with (prompt tokens fed, prompt tokens).
    pub on: &'a mut dyn FnMut(u64, u64),
}

impl<'a> Request<'a> {
    /// Greedy decoding of up to `max_new` tokens after `prompt`, ending at any of `stop`, over
    /// every id of the logits, the whole request in one launch.
    pub fn greedy(prompt: &'a [u32], max_new: usize, stop: &'a [u32]) -> Self {
        Request {
            prompt,
            max_new,
            sampling: Sampling::greedy(),
            stop,
            vocab_limit: None,
            passes_per_launch: None,
            top_logprobs: 0,
        }
    }
}

/// One generated token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Token {
    /// Its id.
    pub id: u32,
    /// Its log-probability under the model (temperature 1, over the allowed ids).
    pub logprob: f32,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was generated (the last token).
    Stop,
    /// `max_new` tokens were generated.
    Length,
    /// The KV cache is full.
    ContextFull,
    /// The caller's token callback asked to stop.
    Cancelled,
}

impl Finish {
    /// Why a request that ran `run` and produced `tokens` ended: cancelled, else a stop token
    /// last, else `req.max_new` tokens, else the cache's end.
    fn of(run: &amk_core::LoopRun, tokens: &[Token], req: &Request<'_>) -> Finish {
        let stopped = (tokens.last()).is_some_and(|t| req.stop.contains(&t.id));
        if run.cancelled {
            Finish::Cancelled
        } else if stopped {
            Finish::Stop
        } else if tokens.len() >= req.max_new {
            Finish::Length
        } else {
            Finish::ContextFull
        }
    }

    /// A short name for reports (`stop`, `length`, `context_full`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ContextFull => "context_full",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// What a request produced, and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The generated tokens, in order.
    pub tokens: Vec<Token>,
    /// Why it ended.
    pub finish: Finish,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Positions the request ran (prompt and generated tokens but the last), those the prefill
    /// programs wrote included (a prompt they wrote whole counts all its positions).
    pub passes: u64,
    /// Seconds from the request's start to each token's arrival on the host.
    pub token_s: Vec<f64>,
    /// Seconds from the request's start to its end.
    pub total_s: f64,
    /// Device time of the launch(es), where the backend measures it.
    pub kernel_ms: Option<f64>,
    /// Of `passes`, those the short-context program ran ([`Engine::attach_short`]).
    pub short_passes: u64,
    /// Seconds the prompt's chunks took through the prefill programs, wall clock (0 without
    /// them): what of the time to the first token the prompt programs take, the rest being
    /// the first token's choice (from their logits of the last prompt token) or, where they
    /// left the prompt's end to the decode loop, its start and its first passes.
    pub prefill_s: f64,
}

impl Generation {
    /// A request of `prompt_tokens` before its first token.
    fn started(prompt_tokens: usize) -> Generation {
        Generation {
            tokens: Vec::new(),
            finish: Finish::Length,
            prompt_tokens,
            passes: 0,
            token_s: Vec::new(),
            total_s: 0.0,
            kernel_ms: None,
            short_passes: 0,
            prefill_s: 0.0,
        }
    }

    /// The generated token ids, in order.
    pub fn ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }

    /// Seconds to the first token (time to first token), if any was generated.
    pub fn first_token_s(&self) -> Option<f64> {
        self.token_s.first().copied()
    }
    /// Generated tokens per second after the first (the decode rate), if two or more.
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        match (self.token_s.first(), self.token_s.last()) {
            (Some(a), Some(b)) if self.token_s.len() > 1 && b > a => {
                Some((self.token_s.len() - 1) as f64 / (b - a))
            }
            _ => None,
        }
    }
}

/// Which of the engine's decode programs a trace is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeProgram {
    /// The engine's own program (any position).
    Main,
    /// The short-context program ([`Engine::attach_short`]).
    ShortContext,
}

impl DecodeProgram {
    /// Its name in reports: `decode` or `short-context`.
    pub fn as_str(self) -> &'static str {
        match self {
            DecodeProgram::Main => "decode",
            DecodeProgram::ShortContext => "short-context",
        }
    }
}

/// One decode program's task times ([`Engine::decode_traces`]).
#[derive(Debug)]
pub struct ProgramTrace<'a> {
    /// The program.
    pub role: DecodeProgram,
    /// The program whose tasks `tasks` times (their labels and ops).
    pub program: &'a Program,
    /// Its last launch's task times (a looped launch's last pass), in task order.
    pub tasks: Vec<amk_core::TaskTrace>,
}

/// A loaded decode-loop program, and optionally prefill programs beside it
/// ([`Engine::attach_prefill`]).
pub struct Engine {
    session: Box<dyn Session>,
    program: ValidatedProgram,
    io: Interface,
    backend: &'static str,
    /// The prefill programs for prompts (the last row's logits), by ascending rows: a chunk
    /// takes the smallest that holds the rest of the prompt.
    prefill: Vec<Prefill>,
    /// The prefill program with every row's logits, for teacher-forced scoring.
    scorer: Option<Prefill>,
    /// Why a prefill program was not attached when one was asked for.
    pub(crate) prefill_refused: Option<String>,
    /// The decode program for short positions, beside this one.
    short: Option<ShortDecode>,
    /// Why the short-context program was not attached when one was asked for.
    pub(crate) short_refused: Option<String>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("tasks", &self.program.program().tasks.len())
            .field("interface", &self.io)
            .field("backend", &self.backend)
            .finish()
    }
}

pub(crate) fn ints(shape: &[u64], values: &[i64]) -> Result<Tensor, EngineError> {
    Tensor::from_i64(DType::I32, shape, values)
        .map_err(|e| EngineError::Request(format!("building an input: {e}")))
}

fn floats(values: &[f32]) -> Result<Tensor, EngineError> {
    Tensor::from_f32(DType::F32, &[values.len() as u64], values)
        .map_err(|e| EngineError::Request(format!("building an input: {e}")))
}

impl Engine {
    /// Validates `program` (a decode-loop program: `amk_core::decode`) and loads it with its
    /// weights on `backend`.
    pub fn new(
        program: Program,
        weights: &WeightStore,
        backend: &dyn Backend,
        registry: &Registry,
    ) -> Result<Engine, EngineError> {
        let io = Interface::of(&program)?;
        let program =
            validate_owned(program, registry).map_err(|r| EngineError::Invalid(r.report()))?;
        let session = backend.load(&program, weights, registry)?;
        Ok(Engine {
            session,
            program,
            io,
            backend: backend.name(),
            prefill: Vec::new(),
            scorer: None,
            prefill_refused: None,
            short: None,
            short_refused: None,
        })
    }

    /// Validates `program`, a decode-loop program of the same model with the same interface
    /// and KV caches as the engine's (another schedule of it), and loads it beside the
    /// engine's to run the passes at positions below `below` (it replaces one attached
    /// before): for a layout that is faster while the cache is short ([`crate::short`]). The
    /// tokens are those of either program alone, up to the rounding of its arithmetic.
    pub fn attach_short(
        &mut self,
        program: Program,
        weights: &WeightStore,
        registry: &Registry,
        below: u64,
    ) -> Result<(), EngineError> {
        check_short(&program, self.program.program(), &self.io)?;
        let program =
            validate_owned(program, registry).map_err(|r| EngineError::Invalid(r.report()))?;
        let session = self.session.load_beside(&program, weights, registry)?;
        self.short = Some(ShortDecode {
            session,
            program,
            below,
        });
        Ok(())
    }

    /// Records every task's times in the decode programs' later launches (the engine's own and
    /// the short-context one's), on a backend that can (`false`: this one records none).
    pub fn enable_trace(&mut self, registry: &Registry) -> Result<bool, EngineError> {
        let mut on = self.session.enable_trace(registry)?;
        if let Some(s) = self.short.as_mut() {
            on &= s.session.enable_trace(registry)?;
        }
        Ok(on)
    }

    /// The task times of the decode programs' last launches ([`Engine::enable_trace`]): the
    /// engine's own program's, then the short-context one's; a program that has not run since
    /// tracing began has none.
    pub fn decode_traces(&self) -> Result<Vec<ProgramTrace<'_>>, EngineError> {
        let mut out = vec![ProgramTrace {
            role: DecodeProgram::Main,
            program: self.program.program(),
            tasks: self.session.trace()?,
        }];
        if let Some(s) = &self.short {
            out.push(ProgramTrace {
                role: DecodeProgram::ShortContext,
                program: s.program.program(),
                tasks: s.session.trace()?,
            });
        }
        Ok(out)
    }

    /// The positions the short-context program runs (`0..` this), if one is attached.
    pub fn short_context(&self) -> Option<u64> {
        self.short.as_ref().map(|s| s.below)
    }

    /// Why no short-context program runs, when one was asked for and could not be lowered
    /// or loaded.
    pub fn short_refused(&self) -> Option<&str> {
        self.short_refused.as_deref()
    }

    /// Makes `bucket` the program for the pass at `pos`, moving the loop's state to it from
    /// the other one when that changes it; returns the passes it may run from `pos`.
    fn enter_bucket(&mut self, bucket: &mut Bucket, pos: u64) -> Result<u64, EngineError> {
        let (next, room) = ShortDecode::bucket_at(self.short.as_ref(), pos);
        if next != *bucket
            && let Some(short) = self.short.as_mut()
        {
            let (main, short) = (self.session.as_mut(), short.session.as_mut());
            match next {
                Bucket::Short => hand_over(main, short)?,
                Bucket::Main => hand_over(short, main)?,
            }
        }
        *bucket = next;
        Ok(room)
    }

    /// The session of `bucket`'s program.
    fn decode_session(&mut self, bucket: Bucket) -> &mut dyn Session {
        match (bucket, self.short.as_mut()) {
            (Bucket::Short, Some(s)) => s.session.as_mut(),
            _ => self.session.as_mut(),
        }
    }

    /// Validates `program`, a prefill program (`amk_model_llama::lower::prefill`: inputs
    /// `prefill.ids` and `prefill.pos` of its rows, KV caches named, typed and shaped as the
    /// decode program's), and loads it beside the decode program. One without logits, or whose
    /// logits are the row `prefill.last` names (the engine does not read them), writes a
    /// request's prompt into the caches a chunk of rows a pass,
    /// and the decode loop starts at the prompt's last token (several of these, of different
    /// rows, share a prompt: each chunk the smallest that holds the rest; one of the same rows
    /// replaces its like); one with every row's logits scores teacher-forced text
    /// ([`Engine::forced_logits`], [`Engine::perplexity`]) a chunk a pass.
    pub fn attach_prefill(
        &mut self,
        program: Program,
        weights: &WeightStore,
        registry: &Registry,
    ) -> Result<(), EngineError> {
        let PrefillShape {
            rows,
            logits,
            nll,
            stats,
        } = prefill_interface(&program, self.program.program(), self.io.vocab)?;
        let program =
            validate_owned(program, registry).map_err(|r| EngineError::Invalid(r.report()))?;
        let session = self.session.load_beside(&program, weights, registry)?;
        let p = Prefill {
            session,
            rows,
            logits,
            nll,
            stats,
        };
        if logits != Logits::Every {
            self.prefill.retain(|q| q.rows != rows);
            let at = self.prefill.partition_point(|q| q.rows < rows);
            self.prefill.insert(at, p);
        } else {
            self.scorer = Some(p);
        }
        Ok(())
    }

    /// Drops the prefill programs (prompts and scored texts go through the decode program).
    pub(crate) fn detach_prefill(&mut self) {
        self.prefill.clear();
        self.scorer = None;
    }

    /// Prompt tokens the largest prefill pass takes (`None`: prompts go through the decode
    /// program).
    pub fn prefill_rows(&self) -> Option<u64> {
        self.prefill.last().map(|p| p.rows)
    }

    /// The rows of every prefill program for prompts, ascending.
    pub fn prefill_chunk_sizes(&self) -> Vec<u64> {
        self.prefill.iter().map(|p| p.rows).collect()
    }

    /// Why no prefill program runs, when one was asked for and the model's could not be
    /// lowered (its prompts go through the decode program).
    pub fn prefill_refused(&self) -> Option<&str> {
        self.prefill_refused.as_deref()
    }

    /// Writes the K/V rows of the prompt through the prefill programs, as far as their chunks
    /// fit the cache ([`feed_chunks`]): every row when every prompt program computes its last
    /// row's logits (then what the last chunk computed of them is read back: they choose the
    /// first token), else all rows but the last (whose decode pass computes them). The row
    /// itself comes back only where `whole_row` asks for it or the program does not summarise
    /// it. `on` hears of each chunk with the tokens written so far.
    fn prefill_prompt(
        &mut self,
        prompt: &[u32],
        vocab_limit: usize,
        whole_row: bool,
        on: &mut dyn FnMut(u64),
    ) -> Result<PromptFed, EngineError> {
        let n = prompt.len() as u64;
        let last =
            !self.prefill.is_empty() && (self.prefill.iter()).all(|p| p.logits == Logits::Last);
        let summarised: Vec<u64> = (self.prefill.iter().filter(|p| p.stats))
            .map(|p| p.rows)
            .collect();
        let to = FeedTo {
            todo: if last { n } else { n.saturating_sub(1) },
            max_seq: self.io.max_seq,
            vocab_limit,
        };
        let mut row = LastRow::default();
        let mut read = |c: crate::prefill::Chunk| {
            let mut names = Vec::new();
            if last && c.first + c.len == n {
                let stats = summarised.contains(&c.rows);
                names.extend(stats.then_some(PREFILL_STATS));
                names.extend((whole_row || !stats).then_some(decode::LOGITS));
            }
            names
        };
        let done = feed_chunks(
            &mut self.prefill,
            prompt,
            to,
            &mut read,
            &mut |first, len, out| {
                if first + len == n {
                    row.logits = out.get(decode::LOGITS).map(|t| t.to_f32_vec());
                    row.summary = out
                        .get(PREFILL_STATS)
                        .map(op_logit_stats::reference::merged);
                }
                on(first + len)
            },
        )?;
        let last_row = (row.logits.is_some() || row.summary.is_some()).then_some(row);
        Ok(PromptFed { done, last_row })
    }

    /// KV-cache length (the most tokens one sequence may hold).
    pub fn max_seq(&self) -> u64 {
        self.io.max_seq
    }

    /// The logits' width.
    pub fn vocab(&self) -> usize {
        self.io.vocab
    }

    /// The validated program being run.
    pub fn program(&self) -> &ValidatedProgram {
        &self.program
    }

    /// The backend's name (`cpu`, `cuda`).
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Checks token ids against the vocabulary.
    fn check_ids(&self, ids: &[u32], what: &str) -> Result<(), EngineError> {
        match ids.iter().find(|&&t| t as usize >= self.io.vocab) {
            Some(bad) => Err(EngineError::Request(format!(
                "{what} token id {bad} is outside the model's vocabulary of {}",
                self.io.vocab
            ))),
            None => Ok(()),
        }
    }

    /// Sets every input and state buffer for the loop `at` describes.
    fn start(
        &mut self,
        at: LoopStart<'_>,
        sampling: &Sampling,
        stop: &[u32],
        vocab_limit: usize,
    ) -> Result<(), EngineError> {
        let LoopStart {
            known,
            base,
            token,
            end,
        } = at;
        let max_seq = self.io.max_seq as usize;
        let mut prompt = vec![0i64; max_seq];
        for (p, &t) in prompt.iter_mut().zip(known) {
            *p = i64::from(t);
        }
        let mut stops = vec![-1i64; self.io.stop_slots];
        for (s, &t) in stops.iter_mut().zip(stop) {
            *s = i64::from(t);
        }
        let mut limits = vec![0i64; decode::LIMITS_LEN as usize];
        limits[decode::LIMIT_PROMPT_LEN] = known.len() as i64;
        limits[decode::LIMIT_END] = end as i64;
        limits[decode::LIMIT_TOP_K] = i64::from(sampling.top_k);
        // The seed's two halves, as the bits of two i32 words.
        limits[decode::LIMIT_SEED_LO] = i64::from(sampling.seed as u32 as i32);
        limits[decode::LIMIT_SEED_HI] = i64::from((sampling.seed >> 32) as u32 as i32);
        limits[decode::LIMIT_VOCAB] = vocab_limit as i64;
        let mut sampler = vec![0f32; decode::SAMPLING_LEN as usize];
        sampler[decode::SAMPLING_TEMPERATURE] = sampling.temperature;
        sampler[decode::SAMPLING_TOP_P] = sampling.top_p;
        let mut values = vec![
            (decode::PROMPT, ints(&[max_seq as u64], &prompt)?),
            (decode::STOP, ints(&[stops.len() as u64], &stops)?),
            (decode::LIMITS, ints(&[decode::LIMITS_LEN], &limits)?),
            (decode::SAMPLING, floats(&sampler)?),
            (decode::POS, ints(&[1], &[base as i64])?),
            (decode::TOKEN, ints(&[1], &[i64::from(token)])?),
            (decode::HALT, ints(&[1], &[0])?),
        ];
        let has_reshape =
            (self.program.program().buffers.iter()).any(|b| b.name == decode::RESHAPE_ID);
        if has_reshape {
            values.push((decode::RESHAPE_ID, ints(&[1], &[0])?));
        }
        self.session.write(&values)?;
        if let Some(s) = self.short.as_mut() {
            s.session.write(&values)?;
        }
        Ok(())
    }

    /// Checks `req` against the program (sampling settings, alternatives, the prompt's ids and
    /// length, the stop tokens, the vocabulary limit); returns the vocabulary limit.
    fn check_request(&self, req: &Request<'_>) -> Result<usize, EngineError> {
        req.sampling.check()?;
        if req.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(EngineError::Request(format!(
                "{} top log-probabilities asked for; at most {MAX_TOP_LOGPROBS}",
                req.top_logprobs
            )));
        }
        let n = req.prompt.len();
        if n == 0 {
            return Err(EngineError::Request("the prompt has no tokens".into()));
        }
        self.check_ids(req.prompt, "prompt")?;
        if n as u64 > self.io.max_seq {
            return Err(EngineError::ContextFull {
                prompt: n,
                max_seq: self.io.max_seq,
            });
        }
        if req.stop.len() > self.io.stop_slots {
            return Err(EngineError::Request(format!(
                "{} stop tokens; the program holds at most {}",
                req.stop.len(),
                self.io.stop_slots
            )));
        }
        if let Some(&bad) = req.stop.iter().find(|&&t| i32::try_from(t).is_err()) {
            return Err(EngineError::Request(format!(
                "stop token id {bad} is too large"
            )));
        }
        let vocab_limit = req.vocab_limit.unwrap_or(self.io.vocab).min(self.io.vocab);
        if vocab_limit == 0 {
            return Err(EngineError::Request("the vocabulary limit is 0".into()));
        }
        Ok(vocab_limit)
    }

    /// Generates from `req.prompt` (from position 0: the sequence starts anew), in one loop
    /// of passes on the device; `on_token` sees each token as it arrives and may return
    /// `false` to stop (the pass running then finishes).
    pub fn generate(
        &mut self,
        req: &Request<'_>,
        on_token: &mut dyn FnMut(&Token) -> bool,
    ) -> Result<Generation, EngineError> {
        self.generate_observed(req, on_token, None)
    }

    /// [`Engine::generate`], telling `prompt` how far the prompt is: while the prompt is fed,
    /// the loop runs at most `prompt.every` passes a launch and calls `prompt.on` with the
    /// prompt tokens fed so far and their count after each launch. Why: on the CPU VM a long
    /// prompt takes a minute, which a user should see move; a launch more every `every`
    /// passes costs the GPU a few microseconds, the same tokens either way.
    pub fn generate_observed(
        &mut self,
        req: &Request<'_>,
        on_token: &mut dyn FnMut(&Token) -> bool,
        prompt: Option<PromptWatch<'_>>,
    ) -> Result<Generation, EngineError> {
        self.generate_with(req, &mut |t, _| on_token(t), prompt)
    }

    /// [`Engine::generate_observed`], handing `on_token` each token with the
    /// `req.top_logprobs` most likely tokens at its position, most likely first (empty when
    /// none are asked for). Those come from the logits the token was drawn from, read after
    /// a launch of one pass, so asking for them costs a launch a token.
    pub fn generate_with(
        &mut self,
        req: &Request<'_>,
        on_token: &mut dyn FnMut(&Token, &[Alternative]) -> bool,
        mut prompt: Option<PromptWatch<'_>>,
    ) -> Result<Generation, EngineError> {
        let vocab_limit = self.check_request(req)?;
        let n = req.prompt.len();
        let t0 = Instant::now();
        let mut out = Generation::started(n);
        if req.max_new == 0 {
            return Ok(out);
        }
        let end = (n as u64)
            .saturating_add(req.max_new as u64)
            .min(self.io.max_seq);
        // The prompt's rows through the prefill program, where there is one: the decode loop
        // then starts at position `base`.
        let mut on_chunk = |done: u64| {
            if let Some(w) = prompt.as_mut() {
                (w.on)(done, n as u64);
            }
        };
        let top = req.top_logprobs;
        // The whole row only for a draw or the alternatives (a greedy choice and its
        // log-probability need only the summaries).
        let whole_row = top > 0 || req.sampling.temperature > 0.0;
        let written = self.prefill_prompt(req.prompt, vocab_limit, whole_row, &mut on_chunk)?;
        out.prefill_s = t0.elapsed().as_secs_f64();
        let mut run = amk_core::LoopRun::default();
        // The prompt program's logits of the last prompt token choose the first token (as
        // NEXT_TOKEN would); the loop then starts after it. Else the loop's first pass
        // computes them, at the first position the prefill programs left.
        let (base, first) = match written.last_row.filter(|_| written.done < end) {
            Some(row) => {
                let token = first_token(&row, &req.sampling, vocab_limit, written.done);
                out.tokens.push(token);
                out.token_s.push(t0.elapsed().as_secs_f64());
                let alternatives = match (top, &row.logits) {
                    (1.., Some(logits)) => top_alternatives(logits, vocab_limit, top),
                    _ => Vec::new(),
                };
                run.cancelled = !on_token(&token, &alternatives);
                run.halted = req.stop.contains(&token.id);
                (written.done, token.id)
            }
            None => match req.prompt.get(written.done as usize) {
                Some(&t) => (written.done, t),
                // Every prompt row written and no room for a token (a prompt that fills the
                // cache).
                None => {
                    out.finish = Finish::ContextFull;
                    out.passes = written.done;
                    out.total_s = t0.elapsed().as_secs_f64();
                    return Ok(out);
                }
            },
        };
        let at = LoopStart {
            known: req.prompt,
            base,
            token: first,
            end,
        };
        self.start(at, &req.sampling, req.stop, vocab_limit)?;
        let watch = RowWatch {
            buffer: decode::EMITTED.to_string(),
            first_row: n as u64,
        };
        let chunk = req.passes_per_launch.unwrap_or(u64::MAX).max(1);
        let mut pending: Option<Token> = None;
        let mut kernel_ms: Option<f64> = None;
        let fed = n as u64 - 1; // positions whose pass feeds a prompt token and emits nothing
        // `at`: the positions done (the pass at position `at` writes row `at + 1`).
        let at = |run: &amk_core::LoopRun| base + run.passes;
        // The program running the passes: the short-context one below its bound, the
        // engine's own from there (each start wrote both; the state moves at a change).
        let mut bucket = ShortDecode::bucket_at(self.short.as_ref(), base).0;
        while at(&run) < end - 1 && !run.halted && !run.cancelled {
            let room = self.enter_bucket(&mut bucket, at(&run))?;
            let mut budget = (end - 1 - at(&run)).min(chunk).min(room);
            if let Some(w) = prompt.as_ref().filter(|_| at(&run) < fed) {
                budget = budget.min(w.every.max(1)).min(fed - at(&run));
            }
            // With alternatives asked for: the prompt's passes in one launch, then one pass a
            // launch, so that the logits read after it are those its token was drawn from.
            if top > 0 {
                budget = if at(&run) < fed {
                    budget.min(fed - at(&run))
                } else {
                    1
                };
            }
            // Every row before the next pass's was reported by an earlier launch.
            let watch = RowWatch {
                first_row: (at(&run) + 1).max(watch.first_row),
                ..watch.clone()
            };
            let (tokens, token_s) = (&mut out.tokens, &mut out.token_s);
            let mut on_row = |_: u64, row: &[i32]| {
                let token = Token {
                    id: row.first().copied().unwrap_or(0) as u32,
                    logprob: f32::from_bits(row.get(1).copied().unwrap_or(0) as u32),
                };
                token_s.push(t0.elapsed().as_secs_f64());
                tokens.push(token);
                if top > 0 {
                    pending = Some(token);
                    return true;
                }
                on_token(&token, &[])
            };
            let session = self.decode_session(bucket);
            let mut part = session.run_loop(budget, Some(&watch), &mut on_row)?;
            if let Some(token) = pending.take() {
                let logits = session.read(decode::LOGITS)?.to_f32_vec();
                let alternatives = top_alternatives(&logits, vocab_limit, top);
                if !on_token(&token, &alternatives) {
                    part.cancelled = true;
                }
            }
            run.passes += part.passes;
            if bucket == Bucket::Short {
                out.short_passes += part.passes;
            }
            run.halted = part.halted;
            run.cancelled = part.cancelled;
            if let Some(k) = part.kernel_ms {
                kernel_ms = Some(kernel_ms.unwrap_or(0.0) + k);
            }
            if part.passes == 0 {
                break;
            }
            if let Some(w) = prompt.as_mut().filter(|_| at(&run) <= fed) {
                (w.on)(at(&run), n as u64);
            }
        }
        run.passes += base;
        out.passes = run.passes;
        out.kernel_ms = kernel_ms;
        out.total_s = t0.elapsed().as_secs_f64();
        out.finish = Finish::of(&run, &out.tokens, req);
        Ok(out)
    }

    /// Feeds `ids` from position 0 and hands the logits (f32) that predict `ids[pos + 1]` to
    /// `visit` with `pos`, for every position but the last: whole chunks of rows through the
    /// scoring prefill program where the engine has one, the rest (and everything without
    /// one) a decode pass a position, in the program [`Engine::generate`] runs it in.
    pub fn forced_logits(
        &mut self,
        ids: &[u32],
        visit: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        let vocab = self.io.vocab;
        let mut failed = None;
        self.forced_chunks(ids, &|_, _| true, &mut |c: ForcedChunk<'_>| {
            let Some(logits) = c.logits else {
                failed = Some("a scored chunk came back without its logits".to_string());
                return;
            };
            let all = logits.to_f32_vec();
            for (i, row) in all.chunks(vocab).take(c.rows).enumerate() {
                visit(c.first + i, row);
            }
        })?;
        failed.map_or(Ok(()), |why| Err(EngineError::Interface(why)))
    }

    /// [`Engine::forced_logits`] a launch at a time: each chunk's (or decode pass's) outputs
    /// for its positions — the logits tensor as the program wrote it, `[rows or more, vocab]`,
    /// where `want_logits(first, rows)` asks for them or the program has no NLLs, and a
    /// scorer's NLLs of its rows where it has them.
    fn forced_chunks(
        &mut self,
        ids: &[u32],
        want_logits: &dyn Fn(usize, usize) -> bool,
        visit: &mut dyn FnMut(ForcedChunk<'_>),
    ) -> Result<(), EngineError> {
        if ids.is_empty() {
            return Err(EngineError::Request("no tokens to feed".into()));
        }
        self.check_ids(ids, "input")?;
        if ids.len() as u64 > self.io.max_seq {
            return Err(EngineError::ContextFull {
                prompt: ids.len(),
                max_seq: self.io.max_seq,
            });
        }
        let n = ids.len() as u64;
        // Whole chunks through the scorer, where there is one; the rest a pass a position.
        let base = match self.scorer.as_mut() {
            Some(sc) => {
                let scores = sc.nll;
                let mut read = |c: crate::prefill::Chunk| {
                    let logits = !scores || want_logits(c.first as usize, c.len as usize);
                    let mut names = vec![];
                    names.extend(scores.then_some(PREFILL_NLL));
                    names.extend(logits.then_some(decode::LOGITS));
                    names
                };
                sc.feed(ids, self.io.max_seq, &mut read, &mut |first, len, out| {
                    visit(ForcedChunk {
                        first: first as usize,
                        rows: len as usize,
                        logits: out.get(decode::LOGITS),
                        nll: out.get(PREFILL_NLL),
                    })
                })?
            }
            None => 0,
        };
        if base + 1 >= n {
            return Ok(());
        }
        let at = LoopStart {
            known: ids,
            base,
            token: ids[base as usize],
            end: n,
        };
        self.start(at, &Sampling::greedy(), &[], self.io.vocab)?;
        // The passes run in the program `generate` would run them in.
        let mut bucket = ShortDecode::bucket_at(self.short.as_ref(), base).0;
        for pos in base..n - 1 {
            self.enter_bucket(&mut bucket, pos)?;
            let session = self.decode_session(bucket);
            session.run_loop(1, None, &mut |_, _| true)?;
            let logits = session.read(decode::LOGITS)?;
            visit(ForcedChunk {
                first: pos as usize,
                rows: 1,
                logits: Some(&logits),
                nll: None,
            });
        }
        Ok(())
    }

    /// Teacher-forced mean negative log-likelihood of `ids[1..]` given the tokens before
    /// each: `(predictions, mean NLL)`, the log-softmax taken in f64.
    pub fn perplexity(&mut self, ids: &[u32]) -> Result<(usize, f64), EngineError> {
        let s = self.score(ids, &[])?;
        Ok((s.predictions, s.mean_nll))
    }

    /// [`Engine::perplexity`], keeping the logits at the positions `keep` too. A scorer that
    /// computes its rows' NLLs on the device (TOKEN_NLL) sends back those, a float a row,
    /// and its logits only for the chunks holding a kept position: a chunk's logits are tens
    /// of megabytes. Otherwise each chunk's rows are scored from its logits on every core
    /// ([`nll_rows`]). The mean sums the rows' NLLs in position order.
    pub fn score(&mut self, ids: &[u32], keep: &[usize]) -> Result<Scores, EngineError> {
        if ids.len() < 2 {
            return Err(EngineError::Request(
                "perplexity needs at least two tokens".into(),
            ));
        }
        let vocab = self.io.vocab;
        let mut nlls = vec![f64::NAN; ids.len() - 1];
        let mut kept = Vec::new();
        let mut failed = None;
        let wanted =
            |first: usize, rows: usize| keep.iter().any(|p| (first..first + rows).contains(p));
        self.forced_chunks(ids, &wanted, &mut |c: ForcedChunk<'_>| {
            let rows = c.first..c.first + c.rows;
            let got = match (c.nll, c.logits) {
                (Some(nll), _) => (0..c.rows).map(|r| nll.get_f32(r) as f64).collect(),
                (None, Some(logits)) => nll_rows(logits, vocab, &ids[c.first + 1..rows.end + 1]),
                (None, None) => {
                    failed = Some("a scored chunk came back with neither NLLs nor logits");
                    return;
                }
            };
            nlls[rows.clone()].copy_from_slice(&got);
            for p in rows.filter(|p| keep.contains(p)) {
                let (Some(logits), at) = (c.logits, (p - c.first) * vocab) else {
                    failed = Some("a chunk with a kept position came back without its logits");
                    return;
                };
                kept.push((p, (at..at + vocab).map(|i| logits.get_f32(i)).collect()));
            }
        })?;
        if let Some(why) = failed {
            return Err(EngineError::Interface(why.into()));
        }
        Ok(Scores {
            predictions: nlls.len(),
            mean_nll: nlls.iter().sum::<f64>() / nlls.len() as f64,
            kept,
        })
    }
}

/// One launch's outputs in a teacher-forced pass: rows `[0, rows)` of them predict the ids
/// after positions `first ..`.
struct ForcedChunk<'a> {
    first: usize,
    rows: usize,
    /// The logits, `[rows or more, vocab]`, where they were read back.
    logits: Option<&'a amk_core::Tensor>,
    /// Each row's NLL of its target, where the program computed them (a scorer's TOKEN_NLL).
    nll: Option<&'a amk_core::Tensor>,
}

/// A text's teacher-forced scores ([`Engine::score`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    /// Predictions scored: one fewer than the ids.
    pub predictions: usize,
    /// Their mean negative log-likelihood (log-softmax in f64).
    pub mean_nll: f64,
    /// The logits at the positions asked to keep, in position order.
    pub kept: Vec<(usize, Vec<f32>)>,
}

/// Elements `range` of `t` as f32 into `buf` (its storage matched once, not per element).
/// What the prefill programs did with a prompt: the tokens whose K/V rows they wrote, and what
/// came back of the logits of the prompt's last token when they wrote every row.
struct PromptFed {
    done: u64,
    last_row: Option<LastRow>,
}

/// A logits row as it came back from a prompt program: the row itself and its merged
/// LOGIT_STATS summaries, either or both.
#[derive(Default)]
struct LastRow {
    logits: Option<Vec<f32>>,
    summary: Option<op_logit_stats::Summary>,
}

/// Where a decode loop starts: the sequence's known tokens (the prompt, or a text to score),
/// the position of its first pass (the rows before it are in the caches already: none, or what
/// the prefill programs wrote) and the token that pass feeds, and the tokens the sequence
/// holds when the loop ends.
struct LoopStart<'a> {
    known: &'a [u32],
    base: u64,
    token: u32,
    end: u64,
}

/// The token NEXT_TOKEN would emit at position `q` from `row` (the logits that predict it)
/// under `sampling` and the vocabulary limit: the op's own choice
/// ([`op_next_token::choose`]; from the summaries where they came back, as the decode tail
/// merges LOGIT_STATS's), so a seed gives the same text whichever program computed the
/// logits. A draw needs the row; a greedy choice reads only the summaries when it has them.
fn first_token(row: &LastRow, sampling: &Sampling, vocab_limit: usize, q: u64) -> Token {
    let settings = op_next_token::choose::Settings {
        temperature: sampling.temperature,
        top_k: i64::from(sampling.top_k),
        top_p: sampling.top_p,
        seed: sampling.seed,
        vocab_limit: vocab_limit as i64,
    };
    let logits = row.logits.as_deref().unwrap_or(&[]);
    let c = match &row.summary {
        Some(g) => op_next_token::choose::choose_given(logits, &settings, q, g),
        None => op_next_token::choose::choose(logits, &settings, q),
    };
    Token {
        id: c.token as u32,
        logprob: c.logprob,
    }
}

fn row_f32(t: &amk_core::Tensor, range: std::ops::Range<usize>, buf: &mut Vec<f32>) {
    use amk_core::Storage;
    buf.clear();
    match t.storage() {
        Storage::F32(v) => buf.extend_from_slice(&v[range]),
        Storage::BF16(v) => buf.extend(v[range].iter().map(|x| x.to_f32())),
        Storage::F16(v) => buf.extend(v[range].iter().map(|x| x.to_f32())),
        _ => buf.extend(range.map(|i| t.get_f32(i))),
    }
}

/// [`nll`] of each of `targets.len()` rows of `logits` (`[rows, vocab]`, any float dtype),
/// the rows split over the machine's cores: each value is the one-core value.
pub fn nll_rows(logits: &amk_core::Tensor, vocab: usize, targets: &[u32]) -> Vec<f64> {
    let rows = targets.len();
    let one = |r: usize, buf: &mut Vec<f32>| {
        row_f32(logits, r * vocab..(r + 1) * vocab, buf);
        nll(buf, targets[r] as usize)
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(cores.max(1)).max(16);
    if rows <= per {
        let mut buf = Vec::with_capacity(vocab);
        return (0..rows).map(|r| one(r, &mut buf)).collect();
    }
    let mut out = vec![0f64; rows];
    std::thread::scope(|s| {
        for (i, part) in out.chunks_mut(per).enumerate() {
            s.spawn(move || {
                let mut buf = Vec::with_capacity(vocab);
                for (k, v) in part.iter_mut().enumerate() {
                    *v = one(i * per + k, &mut buf);
                }
            });
        }
    });
    out
}

/// The `k` most likely of the ids below `limit` in `logits`, most likely first (the lower id
/// first among equals), with their log-probabilities over those ids (log-softmax in f64).
pub fn top_alternatives(logits: &[f32], limit: usize, k: usize) -> Vec<Alternative> {
    let allowed = &logits[..limit.min(logits.len())];
    let lse = log_sum_exp(allowed);
    let mut ids: Vec<usize> = (0..allowed.len()).collect();
    let order = |a: &usize, b: &usize| allowed[*b].total_cmp(&allowed[*a]).then(a.cmp(b));
    let k = k.min(ids.len());
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, order);
    }
    ids.truncate(k);
    ids.sort_by(order);
    ids.into_iter()
        .map(|i| Alternative {
            id: i as u32,
            logprob: (allowed[i] as f64 - lse) as f32,
        })
        .collect()
}

/// `-log softmax(logits)[target]`, in f64.
pub fn nll(logits: &[f32], target: usize) -> f64 {
    log_sum_exp(logits) - logits.get(target).map_or(f64::NAN, |&x| x as f64)
}

/// `ln Σ exp(x)` of `xs` in f64, shifted by their largest for range.
fn log_sum_exp(xs: &[f32]) -> f64 {
    let m = xs.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    m + xs.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

pub use amk_core::decode::argmax;
