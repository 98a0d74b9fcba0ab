//! Check 1 (per-task structure: references, ABI caps, arity, params, op shape rules),
//! `Counter.init`, and checks 2/3 (waits against producers).

use super::*;

impl<'a> Validator<'a> {
    // ---- Check 1: per-task structure ------------------------------------------------------

    pub(super) fn check_task(&mut self, t: &'a Task) {
        let refs_ok = self.check_refs(t);
        self.check_caps(t);
        self.check_ranks(t);
        self.check_task_waits(t);
        self.check_read_only_writes(t);
        let Some(spec) = self.reg.get(t.op) else {
            self.err(
                ValidationError::new(
                    ErrorKind::UnregisteredOp,
                    format!(
                        "{} uses opcode {} (code {}), which no registered op provides",
                        tag(t),
                        t.op,
                        t.op.0
                    ),
                )
                .task(t.id),
            );
            return;
        };
        // Each check runs (and reports) whatever the others found; the op's own rule only
        // on a task whose references, arity, params and dims it can rely on.
        let arity_ok = self.check_arity(t, spec);
        let params_ok = self.check_params(t, spec);
        let dims_ok = self.check_dims(t);
        if refs_ok && arity_ok && params_ok && dims_ok {
            self.check_op_rule(t, spec);
        }
    }

