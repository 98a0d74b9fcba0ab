//! Opcode `RMSNORM` (code 3): RMS normalisation: x * rsqrt(mean(x^2) + eps) * w.
//!
//! This crate owns everything about the op: its spec (arity, params), its static shape rule
//! for the validator, its CPU reference (`reference.rs`) and its CUDA device function
//! (`rmsnorm.cu`).

use amk_core::opcheck::{self, Checker};
use amk_core::{
    Finding, OpRegistration, OpSpec, Opcode, ParamDecl, ParamType, Reference, TaskContext,
};
use std::borrow::Cow;

pub mod reference;

/// The op's spec, as the registry and the validator see it.
pub const SPEC: OpSpec = OpSpec {
    code: Opcode::RMSNORM,
    name: Cow::Borrowed("RMSNORM"),
    min_inputs: 2,
    max_inputs: Some(2),
    n_outputs: Some(1),
    params: Cow::Borrowed(&[
        ParamDecl::required("eps", ParamType::Real),
        ParamDecl::required("hidden", ParamType::Int),
        ParamDecl::optional("m_off", ParamType::Int),
        ParamDecl::optional("M_tile", ParamType::Int),
        ParamDecl::optional("n_off", ParamType::Int),
        ParamDecl::optional("N_tile", ParamType::Int),
    ]),
    write_region: amk_core::WriteRegion::ColumnsAndRows,
    check: Some(check),
    summary: Cow::Borrowed("RMS normalisation: x * rsqrt(mean(x^2) + eps) * w."),
};

amk_core::inventory::submit! {
    OpRegistration {
        spec: SPEC,
        reference: Some(Reference { run: reference::run, in_place: &[] }),
        cuda: Some(amk_core::CudaSource::builtin(include_str!("rmsnorm.cu"), "amk_op_rmsnorm")),
    }
}

/// Static shape and parameter rule, run by the validator.
fn check(ctx: &TaskContext<'_>) -> Vec<Finding> {
    let mut c = Checker::new(ctx);
    opcheck::norm(&mut c);
    check_rows(&mut c);
    c.finish()
}

/// The row tile's params, in [`RowTile::from_params`]' order.
pub const ROW_TILE_KEYS: [&str; 4] = ["m_off", "M_tile", "n_off", "N_tile"];

/// The row tile's params as a spec declares them (optional ints), for ops whose only params
/// they are (TOKEN_NLL).
pub const ROW_TILE_PARAMS: [ParamDecl; 4] = [
    ParamDecl::optional(ROW_TILE_KEYS[0], ParamType::Int),
    ParamDecl::optional(ROW_TILE_KEYS[1], ParamType::Int),
    ParamDecl::optional(ROW_TILE_KEYS[2], ParamType::Int),
    ParamDecl::optional(ROW_TILE_KEYS[3], ParamType::Int),
];

/// A task's rows: all of them, or with the tile params rows `[m_off, m_off + M_tile)` of `x`
/// viewed as rows of `hidden` (so tasks of one output can split its rows between them; the
/// validator sees their write regions through `n_off` = 0 and `N_tile` = `hidden`, which
/// must come with them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowTile {
    /// The first row.
    pub m_off: i64,
    /// How many rows.
    pub m_tile: i64,
}

impl RowTile {
    /// The tile the four params name; `Ok(None)` when none is given, `Err` (why) when only
    /// some are, or when the columns are not the whole row of `hidden`.
    pub fn from_params(
        [m_off, m_tile, n_off, n_tile]: [Option<i64>; 4],
        hidden: i64,
    ) -> Result<Option<RowTile>, String> {
        match (m_off, m_tile, n_off, n_tile) {
            (None, None, None, None) => Ok(None),
            (Some(m_off), Some(m_tile), Some(0), Some(n)) if n == hidden => {
                if m_off < 0 || m_tile <= 0 {
                    return Err(format!(
                        "rows [{m_off}, {m_off} + {m_tile}) need m_off >= 0 and M_tile > 0"
                    ));
                }
                Ok(Some(RowTile { m_off, m_tile }))
            }
            _ => Err(format!(
                "row tile params m_off, M_tile, n_off = 0 and N_tile = hidden ({hidden}) come \
                 together or not at all"
            )),
        }
    }

    /// The end row (exclusive).
    pub fn end(self) -> i64 {
        self.m_off.saturating_add(self.m_tile)
    }
}

fn check_rows(c: &mut Checker<'_, '_>) {
    let keys = ROW_TILE_KEYS.map(|k| c.int(k));
    let (Some(x), Some(hidden)) = (c.input(0), c.int("hidden")) else {
        return;
    };
    match RowTile::from_params(keys, hidden) {
        Err(why) => c.oob(why),
        Ok(Some(t)) if hidden > 0 => {
            let rows = x.numel() / hidden as u64;
            if t.end() as u64 > rows {
                c.oob(format!(
                    "rows [{}, {}) exceed the input's {rows} rows of {hidden}",
                    t.m_off,
                    t.end()
                ));
            }
        }
        Ok(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::RowTile;
    use rstest::rstest;

    #[test]
    fn no_tile_params_mean_every_row() {
        assert_eq!(RowTile::from_params([None; 4], 64), Ok(None));
    }

    #[test]
    fn a_whole_tile_names_its_rows() {
        let t = RowTile::from_params([Some(8), Some(8), Some(0), Some(64)], 64);
        assert_eq!(
            t,
            Ok(Some(RowTile {
                m_off: 8,
                m_tile: 8
            }))
        );
        assert_eq!(t.unwrap().unwrap().end(), 16);
    }

    #[rstest]
    #[case::rows_alone([Some(0), Some(8), None, None])]
    #[case::columns_alone([None, None, Some(0), Some(64)])]
    #[case::part_of_the_row([Some(0), Some(8), Some(0), Some(32)])]
    #[case::columns_offset([Some(0), Some(8), Some(32), Some(64)])]
    #[case::no_rows([Some(0), Some(0), Some(0), Some(64)])]
    #[case::negative_start([Some(-1), Some(8), Some(0), Some(64)])]
    fn partial_or_narrow_tiles_are_refused(#[case] keys: [Option<i64>; 4]) {
        assert!(RowTile::from_params(keys, 64).is_err());
    }

    #[test]
    fn a_huge_tile_end_saturates() {
        let t = RowTile::from_params([Some(i64::MAX), Some(8), Some(0), Some(64)], 64);
        assert_eq!(t.unwrap().unwrap().end(), i64::MAX);
    }
}
