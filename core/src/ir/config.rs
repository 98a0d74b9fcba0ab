//! Schedule configuration (the search point) and GPU targets (the chip, as data).

/// How tasks are placed on SMs.
#[derive(Debug, Clone, PartialEq)]
pub enum SmAssignment {
    /// i-th task of a topological order → SM `i % num_sms`.
    RoundRobin,
    /// Longest-processing-time greedy over `est_bytes`.
    LoadBalance,
    /// An explicit `task id → SM` map, in file order.
    Explicit(Vec<(u32, u32)>),
}

impl SmAssignment {
    /// The JSON string for the named strategies.
    pub fn name(&self) -> &'static str {
        match self {
            SmAssignment::RoundRobin => "round_robin",
            SmAssignment::LoadBalance => "load_balance",
            SmAssignment::Explicit(_) => "explicit",
        }
    }
}

/// How transient activations are bound to scratch pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageStrategy {
    /// No pages: every activation has its own memory.
    None,
    /// One page per buffer, laid out linearly.
    Linear,
    /// Pages shared between happens-before-separated live ranges.
    GraphColor,
}

impl PageStrategy {
    /// The JSON string.
    pub fn name(self) -> &'static str {
        match self {
            PageStrategy::None => "none",
            PageStrategy::Linear => "linear",
            PageStrategy::GraphColor => "graph_color",
        }
    }
    /// Parses the JSON string.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "none" => Some(PageStrategy::None),
            "linear" => Some(PageStrategy::Linear),
            "graph_color" => Some(PageStrategy::GraphColor),
            _ => None,
        }
    }
}

/// The search point that produced a lowering.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleConfig {
    /// Per-archetype tile sizes, e.g. `gemv → {N_tile: 64}`, in file order.
    pub tiling: Vec<(String, Vec<(String, i64)>)>,
    /// Groups of op names fused into one task.
    pub fusion_grouping: Vec<Vec<String>>,
    /// SM placement strategy.
    pub sm_assignment: SmAssignment,
    /// Instructions-ahead weight prefetch depth.
    pub pipelining_depth: i64,
    /// Page allocation strategy.
    pub page_allocation: PageStrategy,
    /// Block size of the persistent kernel.
    pub threads_per_block: i64,
    /// Dynamic shared memory per block.
    pub smem_bytes_per_block: i64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            tiling: Vec::new(),
            fusion_grouping: Vec::new(),
            sm_assignment: SmAssignment::LoadBalance,
            pipelining_depth: 2,
            page_allocation: PageStrategy::GraphColor,
            threads_per_block: 256,
            smem_bytes_per_block: 0,
        }
    }
}

impl ScheduleConfig {
    /// `tiling[group][key]`, if set.
    pub fn tile(&self, group: &str, key: &str) -> Option<i64> {
        self.tiling
            .iter()
            .find(|(g, _)| g == group)
            .and_then(|(_, kv)| kv.iter().find(|(k, _)| k == key).map(|(_, v)| *v))
    }

    /// The kernel-build knobs out of their range, as the reference checks them before it
    /// lowers (docs/ir.md, "Validator rules", `bad_config`): `threads_per_block` a multiple of
    /// 32 in [32, 1024], `smem_bytes_per_block` between 0 and the target's opt-in cap,
    /// `pipelining_depth` not negative. One message each; none when they are in range.
    pub fn kernel_knob_errors(&self, target: Option<&GpuTarget>) -> Vec<String> {
        let mut bad = Vec::new();
        let tpb = self.threads_per_block;
        if !(32..=1024).contains(&tpb) || tpb % 32 != 0 {
            bad.push(format!(
                "threads_per_block = {tpb} must be a multiple of 32 between 32 and 1024"
            ));
        }
        let cap = target.map_or(i64::MAX, |t| t.smem_bytes_per_block_optin);
        if self.smem_bytes_per_block < 0 || self.smem_bytes_per_block > cap {
            bad.push(format!(
                "smem_bytes_per_block = {} must be between 0 and the target's {cap}",
                self.smem_bytes_per_block
            ));
        }
        if self.pipelining_depth < 0 {
            bad.push(format!(
                "pipelining_depth = {} must not be negative",
                self.pipelining_depth
            ));
        }
        bad
    }
}

