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
        const MIB: i64 = 1 << 20;
        const GIB: i64 = 1 << 30;
        #[allow(clippy::type_complexity)]
        let rows: [(
            &str,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            f64,
            f64,
            f64,
            f64,
            bool,
            &str,
        ); 8] = [
            (
                "rtx5090",
                120,
                82,
                102400,
                101376,
                2048,
                64 * MIB,
                24 * GIB,
                896.0,
                210.0,
                1.597,
                731.0,
                true,
                "RTX 5090 laptop (GB203)",
            ),
            (
                "b200",
                100,
                148,
                233472,
                232448,
                2048,
                50 * MIB,
                192 * GIB,
                8000.0,
                2250.0,
                1.86,
                0.0,
                false,
                "B200, spec figures",
            ),
            (
                "h100",
                90,
                132,
                233472,
                232448,
                2048,
                50 * MIB,
                80 * GIB,
                3350.0,
                989.0,
                1.98,
                3089.0,
                false,
                "H100 SXM5",
            ),
            (
                "a100",
                80,
                108,
                167936,
                166912,
                2048,
                40 * MIB,
                40 * GIB,
                1555.0,
                312.0,
                1.41,
                1382.0,
                false,
                "A100 40GB",
            ),
            (
                "l4",
                89,
                58,
                102400,
                101376,
                1536,
                48 * MIB,
                24 * GIB,
                300.0,
                242.0,
                2.04,
                0.0,
                false,
                "L4",
            ),
            (
                "t4",
                75,
                40,
                65536,
                65536,
                1024,
                4 * MIB,
                16 * GIB,
                320.0,
                65.0,
                1.59,
                0.0,
                false,
                "T4",
            ),
            (
                "a10g",
                86,
                80,
                102400,
                101376,
                1536,
                6 * MIB,
                24 * GIB,
                600.0,
                125.0,
                1.71,
                0.0,
                false,
                "A10G",
            ),
            (
                "l40s",
                89,
                142,
                102400,
                101376,
                1536,
                96 * MIB,
                48 * GIB,
                864.0,
                362.0,
                2.52,
                0.0,
                false,
                "L40S",
            ),
        ];
        rows.iter()
            .map(|r| GpuTarget {
                name: r.0.to_string(),
                sm_arch: r.1,
                num_sms: r.2,
                smem_bytes_per_sm: r.3,
                smem_bytes_per_block_optin: r.4,
                regs_per_sm: 65536,
                max_threads_per_sm: r.5,
                max_regs_per_thread: 255,
                l2_bytes: r.6,
                hbm_bytes: r.7,
                hbm_bandwidth_gbs: r.8,
                fp16_tflops: r.9,
                clock_ghz: r.10,
                supports_cooperative: true,
                wddm_tdr: r.12,
                measured_bw_gbs: r.11,
                note: r.13.to_string(),
            })
            .collect()
    }

    /// A built-in target by name.
    pub fn by_name(name: &str) -> Option<GpuTarget> {
        Self::builtin().into_iter().find(|t| t.name == name)
    }
}
