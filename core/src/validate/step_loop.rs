//! Check 10: a program that runs as the body of a loop of passes inside one launch
//! ([`StepLoop`]).
//!
//! The loop keeps the single-pass proofs valid pass after pass when the gate is a barrier:
//! pass k + 1 starts (in every block) only once the gate counter holds k times its producers.
//! If every task reaches a producer of the gate, all of pass k happens before any of pass
//! k + 1, so every counter holds exactly k times its producer count when pass k + 1 starts
//! (every wait is a full wait), and no access of pass k + 1 can meet one of pass k: the
//! race proofs of one pass cover the loop. What the gate's producers write before they
//! signal (the `halt` word) is final for every block that passed the gate.

use super::*;

impl Validator<'_> {
    pub(super) fn check_step_loop(&mut self) {
        let Some(l) = self.p.step_loop else {
            return;
        };
        self.check_halt(l.halt);
        if l.gate as usize >= self.p.counters.len() {
            self.err(
                ValidationError::new(
                    ErrorKind::StepLoop,
                    format!(
                        "the step loop's gate is counter #{}, which does not exist",
                        l.gate
                    ),
                )
                .counter(l.gate),
            );
            return;
        }
        if self.idx.n_producers(l.gate) == 0 {
            self.err(
                ValidationError::new(
                    ErrorKind::StepLoop,
                    format!(
                        "no task signals the step loop's gate counter #{}: the second pass could never start",
                        l.gate
                    ),
                )
                .counter(l.gate),
            );
            return;
        }
        let missing = self.tasks_not_reaching(l.gate);
        if !missing.is_empty() {
            let shown: Vec<String> = (missing.iter().take(8))
                .map(|&t| format!("{t}:{}", self.p.tasks[t as usize].display_label()))
                .collect();
            self.err(
                ValidationError::new(
                    ErrorKind::StepLoop,
                    format!(
                        "{} task(s) reach no producer of the gate counter #{}, so the next pass could start while they run (e.g. {})",
                        missing.len(),
                        l.gate,
                        shown.join(", ")
                    ),
                )
                .task(missing[0])
                .counter(l.gate)
                .others(missing),
            );
        }
    }

    fn check_halt(&mut self, b: BufferId) {
        let Some(buf) = self.buf(b) else {
            self.err(
                ValidationError::new(
                    ErrorKind::StepLoop,
                    format!("the step loop's halt buffer #{b} does not exist"),
                )
                .buffer(b),
            );
            return;
        };
        if buf.kind != BufferKind::STATE || !buf.dtype.is_integer() || buf.numel() == 0 {
            self.err(
                ValidationError::new(
                    ErrorKind::StepLoop,
                    format!(
                        "the step loop's halt buffer #{b} ('{}') is {} {} {:?}; it must be an integer STATE buffer of at least one element",
                        buf.name, buf.kind, buf.dtype, buf.shape
                    ),
                )
                .buffer(b),
            );
        }
    }

    /// Tasks from which no producer of `gate` can be reached along dependency edges (a task
    /// reaches its own counter's producers trivially when it is one), ascending.
    fn tasks_not_reaching(&self, gate: CounterId) -> Vec<TaskId> {
        let n = self.p.tasks.len();
        let mut reached = vec![false; n];
        let mut stack: Vec<TaskId> = self.idx.producers(gate).to_vec();
        for &t in &stack {
            reached[t as usize] = true;
        }
        // Backwards: a task reaches the gate when a task waiting on its counter does.
        while let Some(t) = stack.pop() {
            for w in &self.p.tasks[t as usize].waits {
                for &u in self.idx.producers(w.counter) {
                    if !reached[u as usize] {
                        reached[u as usize] = true;
                        stack.push(u);
                    }
                }
            }
        }
        (0..n as TaskId).filter(|&t| !reached[t as usize]).collect()
    }
}
