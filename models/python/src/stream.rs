//! `amk.Stream`: a generation's text, piece by piece, as the engine produces it.

use crate::err;
use amk_server::worker::Event;
use pyo3::prelude::*;
use std::sync::Mutex;
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
}

impl Stream {
    pub(crate) fn new(events: mpsc::UnboundedReceiver<Event>) -> Stream {
        Stream {
            events: Mutex::new(Some(events)),
            end: Mutex::new(End::default()),
        }
    }

    /// The next piece of text, `None` at the end. The interpreter's lock is released while it
    /// waits; a pending signal (Ctrl-C) ends the stream with its exception.
    fn next_piece(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = self
            .events
            .lock()
            .map_err(|_| err("the stream was poisoned by an earlier panic"))?;
        loop {
            let Some(rx) = guard.as_mut() else {
                return Ok(None);
            };
            let event = py.detach(|| rx.blocking_recv());
            if let Err(e) = py.check_signals() {
                *guard = None; // cancels the generation at its next token
                return Err(e);
            }
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
        if let Ok(mut g) = self.events.lock() {
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
