//! The schedule IR: every type of the specification.

pub mod config;
pub mod enums;
pub mod opcode;
pub mod program;
pub mod records;

pub use config::{GpuTarget, PageStrategy, ScheduleConfig, SmAssignment};
pub use enums::{BufferKind, DType, MemSpace};
pub use opcode::Opcode;
pub use program::{ABI_VERSION, CounterIndex, IR_VERSION, Program, StepLoop};
pub use records::{
    Buffer, BufferId, Counter, CounterId, Page, PageAllocation, PageId, Task, TaskId, Wait,
};
