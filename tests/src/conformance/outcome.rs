//! What a case returns and what a run of the suite reports.

use std::fmt;

/// Why a case failed: a human message naming the case, the step and the output.
#[derive(Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Debug for Failure {
    // Printed raw, so a failing `#[test]` shows the message as written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

pub(super) fn fail(msg: impl Into<String>) -> Failure {
    Failure(msg.into())
}

/// The result of one case.
pub type CaseResult = Result<(), Failure>;

/// The outcome of [`run_all`](super::run_all).
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Backend name.
    pub backend: String,
    /// Cases that passed.
    pub passed: Vec<&'static str>,
    /// Cases that failed, with why.
    pub failed: Vec<(&'static str, Failure)>,
}

impl Report {
    /// Whether every case passed.
    pub fn ok(&self) -> bool {
        self.failed.is_empty()
    }
    /// One line per failure after a count line.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "conformance on '{}': {} passed, {} failed",
            self.backend,
            self.passed.len(),
            self.failed.len()
        );
        for (name, why) in &self.failed {
            s.push_str(&format!("\n  {name}: {why}"));
        }
        s
    }
    /// `Ok` when every case passed, else the summary as a [`Failure`].
    pub fn into_result(self) -> CaseResult {
        if self.ok() {
            Ok(())
        } else {
            Err(fail(self.summary()))
        }
    }
}
