//! A readable summary of one traced step (see [`CudaSession::enable_trace`]): where the time
//! went, per op, and how long handoffs between blocks took.

use super::CudaSession;
use crate::CudaError;
use std::collections::BTreeMap;

/// Nearest-rank quantile of sorted samples (0 for none).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

impl CudaSession {
    /// Per op: how many tasks, their mean and total run time (waits met → signalled), their
    /// mean wait (reached → waits met); and the handoff latency (a task's last producer
    /// signalled → the task's waits met). Empty trace → a one-line note.
    pub fn trace_summary(&self) -> Result<String, CudaError> {
        let tr = self.trace()?;
        if tr.is_empty() {
            return Ok("  (no trace: call enable_trace before the step)\n".into());
        }
        let p = self.program();
        let t0 = tr.iter().map(|t| t.reached).min().unwrap_or(0);
        let t1 = tr.iter().map(|t| t.done).max().unwrap_or(0);
        let mut done_of_counter: Vec<u64> = vec![0; p.counters.len()];
        for t in &tr {
            let c = p.tasks[t.task].out_counter as usize;
            if let Some(d) = done_of_counter.get_mut(c) {
                *d = (*d).max(t.done);
            }
        }
        let mut by_op: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
        let mut by_kind: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
        let mut handoffs: Vec<f64> = Vec::new();
        for t in &tr {
            let task = &p.tasks[t.task];
            let name = self
                .registry
                .name_of(task.op)
                .map_or_else(|| task.op.to_string(), |n| n.into_owned());
            let (run, wait) = (
                t.done.saturating_sub(t.ready) as f64 / 1e3,
                t.ready.saturating_sub(t.reached) as f64 / 1e3,
            );
            for e in [
                by_op.entry(name).or_default(),
                // The label without its numbers: one row per kind of task (a layer's
                // projection, its tiles, ...), where per-op means hide the shapes.
                by_kind
                    .entry(task.label.chars().filter(|c| !c.is_ascii_digit()).collect())
                    .or_default(),
            ] {
                e.0 += 1;
                e.1 += run;
                e.2 += wait;
            }
            let last = task
                .waits
                .iter()
                .filter_map(|w| done_of_counter.get(w.counter as usize).copied())
                .max();
            if let Some(last) = last
                && t.ready > t.reached
                && last > 0
            {
                handoffs.push(t.ready.saturating_sub(last) as f64 / 1e3);
            }
        }
        handoffs.sort_by(f64::total_cmp);
        let mut out = format!(
            "  traced step {:.3} ms over {} tasks; handoff (producer signalled -> waiter ready) median {:.2} us, p90 {:.2} us\n  | op | tasks | mean run us | total run ms | mean wait us |\n",
            (t1 - t0) as f64 / 1e6,
            tr.len(),
            quantile(&handoffs, 0.5),
            quantile(&handoffs, 0.9),
        );
        for (op, (n, run, wait)) in by_op {
            out.push_str(&format!(
                "  | {op} | {n} | {:.2} | {:.3} | {:.2} |\n",
                run / n as f64,
                run / 1e3,
                wait / n as f64
            ));
        }
        out.push_str(
            "  | task kind (label without numbers) | tasks | mean run us | mean wait us |\n",
        );
        for (kind, (n, run, wait)) in by_kind {
            out.push_str(&format!(
                "  | {kind} | {n} | {:.2} | {:.2} |\n",
                run / n as f64,
                wait / n as f64
            ));
        }
        Ok(out)
    }
}
