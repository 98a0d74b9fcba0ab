//! What a slot of logits comes down to for the decode loop's tail, how summaries merge, and
//! the four I32 words a summary is stored as.

/// Rows of the stats output (words a summary).
pub const ROWS: u64 = 4;
/// Row of the largest valid logit's f32 bits (`−∞` when no id is valid).
pub const ROW_MAX: usize = 0;
/// Row of the first id holding it (`−1` when no id is valid).
pub const ROW_FIRST: usize = 1;
/// Row of the f32 bits of the sum of `exp(l − max)` over the valid ids.
pub const ROW_SUM: usize = 2;
/// Row of the count of valid ids.
pub const ROW_COUNT: usize = 3;

/// The greedy choice and the softmax's denominator of a run of logits: everything NEXT_TOKEN's
/// greedy path and log-probability need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The first id holding the largest valid (not NaN) logit; `None` when no id is valid.
    pub first: Option<usize>,
    /// That logit (`−∞` when no id is valid).
    pub max: f32,
    /// The valid ids.
    pub count: u64,
    /// `Σ exp(l − max)` over the valid ids when `max` is finite, else 0.
    pub sum_exp: f64,
}

impl Summary {
    /// The summary of no id.
    pub const EMPTY: Summary = Summary {
        first: None,
        max: f32::NEG_INFINITY,
        count: 0,
        sum_exp: 0.0,
    };

    /// The summary of `logits`, whose element 0 is id `offset`: ids in increasing order, the
    /// first of equal maxima kept, the sum in f64.
    pub fn of(logits: &[f32], offset: usize) -> Summary {
        let mut s = Summary::EMPTY;
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() {
                continue;
            }
            s.count += 1;
            if s.first.is_none() || l > s.max {
                s.first = Some(offset + i);
                s.max = l;
            }
        }
        if s.first.is_some() && s.max.is_finite() {
            let m = s.max as f64;
            s.sum_exp = logits
                .iter()
                .filter(|l| !l.is_nan())
                .map(|&l| (l as f64 - m).exp())
                .sum();
        }
        s
    }

    /// The summary of disjoint runs from theirs: the larger maximum wins, equal maxima the
    /// lower id; the counts add; each run's sum rescaled to the winner's maximum, in f64, in
    /// the order given.
    pub fn merge(parts: &[Summary]) -> Summary {
        let mut s = Summary::EMPTY;
        for p in parts {
            s.count += p.count;
            let Some(i) = p.first else { continue };
            let better = match s.first {
                None => true,
                Some(b) => p.max > s.max || (p.max == s.max && i < b),
            };
            if better {
                s.first = Some(i);
                s.max = p.max;
            }
        }
        if s.first.is_some() && s.max.is_finite() {
            let m = s.max as f64;
            s.sum_exp = parts
                .iter()
                .filter(|p| p.first.is_some() && p.max.is_finite())
                .map(|p| p.sum_exp * (p.max as f64 - m).exp())
                .sum();
        }
        s
    }

    /// The four words stored in a stats column (rows [`ROW_MAX`] …): the sum rounded to f32.
    pub fn to_words(&self) -> [i32; 4] {
        let mut w = [0i32; 4];
        w[ROW_MAX] = self.max.to_bits() as i32;
        w[ROW_FIRST] = self.first.map_or(-1, |i| i as i32);
        w[ROW_SUM] = (self.sum_exp as f32).to_bits() as i32;
        w[ROW_COUNT] = self.count as i32;
        w
    }

    /// A summary read back from its words (a negative first id: none).
    pub fn from_words(w: [i32; 4]) -> Summary {
        Summary {
            first: usize::try_from(w[ROW_FIRST]).ok(),
            max: f32::from_bits(w[ROW_MAX] as u32),
            count: u64::try_from(w[ROW_COUNT]).unwrap_or(0),
            sum_exp: f32::from_bits(w[ROW_SUM] as u32) as f64,
        }
    }
}
