//! Stop strings over streamed text. A stop string may span tokens, so text that could be the
//! start of one is held back until the next piece says whether it is; text is never sent and
//! then taken back.

/// The text of one generation, piece by piece, cut at the first stop string.
#[derive(Debug, Clone, Default)]
pub struct StopText {
    stops: Vec<String>,
    /// Text received and not yet released: a possible start of a stop string.
    held: String,
    stopped: bool,
}

/// What one piece of text released.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Released {
    /// Text that is certainly part of the output.
    pub text: String,
    /// Whether a stop string was completed (the text ends before it; generation should end).
    pub stopped: bool,
}

impl StopText {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopText {
        StopText {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Takes the next piece of text; releases what can no longer be part of a stop string.
    /// After a stop string nothing more is released.
    pub fn push(&mut self, piece: &str) -> Released {
        if self.stopped {
            return Released {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(piece);
        let first = (self.stops.iter())
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            let text = self.held[..at].to_string();
            self.held.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.longest_open_suffix();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Released {
            text,
            stopped: false,
        }
    }

    /// The end of the text: whatever was held back (no stop string followed it).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Bytes at the end of `held` that begin some stop string (a proper prefix of it): the
    /// longest such suffix, on a character boundary.
    fn longest_open_suffix(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for stop in &self.stops {
            let most = (stop.len() - 1).min(h.len());
            for len in (best + 1..=most).rev() {
                let start = h.len() - len;
                if h.is_char_boundary(start) && stop.starts_with(&h[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopText::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[rstest]
    #[case::no_stops(&[], &["a", "b"], "ab", false)]
    #[case::inside_one_piece(&["STOP"], &["abSTOPcd"], "ab", true)]
    #[case::spans_pieces(&["STOP"], &["ab", "ST", "O", "Pcd"], "ab", true)]
    #[case::false_start_released(&["STOP"], &["ab", "ST", "x"], "abSTx", false)]
    #[case::held_at_the_end(&["STOP"], &["ab", "STO"], "abSTO", false)]
    #[case::earliest_of_several(&["yz", "b"], &["axyzb"], "ax", true)]
    #[case::overlapping_prefixes(&["aab"], &["a", "a", "a", "b"], "a", true)]
    #[case::multibyte(&["é!"], &["café", "!"], "caf", true)]
    #[case::newline(&["\n\n"], &["one\n", "\ntwo"], "one", true)]
    #[case::empty_stop_ignored(&[""], &["abc"], "abc", false)]
    fn stop_strings_cut_the_text(
        #[case] stops: &[&str],
        #[case] pieces: &[&str],
        #[case] want: &str,
        #[case] stopped: bool,
    ) {
        assert_eq!(run(stops, pieces), (want.to_string(), stopped));
    }

    #[test]
    fn nothing_that_could_start_a_stop_string_is_released() {
        let stops = vec!["END".to_string()];
        let mut m = StopText::new(&stops);
        assert_eq!(m.push("xE").text, "x");
        assert_eq!(m.push("N").text, "");
        let r = m.push("D tail");
        assert_eq!(r.text, "");
        assert!(r.stopped && m.stopped());
        assert!(m.push("more").stopped);
    }
}
