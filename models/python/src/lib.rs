//! `import amk`: amk's engine from Python.
//!
//! ```python
//! import amk
//! m = amk.Model()                       # the default model; or amk.Model("path.gguf", backend="cuda", dtype="bf16")
//! print(m.generate("The capital of France is", max_tokens=16))
//! for piece in m.stream("Tell me about Paris.", chat=True, max_tokens=64):
//!     print(piece, end="", flush=True)
//! ```
//!
//! The model runs on the engine's own thread (`amk_server::worker`, the one `amk serve` uses):
//! a call queues a generation and reads its text as it streams back, with the interpreter's
//! lock released while it waits, so other Python threads run meanwhile. A stream that is
//! closed or dropped, or a Ctrl-C while a call waits, stops its generation at the next token.

mod load;
mod stream;

use amk_engine::Sampling;
use amk_server::worker::{self, Event, Job, ModelInfo, Queue};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use stream::Stream;
use tokio::sync::mpsc;

create_exception!(
    amk,
    AmkError,
    PyException,
    "An amk error: a model that cannot be loaded, a bad argument, a backend failure."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    AmkError::new_err(e.to_string())
}

/// A loaded model and the engine running it.
#[pyclass(module = "amk", frozen)]
struct Model {
    info: ModelInfo,
    queue: Queue,
}

/// What one call asks for, as the keyword arguments give it.
struct Ask {
    max_tokens: usize,
    sampling: Sampling,
    stop: Vec<String>,
}

impl Ask {
    fn new(max_tokens: usize, sampling: Sampling, stop: Option<Vec<String>>) -> Ask {
        Ask {
            max_tokens,
            sampling,
            stop: stop.unwrap_or_default(),
        }
    }
}

impl Model {
    /// Queues a generation of `prompt` (token ids) and returns its events.
    fn submit(&self, prompt: Vec<u32>, ask: Ask) -> PyResult<mpsc::UnboundedReceiver<Event>> {
        let room = self.info.max_seq.saturating_sub(prompt.len() as u64) as usize;
        if room == 0 {
            return Err(err(format!(
                "the prompt's {} tokens fill the model's context of {} tokens (max_seq)",
                prompt.len(),
                self.info.max_seq
            )));
        }
        if ask.max_tokens == 0 {
            return Err(err("max_tokens must be at least 1"));
        }
        ask.sampling.check().map_err(err)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let job = Job {
            prompt,
            max_new: ask.max_tokens.min(room),
            sampling: ask.sampling,
            stop: ask.stop,
            logprobs: None,
            ignore_eos: false,
            arrived: Instant::now(),
            events: tx,
        };
        self.queue.submit(job).map_err(|e| err(e.message))?;
        Ok(rx)
    }

    fn encode(&self, text: &str, chat: bool) -> PyResult<Vec<u32>> {
        let tok = &self.info.tokenizer;
        let ids = if chat {
            let rendered = tok
                .apply_chat_template(&[("user", text)], true)
                .map_err(err)?;
            tok.encode(&rendered).map_err(err)?
        } else {
            tok.encode(text).map_err(err)?
        };
        if ids.is_empty() {
            return Err(err("the prompt encodes to no tokens"));
        }
        Ok(ids)
    }
}

#[pymethods]
impl Model {
    /// Loads `path` (a GGUF file or a HuggingFace directory; default: SmolLM2-135M-Instruct,
    /// downloaded and cached on first use) as `amk generate` does. `backend`: "cpu", "cuda"
    /// or "auto"; `dtype`: "f32", "f16" or "bf16"; `max_seq`: the context (prompt and
    /// generated tokens); `threads`: the CPU VM's; `prefill_rows`: prompt tokens a prefill
    /// pass takes (default: 512 for 16-bit programs on a GPU, else none).
    #[new]
    #[pyo3(signature = (path=None, *, backend="auto", dtype="f32", max_seq=None, threads=1, prefill_rows=None))]
    fn new(
        py: Python<'_>,
        path: Option<PathBuf>,
        backend: &str,
        dtype: &str,
        max_seq: Option<u64>,
        threads: usize,
        prefill_rows: Option<u64>,
    ) -> PyResult<Model> {
        let config = load::Config {
            path,
            backend: backend.parse::<load::BackendKind>().map_err(err)?,
            dtype: load::parse_dtype(dtype).map_err(err)?,
            max_seq,
            threads: threads.max(1),
            prefill_rows,
        };
        let started = py
            .detach(move || {
                let metrics = Arc::new(amk_server::Metrics::new());
                worker::start(move || load::load(config), QUEUE, metrics)
            })
            .map_err(err)?;
        Ok(Model {
            info: started.info,
            queue: started.queue,
        })
    }

