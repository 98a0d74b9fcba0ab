//! `amk.Stream`: a generation's text, piece by piece, as the engine produces it.

use crate::err;
use amk_server::worker::Event;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;
use tokio::sync::mpsc;

/// How a generation ended.
#[derive(Debug, Clone, Copy, Default)]
struct End {
    finish: Option<&'static str>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

/// A generation's text as an iterator of pieces.
#[pyclass(module = "amk")]
pub struct Stream {
    /// The events, until the end (then `None`: dropping it cancels a generation still
    /// running).
    events: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    end: Mutex<End>,
    /// Set by `close()`: whichever thread reads next drops the events (a reader may hold
    /// `events` while it waits, so `close()` does not wait for it).
    closing: AtomicBool,
    /// Waits for the next event with a timeout (so that Ctrl-C is seen while a generation
    /// waits its turn or a long prompt runs), without polling.
    clock: tokio::runtime::Runtime,
}

/// How often a waiting call looks for a pending signal (Ctrl-C).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Locks `m` without holding the interpreter's lock while it waits: another thread may hold
/// `m` while it waits for a token with the interpreter's lock released, and needs that lock
/// back to finish.
fn lock<'a, T>(py: Python<'_>, m: &'a Mutex<T>) -> PyResult<MutexGuard<'a, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Ok(g),
            Err(TryLockError::WouldBlock) => py.detach(|| std::thread::sleep(LOCK_RETRY)),
            Err(TryLockError::Poisoned(_)) => {
                return Err(err("the stream was poisoned by an earlier panic"));
            }
        }
    }
}

/// How long a thread waiting for another's use of a stream sleeps between tries.
const LOCK_RETRY: Duration = Duration::from_millis(1);

impl Stream {
    pub(crate) fn new(events: mpsc::UnboundedReceiver<Event>) -> PyResult<Stream> {
        let clock = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(err)?;
        Ok(Stream {
            events: Mutex::new(Some(events)),
            end: Mutex::new(End::default()),
            closing: AtomicBool::new(false),
            clock,
        })
    }

    /// The next piece of text, `None` at the end. The interpreter's lock is released while it
    /// waits; a pending signal (Ctrl-C) ends the stream with its exception.
    fn next_piece(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = lock(py, &self.events)?;
        loop {
            if self.closing.load(Ordering::Acquire) {
                *guard = None;
            }
            let Some(rx) = guard.as_mut() else {
                return Ok(None);
            };
            let clock = &self.clock;
            // The timer is made inside the runtime (it needs the runtime's clock).
            let waited = py.detach(|| {
                clock.block_on(async { tokio::time::timeout(SIGNAL_CHECK, rx.recv()).await })
            });
            if let Err(e) = py.check_signals() {
                *guard = None; // cancels the generation at its next token
                return Err(e);
            }
            let Ok(event) = waited else {
                continue; // no event yet: look for signals again
            };
            match event {
                Some(Event::Delta { text, .. }) if text.is_empty() => continue,
                Some(Event::Delta { text, .. }) => return Ok(Some(text)),
                Some(Event::Done(s)) => {
                    *guard = None;
                    if let Ok(mut end) = self.end.lock() {
                        *end = End {
                            finish: Some(s.finish),
                            prompt_tokens: s.prompt_tokens,
                            completion_tokens: s.completion_tokens,
                        };
                    }
                    return Ok(None);
                }
                Some(Event::Failed(e)) => {
                    *guard = None;
                    return Err(err(e.message));
                }
                None => {
                    *guard = None;
                    return Err(err("the engine stopped during the generation"));
                }
            }
        }
    }

    /// Every piece, joined.
    pub(crate) fn collect(&self, py: Python<'_>) -> PyResult<String> {
        let mut text = String::new();
        while let Some(piece) = self.next_piece(py)? {
            text.push_str(&piece);
        }
        Ok(text)
    }

    fn end(&self) -> End {
        // Held only to copy it, never across a wait.
        self.end.lock().map(|e| *e).unwrap_or_default()
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.next_piece(py)
    }

    /// Stops the generation (at its next token); the stream then ends.
    fn close(&self) {
        self.closing.store(true, Ordering::Release);
        // Nobody reading: the events go now, and the generation stops at its next token.
        if let Ok(mut g) = self.events.try_lock() {
            *g = None;
        }
    }

    /// "stop" (an end token or a stop string) or "length" once the stream has ended, else
    /// None.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.end().finish
    }

    /// The prompt's tokens, once the stream has ended.
    #[getter]
    fn prompt_tokens(&self) -> usize {
        self.end().prompt_tokens
    }

    /// Tokens generated (an end token included), once the stream has ended.
    #[getter]
    fn completion_tokens(&self) -> usize {
        self.end().completion_tokens
    }
}
