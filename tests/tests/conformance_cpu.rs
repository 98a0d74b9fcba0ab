//! The conformance suite (`amk_conformance::conformance`) instantiated for the CPU backend:
//! list order (the oracle itself, checked against the suite's f64 formulas), race hunting
//! (seeded random firing with poisoned transient buffers) and two worker threads.

use amk_backend_cpu::{CpuBackend, CpuOptions, FiringMode};

mod list_order {
    amk_conformance::conformance_tests!(amk_backend_cpu::CpuBackend::default());
}

mod race_hunt {
    amk_conformance::conformance_tests!(super::backend(
        super::FiringMode::RaceHunt { seed: 0x5EED },
        1
    ));
}

mod threads2 {
    amk_conformance::conformance_tests!(super::backend(super::FiringMode::ListOrder, 2));
}

mod race_hunt_threads2 {
    amk_conformance::conformance_tests!(super::backend(
        super::FiringMode::RaceHunt { seed: 17 },
        2
    ));
}

fn backend(mode: FiringMode, threads: usize) -> CpuBackend {
    CpuBackend::new(CpuOptions { mode, threads })
}

/// `run_all` reports every case (the form a CLI or a bench would use).
#[test]
fn run_all_reports_every_case() -> Result<(), amk_conformance::conformance::Failure> {
    let mut report = amk_conformance::conformance::Report::default();
    amk_conformance::conformance::run_all(
        &backend(FiringMode::RaceHunt { seed: 99 }, 1),
        &mut report,
    );
    assert_eq!(report.backend, "cpu");
    assert_eq!(
        report.passed.len() + report.failed.len(),
        amk_conformance::conformance::CASES.len()
    );
    report.into_result()
}