    /// The model's name (its file's or folder's).
    #[getter]
    fn model_id(&self) -> String {
        self.info.model_id.clone()
    }

    /// The backend running it: "cpu" or "cuda".
    #[getter]
    fn backend(&self) -> &'static str {
        self.info.backend
    }

    /// The context: prompt and generated tokens together.
    #[getter]
    fn max_seq(&self) -> u64 {
        self.info.max_seq
    }

    /// The text after `prompt` (greedy unless `temperature` > 0; the same `seed` gives the
    /// same text). `chat=True` wraps the prompt as a user turn of the model's chat template.
    /// Generation ends at an end token, after `max_tokens`, at the context's end or before
    /// the first of the `stop` strings.
    #[pyo3(signature = (prompt, *, max_tokens=64, temperature=0.0, top_p=1.0, top_k=0, seed=0, stop=None, chat=false))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &str,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: u32,
        seed: u64,
        stop: Option<Vec<String>>,
        chat: bool,
    ) -> PyResult<String> {
        self.stream(
            prompt,
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            stop,
            chat,
        )?
        .collect(py)
    }

    /// [`Model::generate`], as an iterator of text pieces as they are produced. The stream's
    /// `finish_reason`, `prompt_tokens` and `completion_tokens` are set once it ends;
    /// `close()` (or dropping it) stops the generation.
    #[pyo3(signature = (prompt, *, max_tokens=64, temperature=0.0, top_p=1.0, top_k=0, seed=0, stop=None, chat=false))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn stream(
        &self,
        prompt: &str,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: u32,
        seed: u64,
        stop: Option<Vec<String>>,
        chat: bool,
    ) -> PyResult<Stream> {
        let ask = Ask::new(
            max_tokens,
            Sampling {
                temperature,
                top_p,
                top_k,
                seed,
            },
            stop,
        );
        Stream::new(self.submit(self.encode(prompt, chat)?, ask)?)
    }

    /// The assistant's reply to `messages` (`[{"role": "system"|"user"|"assistant",
    /// "content": "..."}]`) through the model's chat template; `stream=True` returns a stream.
    #[pyo3(signature = (messages, *, max_tokens=256, temperature=0.0, top_p=1.0, top_k=0, seed=0, stop=None, stream=false))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn chat(
        &self,
        py: Python<'_>,
        messages: Vec<HashMap<String, String>>,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: u32,
        seed: u64,
        stop: Option<Vec<String>>,
        stream: bool,
    ) -> PyResult<Py<PyAny>> {
        if messages.is_empty() {
            return Err(err("messages must hold at least one message"));
        }
        let mut turns = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let (Some(role), Some(content)) = (m.get("role"), m.get("content")) else {
                return Err(err(format!(
                    "messages[{i}] needs a \"role\" and a \"content\""
                )));
            };
            turns.push((role.as_str(), content.as_str()));
        }
        let tok = &self.info.tokenizer;
        let rendered = tok.apply_chat_template(&turns, true).map_err(err)?;
        let ids = tok.encode(&rendered).map_err(err)?;
        let ask = Ask::new(
            max_tokens,
            Sampling {
                temperature,
                top_p,
                top_k,
                seed,
            },
            stop,
        );
        let s = Stream::new(self.submit(ids, ask)?)?;
        if stream {
            Ok(Py::new(py, s)?.into_any())
        } else {
            Ok(s.collect(py)?.into_pyobject(py)?.into_any().unbind())
        }
    }

    /// The token ids of `text` (the tokenizer's own special-token rules).
    fn tokenize(&self, text: &str) -> PyResult<Vec<u32>> {
        self.info.tokenizer.encode(text).map_err(err)
    }

    /// The text of token ids.
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        self.info.tokenizer.decode(&ids).map_err(err)
    }

    fn __repr__(&self) -> String {
        format!(
            "amk.Model({:?}, backend={:?}, max_seq={})",
            self.info.model_id, self.info.backend, self.info.max_seq
        )
    }
}

/// Generations one model lets wait (a Python program rarely has more than a few threads).
const QUEUE: usize = 64;

/// The module: `amk.Model`, `amk.Stream`, `amk.AmkError`.
#[pymodule]
#[pyo3(name = "amk")]
fn amk_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Stream>()?;
    m.add("AmkError", m.py().get_type::<AmkError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