    /// Every buffer and the signalled counter exist; false when a buffer does not.
    fn check_refs(&mut self, t: &'a Task) -> bool {
        let nb = self.p.buffers.len();
        let nc = self.p.counters.len();
        let mut refs_ok = true;
        for &b in &t.inputs {
            if b as usize >= nb {
                refs_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingBuffer,
                        format!("{} reads buffer #{b}, which does not exist", tag(t)),
                    )
                    .task(t.id)
                    .buffer(b),
                );
            }
        }
        for &b in &t.outputs {
            if b as usize >= nb {
                refs_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingBuffer,
                        format!("{} writes buffer #{b}, which does not exist", tag(t)),
                    )
                    .task(t.id)
                    .buffer(b),
                );
            }
        }
        if t.out_counter as usize >= nc {
            self.err(
                ValidationError::new(
                    ErrorKind::MissingCounter,
                    format!(
                        "{} signals counter #{}, which does not exist",
                        tag(t),
                        t.out_counter
                    ),
                )
                .task(t.id)
                .counter(t.out_counter),
            );
        }
        refs_ok
    }

    /// The device instruction's caps on inputs, outputs and waits.
    fn check_caps(&mut self, t: &'a Task) {
        let caps = [
            (
                t.inputs.len(),
                abi::MAX_INPUTS,
                ErrorKind::CapInputs,
                "inputs",
            ),
            (
                t.outputs.len(),
                abi::MAX_OUTPUTS,
                ErrorKind::CapOutputs,
                "outputs",
            ),
            (t.waits.len(), abi::MAX_WAITS, ErrorKind::CapWaits, "waits"),
        ];
        for (n, cap, kind, what) in caps {
            if n > cap {
                self.err(
                    ValidationError::new(
                        kind,
                        format!(
                            "{} has {n} {what}; the device instruction holds at most {cap}",
                            tag(t)
                        ),
                    )
                    .task(t.id),
                );
            }
        }
    }

    /// Every buffer's rank within the device's.
    fn check_ranks(&mut self, t: &'a Task) {
        let all = || t.inputs.iter().chain(&t.outputs);
        for (i, &b) in all().enumerate() {
            if let Some(buf) = self.buf(b) {
                // Report each over-ranked buffer once per task.
                if buf.rank() > abi::MAX_RANK && !all().take(i).any(|&x| x == b) {
                    self.err(
                        ValidationError::new(
                            ErrorKind::CapRank,
                            format!(
                                "{} uses buffer #{b} ('{}') of rank {}; the device supports rank ≤ {}",
                                tag(t),
                                buf.name,
                                buf.rank(),
                                abi::MAX_RANK
                            ),
                        )
                        .task(t.id)
                        .buffer(b),
                    );
                }
            }
        }
    }

    /// Every wait's counter exists and its threshold is at least 1; no task waits on the
    /// counter only it advances.
    fn check_task_waits(&mut self, t: &'a Task) {
        let nc = self.p.counters.len();
        for w in &t.waits {
            if w.counter as usize >= nc {
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingCounter,
                        format!(
                            "{} waits on counter #{}, which does not exist",
                            tag(t),
                            w.counter
                        ),
                    )
                    .task(t.id)
                    .counter(w.counter),
                );
            }
            if w.threshold < 1 {
                self.err(
                    ValidationError::new(
                        ErrorKind::BadThreshold,
                        format!(
                            "{} waits for counter #{} to reach {}; thresholds must be ≥ 1",
                            tag(t),
                            w.counter,
                            w.threshold
                        ),
                    )
                    .task(t.id)
                    .counter(w.counter),
                );
            }
        }
        for w in &t.waits {
            if w.counter == t.out_counter {
                self.err(
                    ValidationError::new(
                        ErrorKind::SelfWait,
                        format!(
                            "{} waits on counter #{}, which only it could advance (self-deadlock)",
                            tag(t),
                            w.counter
                        ),
                    )
                    .task(t.id)
                    .counter(w.counter),
                );
                break;
            }
        }
    }

    /// No output is a read-only buffer.
    fn check_read_only_writes(&mut self, t: &'a Task) {
        for &b in &t.outputs {
            if let Some(buf) = self.buf(b)
                && buf.kind.is_read_only()
            {
                self.err(
                    ValidationError::new(
                        ErrorKind::WriteReadonly,
                        format!(
                            "{} writes buffer #{b} ('{}') of kind {}, which is read-only",
                            tag(t),
                            buf.name,
                            buf.kind
                        ),
                    )
                    .task(t.id)
                    .buffer(b),
                );
            }
        }
    }

    /// The op's input and output counts; false when either is off.
    fn check_arity(&mut self, t: &'a Task, spec: &crate::OpSpec) -> bool {
        let mut op_ok = true;
        let ni = t.inputs.len();
        if ni < spec.min_inputs as usize || spec.max_inputs.is_some_and(|m| ni > m as usize) {
            op_ok = false;
            self.err(
                ValidationError::new(
                    ErrorKind::ArityInputs,
                    format!(
                        "{} has {ni} inputs; {} takes {}",
                        tag(t),
                        spec.name,
                        spec.arity_text()
                    ),
                )
                .task(t.id),
            );
        }
        if let Some(no) = spec.n_outputs
            && t.outputs.len() != no as usize
        {
            op_ok = false;
            self.err(
                ValidationError::new(
                    ErrorKind::ArityOutputs,
                    format!(
                        "{} has {} outputs; {} writes exactly {no}",
                        tag(t),
                        t.outputs.len(),
                        spec.name
                    ),
                )
                .task(t.id),
            );
        }
        op_ok
    }

    /// The op's required params are there and every param has its declared type (an unknown
    /// one is a warning); false when one is missing or mistyped.
    fn check_params(&mut self, t: &'a Task, spec: &crate::OpSpec) -> bool {
        let mut op_ok = true;
        for decl in spec.required_params() {
            if !t.params.contains_key(&decl.name) {
                op_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::MissingParam,
                        format!(
                            "{} lacks the param '{}' that {} requires",
                            tag(t),
                            decl.name,
                            spec.name
                        ),
                    )
                    .task(t.id),
                );
            }
        }
        for (k, v) in t.params.iter() {
            match spec.param_type(k) {
                None => self.warn(
                    ValidationWarning::new(
                        WarningKind::UnknownParam,
                        format!(
                            "{} has param '{k}', which is not a device param field and not declared by {}; it will not reach the device",
                            tag(t),
                            spec.name
                        ),
                    )
                    .task(t.id),
                ),
                Some(ty) => {
                    let good = match ty {
                        ParamType::Int => v
                            .as_i64()
                            .is_some_and(|i| i >= i32::MIN as i64 && i <= i32::MAX as i64),
                        ParamType::Real => v.as_f64().is_some_and(|f| f.abs() <= f32::MAX as f64),
                        ParamType::Object => matches!(v, Value::Object(_)),
                    };
                    if !good {
                        op_ok = false;
                        let want = match ty {
                            ParamType::Int => "an integer within int32",
                            ParamType::Real => "a number within float32 range",
                            ParamType::Object => "an object",
                        };
                        self.err(
                            ValidationError::new(
                                ErrorKind::ParamType,
                                format!(
                                    "{} param '{k}' = {} must be {want}",
                                    tag(t),
                                    v.render_compact()
                                ),
                            )
                            .task(t.id),
                        );
                    }
                }
            }
        }
        op_ok
    }

    /// No buffer has a zero-sized dim; false when one has.
    fn check_dims(&mut self, t: &'a Task) -> bool {
        let mut op_ok = true;
        // Zero-sized dims never load from JSON, but a program built in memory may have them;
        // op rules divide by dims, so refuse them here.
        for &b in t.inputs.iter().chain(&t.outputs) {
            if let Some(buf) = self.buf(b)
                && buf.shape.contains(&0)
            {
                op_ok = false;
                self.err(
                    ValidationError::new(
                        ErrorKind::ShapeMismatch,
                        format!(
                            "{} uses buffer #{b} ('{}') with a zero-sized dim {:?}",
                            tag(t),
                            buf.name,
                            buf.shape
                        ),
                    )
                    .task(t.id)
                    .buffer(b),
                );
            }
        }
        op_ok
    }

    /// The op's own shape and parameter rule.
    fn check_op_rule(&mut self, t: &'a Task, spec: &crate::OpSpec) {
        if let Some(check) = spec.check {
            let ctx = TaskContext {
                task: t,
                buffers: &self.p.buffers,
                registry: self.reg,
            };
            for f in check(&ctx) {
                self.err(
                    ValidationError::new(f.kind, format!("{}: {}", tag(t), f.message)).task(t.id),
                );
            }
        }
    }

    pub(super) fn check_counters(&mut self) {
        for c in &self.p.counters {
            if c.init != 0 {
                self.err(
                    ValidationError::new(
                        ErrorKind::CounterInit,
                        format!(
                            "counter #{} starts at {}; counters are zeroed at every launch, so init must be 0",
                            c.id, c.init
                        ),
                    )
                    .counter(c.id),
                );
            }
        }
    }

    // ---- Checks 2/3: waits vs producers ---------------------------------------------------

    pub(super) fn check_waits(&mut self) {
        for t in &self.p.tasks {
            for w in &t.waits {
                if w.counter as usize >= self.p.counters.len() {
                    continue;
                }
                let np = self.idx.n_producers(w.counter) as i64;
                if np == 0 {
                    self.err(
                        ValidationError::new(
                            ErrorKind::NoProducer,
                            format!(
                                "{} waits on counter #{}, which no task signals (deadlock)",
                                tag(t),
                                w.counter
                            ),
                        )
                        .task(t.id)
                        .counter(w.counter),
                    );
                } else if w.threshold < 1 {
                    // Already reported as bad_threshold.
                } else if w.threshold > np {
                    self.err(
                        ValidationError::new(
                            ErrorKind::ThresholdExceeds,
                            format!(
                                "{} waits for counter #{} to reach {}, but only {np} task(s) signal it (deadlock)",
                                tag(t),
                                w.counter,
                                w.threshold
                            ),
                        )
                        .task(t.id)
                        .counter(w.counter),
                    );
                } else if np > 1 && w.threshold != np {
                    self.err(
                        ValidationError::new(
                            ErrorKind::PartialSharedWait,
                            format!(
                                "{} waits for {} of the {np} signals on shared counter #{}; a count cannot tell which producers finished, so a shared counter must be waited on in full ({np})",
                                tag(t),
                                w.threshold,
                                w.counter
                            ),
                        )
                        .task(t.id)
                        .counter(w.counter),
                    );
                }
            }
        }
    }
}
