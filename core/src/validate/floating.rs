//! Check 3a: floating tasks ([`Task::floating`]).
//!
//! A floating task sits in no queue; the block whose signal brings its wait's counter to the
//! threshold runs it. The other checks need no change for it: its happens-before edges are
//! its wait and its signal (the race checks use only counter edges), and a task that never
//! blocks cannot be on a wait cycle, so the queue-order check runs on the queues without it
//! (it has no SM). What they cannot see is whether "the block that completes the counter" is
//! one well-defined block that runs it once, after everything it waits for; these rules make
//! it so:
//!
//! - exactly one wait, and that wait full (its threshold the counter's producers): the
//!   completing signal is the last producer's, whichever SM it runs on;
//! - no other task waits on that counter: the runner is chosen by the count alone, and
//!   nothing else observes it;
//! - no producer of that counter is floating itself (no chains of floating tasks);
//! - no SM of its own, and no on-chip buffer (its SM is not known statically).

use super::*;

impl Validator<'_> {
    pub(super) fn check_floating(&mut self) {
        for t in self.p.tasks.iter().filter(|t| t.floating) {
            if let Some(s) = t.sm {
                self.floating_err(
                    t,
                    None,
                    format!(
                        "has SM {s}, but a floating task runs on the SM that completes its wait"
                    ),
                );
            }
            self.check_floating_wait(t);
            self.check_floating_buffers(t);
        }
    }

    /// One full wait, on a counter only this task waits on and no floating task signals.
    fn check_floating_wait(&mut self, t: &Task) {
        let [w] = t.waits.as_slice() else {
            let n = t.waits.len();
            self.floating_err(
                t,
                None,
                format!(
                    "has {n} waits; a floating task has exactly one (the completing signal runs it)"
                ),
            );
            return;
        };
        if w.counter as usize >= self.p.counters.len() {
            return; // missing_counter
        }
        let np = self.idx.n_producers(w.counter) as i64;
        if np > 0 && w.threshold != np {
            self.floating_err(
                t,
                Some(w.counter),
                format!(
                    "waits for {} of the {np} signals on counter #{}; a floating task's wait must be full, so that one signal completes it",
                    w.threshold, w.counter
                ),
            );
        }
        if let Some(&other) = self.idx.waiters(w.counter).iter().find(|&&o| o != t.id) {
            self.floating_err(
                t,
                Some(w.counter),
                format!(
                    "waits on counter #{}, which task {other} waits on too; a floating task's counter has no other waiter",
                    w.counter
                ),
            );
        }
        let floating_producer = (self.idx.producers(w.counter).iter())
            .find(|&&q| self.p.tasks.get(q as usize).is_some_and(|q| q.floating));
        if let Some(&q) = floating_producer {
            self.floating_err(
                t,
                Some(w.counter),
                format!(
                    "waits on counter #{}, which floating task {q} signals; floating tasks do not chain",
                    w.counter
                ),
            );
        }
    }

    /// No on-chip buffer: which SM runs the task is decided at run time.
    fn check_floating_buffers(&mut self, t: &Task) {
        let on_chip = (t.inputs.iter().chain(&t.outputs))
            .find(|&&b| self.buf(b).is_some_and(|x| x.space.is_on_chip()));
        if let Some(&b) = on_chip {
            let name = self.bname(b);
            let d = ValidationError::new(
                ErrorKind::FloatingTask,
                format!(
                    "{} is floating but uses on-chip buffer #{b} ({name}), whose SM must be known statically",
                    tag(t)
                ),
            )
            .task(t.id)
            .buffer(b);
            self.err(d);
        }
    }

    fn floating_err(&mut self, t: &Task, counter: Option<CounterId>, what: String) {
        let mut d =
            ValidationError::new(ErrorKind::FloatingTask, format!("{} {what}", tag(t))).task(t.id);
        d.counter = counter;
        self.err(d);
    }
}