/// One built-in target's figures; every target of the table has 65,536 registers an SM, 255
/// a thread and cooperative launch.
struct BuiltinRow {
    name: &'static str,
    sm_arch: i64,
    num_sms: i64,
    smem_bytes_per_sm: i64,
    smem_bytes_per_block_optin: i64,
    max_threads_per_sm: i64,
    l2_bytes: i64,
    hbm_bytes: i64,
    hbm_bandwidth_gbs: f64,
    fp16_tflops: f64,
    clock_ghz: f64,
    measured_bw_gbs: f64,
    wddm_tdr: bool,
    note: &'static str,
}

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

/// The built-in targets, in the reference's order.
const BUILTIN: [BuiltinRow; 8] = [
    BuiltinRow {
        name: "rtx5090",
        sm_arch: 120,
        num_sms: 82,
        smem_bytes_per_sm: 102400,
        smem_bytes_per_block_optin: 101376,
        max_threads_per_sm: 2048,
        l2_bytes: 64 * MIB,
        hbm_bytes: 24 * GIB,
        hbm_bandwidth_gbs: 896.0,
        fp16_tflops: 210.0,
        clock_ghz: 1.597,
        measured_bw_gbs: 731.0,
        wddm_tdr: true,
        note: "RTX 5090 laptop (GB203)",
    },
    BuiltinRow {
        name: "b200",
        sm_arch: 100,
        num_sms: 148,
        smem_bytes_per_sm: 233472,
        smem_bytes_per_block_optin: 232448,
        max_threads_per_sm: 2048,
        l2_bytes: 50 * MIB,
        hbm_bytes: 192 * GIB,
        hbm_bandwidth_gbs: 8000.0,
        fp16_tflops: 2250.0,
        clock_ghz: 1.86,
        measured_bw_gbs: 0.0,
        wddm_tdr: false,
        note: "B200, spec figures",
    },
    BuiltinRow {
        name: "h100",
        sm_arch: 90,
        num_sms: 132,
        smem_bytes_per_sm: 233472,
        smem_bytes_per_block_optin: 232448,
        max_threads_per_sm: 2048,
        l2_bytes: 50 * MIB,
        hbm_bytes: 80 * GIB,
        hbm_bandwidth_gbs: 3350.0,
        fp16_tflops: 989.0,
        clock_ghz: 1.98,
        measured_bw_gbs: 3089.0,
        wddm_tdr: false,
        note: "H100 SXM5",
    },
    BuiltinRow {
        name: "a100",
        sm_arch: 80,
        num_sms: 108,
        smem_bytes_per_sm: 167936,
        smem_bytes_per_block_optin: 166912,
        max_threads_per_sm: 2048,
        l2_bytes: 40 * MIB,
        hbm_bytes: 40 * GIB,
        hbm_bandwidth_gbs: 1555.0,
        fp16_tflops: 312.0,
        clock_ghz: 1.41,
        measured_bw_gbs: 1382.0,
        wddm_tdr: false,
        note: "A100 40GB",
    },
    BuiltinRow {
        name: "l4",
        sm_arch: 89,
        num_sms: 58,
        smem_bytes_per_sm: 102400,
        smem_bytes_per_block_optin: 101376,
        max_threads_per_sm: 1536,
        l2_bytes: 48 * MIB,
        hbm_bytes: 24 * GIB,
        hbm_bandwidth_gbs: 300.0,
        fp16_tflops: 242.0,
        clock_ghz: 2.04,
        measured_bw_gbs: 0.0,
        wddm_tdr: false,
        note: "L4",
    },
    BuiltinRow {
        name: "t4",
        sm_arch: 75,
        num_sms: 40,
        smem_bytes_per_sm: 65536,
        smem_bytes_per_block_optin: 65536,
        max_threads_per_sm: 1024,
        l2_bytes: 4 * MIB,
        hbm_bytes: 16 * GIB,
        hbm_bandwidth_gbs: 320.0,
        fp16_tflops: 65.0,
        clock_ghz: 1.59,
        measured_bw_gbs: 0.0,
        wddm_tdr: false,
        note: "T4",
    },
    BuiltinRow {
        name: "a10g",
        sm_arch: 86,
        num_sms: 80,
        smem_bytes_per_sm: 102400,
        smem_bytes_per_block_optin: 101376,
        max_threads_per_sm: 1536,
        l2_bytes: 6 * MIB,
        hbm_bytes: 24 * GIB,
        hbm_bandwidth_gbs: 600.0,
        fp16_tflops: 125.0,
        clock_ghz: 1.71,
        measured_bw_gbs: 0.0,
        wddm_tdr: false,
        note: "A10G",
    },
    BuiltinRow {
        name: "l40s",
        sm_arch: 89,
        num_sms: 142,
        smem_bytes_per_sm: 102400,
        smem_bytes_per_block_optin: 101376,
        max_threads_per_sm: 1536,
        l2_bytes: 96 * MIB,
        hbm_bytes: 48 * GIB,
        hbm_bandwidth_gbs: 864.0,
        fp16_tflops: 362.0,
        clock_ghz: 2.52,
        measured_bw_gbs: 0.0,
        wddm_tdr: false,
        note: "L40S",
    },
];

