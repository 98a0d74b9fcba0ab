//! Check 5b (on-chip buffers), check 6 (SM queues) and check 8 (outputs, labels).

use super::*;

impl Validator<'_> {
    // ---- Check 5b: on-chip buffers ------------------------------------------------------------

    pub(super) fn check_onchip(&mut self) {
        if !self.p.buffers.iter().any(|b| b.space.is_on_chip()) {
            return;
        }
        let mut users: HashMap<BufferId, Vec<TaskId>> = HashMap::new();
        for t in &self.p.tasks {
            for &b in t.inputs.iter().chain(&t.outputs) {
                if self.buf(b).is_some_and(|x| x.space.is_on_chip()) {
                    users.entry(b).or_default().push(t.id);
                }
            }
        }
        let mut bs: Vec<_> = users.into_iter().collect();
        bs.sort_by_key(|(b, _)| *b);
        for (b, us) in bs {
            let buf = &self.p.buffers[b as usize];
            let mut sms: Vec<i32> = us
                .iter()
                .filter_map(|&t| self.p.tasks[t as usize].sm)
                .collect();
            sms.sort_unstable();
            sms.dedup();
            let unplaced = us.iter().any(|&t| self.p.tasks[t as usize].sm.is_none());
            if sms.len() > 1 {
                let list: Vec<String> = sms.iter().map(|s| s.to_string()).collect();
                self.err(
                    ValidationError::new(
                        ErrorKind::OnchipCrossSm,
                        format!(
                            "on-chip buffer #{b} ('{}', {}) is used from SMs {}; counters order tasks but cannot move on-chip data between SMs (use GLOBAL_SCRATCH/HBM or place all users on one SM)",
                            buf.name,
                            buf.space,
                            list.join(", ")
                        ),
                    )
                    .buffer(b)
                    .others(us),
                );
            } else if unplaced {
                self.warn(
                    ValidationWarning::new(
                        WarningKind::OnchipUnverified,
                        format!(
                            "on-chip buffer #{b} ('{}') needs all its users on one SM, but some are not assigned an SM yet",
                            buf.name
                        ),
                    )
                    .buffer(b),
                );
            }
        }
    }

    // ---- Check 6: SM queues ----------------------------------------------------------------

    pub(super) fn check_sms(
        &mut self,
        acyclic: bool,
        queue_deadlock: bool,
        next: Option<&[TaskId]>,
    ) {
        let Some(next) = next else {
            return;
        };
        let p = self.p;
        // Each SM runs its queue in task-list order, so the dependency edges plus "next on the
        // same SM" edges must be acyclic; a cycle through several SMs deadlocks just the same
        // as a producer listed after its consumer on one SM. `run` decided it with one Kahn
        // pass; only when it failed (or the dependency graph itself is cyclic) do we look for
        // the direct same-SM violations, whose messages are the most precise.
        let queue_cycle = queue_deadlock
            .then(|| crate::graph::find_cycle_with(p, self.idx, Some(next)).unwrap_or_default());
        if !acyclic || queue_cycle.is_some() {
            let before = self.count(ErrorKind::SmQueueOrder);
            self.direct_sm_violations();
            let direct_found = self.count(ErrorKind::SmQueueOrder) > before;
            if let Some(path) = queue_cycle
                && !direct_found
            {
                let rendered: Vec<String> = path
                    .iter()
                    .map(|&t| match p.tasks[t as usize].sm {
                        Some(s) => format!("{t}@SM{s}"),
                        None => format!("{t}"),
                    })
                    .collect();
                let mut d = ValidationError::new(
                    ErrorKind::SmQueueOrder,
                    format!(
                        "the SM queues deadlock: each SM runs its tasks in list order, and this cycle of dependencies and queue order can never make progress: {}",
                        rendered.join(" -> ")
                    ),
                );
                d.task = path.first().copied();
                d.path = path;
                self.err(d);
            }
        }
        let num_sms = p.target.as_ref().map(|t| t.num_sms);
        for t in &p.tasks {
            let Some(s) = t.sm else { continue };
            let bad = s < 0 || num_sms.is_some_and(|n| s as i64 >= n);
            if bad {
                let range = num_sms.map_or_else(|| "≥ 0".to_string(), |n| format!("in [0, {n})"));
                self.err(
                    ValidationError::new(
                        ErrorKind::SmOutOfRange,
                        format!("task {} is assigned to SM {s}; SMs must be {range}", t.id),
                    )
                    .task(t.id),
                );
            }
        }
    }

    pub(super) fn count(&self, kind: ErrorKind) -> usize {
        self.counts.get(&kind).copied().unwrap_or(0)
    }

    /// A producer listed after its consumer on the same SM.
    pub(super) fn direct_sm_violations(&mut self) {
        let p = self.p;
        let idx = self.idx;
        for t in &p.tasks {
            let Some(s) = t.sm else { continue };
            for (i, w) in t.waits.iter().enumerate() {
                if t.waits[..i].iter().any(|x| x.counter == w.counter) {
                    continue;
                }
                for &a in idx.producers(w.counter) {
                    if a >= t.id && p.tasks[a as usize].sm == Some(s) {
                        self.err(
                            ValidationError::new(
                                ErrorKind::SmQueueOrder,
                                format!(
                                    "SM {s} runs task {} after task {a}, but task {} depends on task {a}: the SM would wait forever on its own later queue entry",
                                    t.id, t.id
                                ),
                            )
                            .task(t.id)
                            .others(vec![a]),
                        );
                    }
                }
            }
        }
    }

    // ---- Check 8: outputs and labels ---------------------------------------------------------

    pub(super) fn check_outputs(&mut self) {
        let mut written = vec![false; self.p.buffers.len()];
        for t in &self.p.tasks {
            for &b in &t.outputs {
                if let Some(w) = written.get_mut(b as usize) {
                    *w = true;
                }
            }
        }
        for b in &self.p.buffers {
            if b.kind == BufferKind::IO_OUTPUT && !written[b.id as usize] {
                self.err(
                    ValidationError::new(
                        ErrorKind::OutputUnproduced,
                        format!(
                            "output buffer #{} ('{}') is never written by any task",
                            b.id, b.name
                        ),
                    )
                    .buffer(b.id),
                );
            }
        }
        self.check_config();
        if let (Some(t), Some(Value::Str(gpu))) = (&self.p.target, self.p.meta.get("gpu"))
            && !gpu.is_empty()
            && *gpu != t.name
        {
            self.warn(ValidationWarning::new(
                    WarningKind::GpuLabelMismatch,
                    format!(
                        "meta.gpu is '{gpu}' but the target is '{}'; results are filed under the target's name",
                        t.name
                    ),
                ));
        }
    }

    /// The config's kernel-build knobs as the reference checks them before lowering
    /// (`threads_per_block` a multiple of 32 in [32, 1024], `smem_bytes_per_block` between 0
    /// and the target's opt-in cap, `pipelining_depth` ≥ 0), and a target whose sizes and
    /// rates are positive (finite, for the rates).
    fn check_config(&mut self) {
        let mut bad: Vec<String> = match &self.p.config {
            Some(c) => (c.kernel_knob_errors(self.p.target.as_ref()).into_iter())
                .map(|m| format!("config.{m}"))
                .collect(),
            None => Vec::new(),
        };
        if let Some(t) = &self.p.target {
            let sizes = [
                ("num_sms", t.num_sms),
                ("smem_bytes_per_sm", t.smem_bytes_per_sm),
                ("smem_bytes_per_block_optin", t.smem_bytes_per_block_optin),
                ("regs_per_sm", t.regs_per_sm),
                ("max_threads_per_sm", t.max_threads_per_sm),
                ("max_regs_per_thread", t.max_regs_per_thread),
                ("l2_bytes", t.l2_bytes),
                ("hbm_bytes", t.hbm_bytes),
            ];
            for (k, v) in sizes {
                if v <= 0 {
                    bad.push(format!("target.{k} = {v} must be positive"));
                }
            }
            let rates = [
                ("hbm_bandwidth_gbs", t.hbm_bandwidth_gbs),
                ("fp16_tflops", t.fp16_tflops),
                ("clock_ghz", t.clock_ghz),
            ];
            for (k, v) in rates {
                if !(v.is_finite() && v > 0.0) {
                    bad.push(format!("target.{k} = {v} must be a positive number"));
                }
            }
        }
        for msg in bad {
            self.err(ValidationError::new(ErrorKind::BadConfig, msg));
        }
    }
}
