//! Runtime param patches: changing a validated program's integer params between steps (a
//! decode loop moves `KV_APPEND.pos`, `ATTENTION_TILE.kv_start` / `kv_len` each token) without
//! re-validating the whole program.
//!
//! Why this is sound: the validator's graph proofs (waits vs producers, acyclicity, SM queue
//! order, read-after-write provenance, pages) depend only on the tasks' buffers, waits and
//! counters, never on params; the write-after-write proof depends on the tile-region params
//! (`n_off`, `N_tile`, `m_off`, `M_tile`) only. So a patch that leaves those alone and passes
//! each edited task's structural and shape checks (check 1) leaves every proof intact.
//!
//! What the validator cannot know is whether the rows an attention task reads were appended
//! by an earlier step: that is the decode loop's contract (its position plan moves KV_APPEND
//! and attention together), as it is for any KV cache.

use super::{ValidatedProgram, ValidationResult, Validator};
use crate::ir::{Task, TaskId};
use crate::json::Value;
use crate::registry::Registry;

/// Params a patch may never change: they define which region of its output a task writes.
pub const REGION_PARAMS: [&str; 4] = ["n_off", "N_tile", "m_off", "M_tile"];

/// A set of `(task, param, value)` edits that [`ValidatedProgram::check_patch`] accepted.
/// Only that method constructs one, so a backend can apply it without re-checking.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamPatch {
    entries: Vec<(TaskId, String, i64)>,
    program_id: u64,
}

impl ParamPatch {
    /// The accepted edits, in the order given.
    pub fn entries(&self) -> &[(TaskId, String, i64)] {
        &self.entries
    }
    /// The [`ValidatedProgram::id`] it was checked against (a backend compares it with the
    /// program it loaded to refuse a patch meant for another program).
    pub fn program_id(&self) -> u64 {
        self.program_id
    }
    /// The tasks the patch edits.
    pub fn tasks(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.entries.iter().map(|e| e.0)
    }
    /// Applies the edits to `tasks`, which must hold the checked program's **own** params for
    /// every edited task (patches are absolute, checked against the loaded program, so a
    /// backend restores the loaded params of previously patched tasks first).
    pub fn apply(&self, tasks: &mut [Task]) {
        for (t, k, v) in &self.entries {
            if let Some(task) = tasks.get_mut(*t as usize) {
                task.params.insert(k.clone(), Value::Int(*v));
            }
        }
    }
}

impl ValidatedProgram {
    /// Checks edits of integer params against this program: each task must exist, each key
    /// must already be one of its params and not a region param ([`REGION_PARAMS`]), and every
    /// edited task must pass the structural and op shape checks with its new values. Edits are
    /// absolute (relative to this program, not to an earlier patch).
    pub fn check_patch(
        &self,
        reg: &Registry,
        edits: &[(TaskId, &str, i64)],
    ) -> Result<ParamPatch, ValidationResult> {
        use super::diag::ErrorKind;
        use super::{ValidationError, tag};
        let p = self.program();
        let mut bad: Vec<ValidationError> = Vec::new();
        let mut edited: Vec<Task> = Vec::new();
        // Position of each edited task in `edited` (a decode step patches thousands of tiles).
        let mut slot: std::collections::HashMap<TaskId, usize> = std::collections::HashMap::new();
        for &(t, key, value) in edits {
            let Some(task) = p.tasks.get(t as usize) else {
                bad.push(ValidationError::new(
                    ErrorKind::MissingBuffer,
                    format!(
                        "patch names task {t}, but the program has {} tasks",
                        p.tasks.len()
                    ),
                ));
                continue;
            };
            if !task.params.contains_key(key) || REGION_PARAMS.contains(&key) {
                let why = if REGION_PARAMS.contains(&key) {
                    "it decides the region the task writes, which the race proof depends on"
                } else {
                    "the task has no such param"
                };
                bad.push(
                    ValidationError::new(
                        ErrorKind::ParamType,
                        format!("{}: param '{key}' cannot be patched: {why}", tag(task)),
                    )
                    .task(t),
                );
                continue;
            }
            match slot.get(&t).and_then(|&i| edited.get_mut(i)) {
                Some(e) => e.params.insert(key, Value::Int(value)),
                None => {
                    let mut e = task.clone();
                    e.params.insert(key, Value::Int(value));
                    slot.insert(t, edited.len());
                    edited.push(e);
                }
            }
        }
        if bad.is_empty() {
            let mut v = Validator::new(p, reg, self.counter_index());
            for e in &edited {
                v.check_task(e);
            }
            bad = v.errors;
        }
        if bad.is_empty() {
            Ok(ParamPatch {
                entries: edits
                    .iter()
                    .map(|&(t, k, v)| (t, k.to_string(), v))
                    .collect(),
                program_id: self.id(),
            })
        } else {
            Err(ValidationResult {
                errors: bad,
                warnings: Vec::new(),
                stats: self.result().stats.clone(),
                carried_reads: Box::default(),
            })
        }
    }
}