/// A GPU described as data.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTarget {
    /// Short name (`h100`).
    pub name: String,
    /// Compute capability as an integer (`90`).
    pub sm_arch: i64,
    /// Number of SMs.
    pub num_sms: i64,
    /// Shared memory per SM.
    pub smem_bytes_per_sm: i64,
    /// Shared memory a block may opt into.
    pub smem_bytes_per_block_optin: i64,
    /// Registers per SM.
    pub regs_per_sm: i64,
    /// Resident threads per SM.
    pub max_threads_per_sm: i64,
    /// Registers per thread.
    pub max_regs_per_thread: i64,
    /// L2 size.
    pub l2_bytes: i64,
    /// HBM size.
    pub hbm_bytes: i64,
    /// Spec HBM bandwidth, GB/s.
    pub hbm_bandwidth_gbs: f64,
    /// Dense fp16 tensor TFLOP/s.
    pub fp16_tflops: f64,
    /// Boost clock, GHz.
    pub clock_ghz: f64,
    /// Whether cooperative launch is supported.
    pub supports_cooperative: bool,
    /// Whether a display watchdog limits kernel time.
    pub wddm_tdr: bool,
    /// Measured read bandwidth, GB/s (0 = not measured).
    pub measured_bw_gbs: f64,
    /// Free text.
    pub note: String,
}

impl GpuTarget {
    /// The built-in targets, in the reference's order.
    pub fn builtin() -> Vec<GpuTarget> {
        (BUILTIN.iter())
            .map(|r| GpuTarget {
                name: r.name.to_string(),
                sm_arch: r.sm_arch,
                num_sms: r.num_sms,
                smem_bytes_per_sm: r.smem_bytes_per_sm,
                smem_bytes_per_block_optin: r.smem_bytes_per_block_optin,
                regs_per_sm: 65536,
                max_threads_per_sm: r.max_threads_per_sm,
                max_regs_per_thread: 255,
                l2_bytes: r.l2_bytes,
                hbm_bytes: r.hbm_bytes,
                hbm_bandwidth_gbs: r.hbm_bandwidth_gbs,
                fp16_tflops: r.fp16_tflops,
                clock_ghz: r.clock_ghz,
                supports_cooperative: true,
                wddm_tdr: r.wddm_tdr,
                measured_bw_gbs: r.measured_bw_gbs,
                note: r.note.to_string(),
            })
            .collect()
    }

    /// A built-in target by name.
    pub fn by_name(name: &str) -> Option<GpuTarget> {
        Self::builtin().into_iter().find(|t| t.name == name)
    }
}
