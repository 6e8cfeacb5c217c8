//! The span of time a profile or packet covers: aligned bins of one width, and their union, refused when the
//! bins would not line up or the union would hold more than [`MAX_BINS`] bins.

use canopy_wire::utilization::MAX_BINS;

/// `bins` bins of `bin_us` from `start_unix_ns`; never empty (a profile without bins has no window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_unix_ns: u64,
    pub bin_us: u32,
    pub bins: usize,
}

/// Why a window cannot join another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    BinWidth {
        got: u32,
        want: u32,
    },
    Unaligned {
        start: u64,
        bin_us: u32,
        packet_start: u64,
    },
    TooWide {
        bins: u128,
    },
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::BinWidth { got, want } => {
                write!(f, "bin_us {got} differs from the packet's bin_us {want}")
            }
            Misfit::Unaligned {
                start,
                bin_us,
                packet_start,
            } => write!(
                f,
                "start_unix_ns {start} is not a whole number of {bin_us} us bins from the packet's start \
                 {packet_start}"
            ),
            Misfit::TooWide { bins } => write!(
                f,
                "the packet's window would span {bins} bins, more than {MAX_BINS}"
            ),
        }
    }
}

impl Window {
    /// The window of a table, `None` when it has no bins.
    pub fn of(start_unix_ns: u64, bin_us: u32, bins: usize) -> Option<Window> {
        (bins > 0).then_some(Window {
            start_unix_ns,
            bin_us,
            bins,
        })
    }

    fn bin_ns(&self) -> u128 {
        u128::from(self.bin_us) * 1000
    }

    /// Where the last bin ends, in nanoseconds (past `u64` for a window near the end of time).
    fn end(&self) -> u128 {
        u128::from(self.start_unix_ns) + self.bins as u128 * self.bin_ns()
    }

    /// The smallest window holding both, or why `other` does not fit beside `self`.
    pub fn union(&self, other: &Window) -> Result<Window, Misfit> {
        if other.bin_us != self.bin_us {
            return Err(Misfit::BinWidth {
                got: other.bin_us,
                want: self.bin_us,
            });
        }
        let bin_ns = self.bin_ns();
        if !u128::from(self.start_unix_ns.abs_diff(other.start_unix_ns)).is_multiple_of(bin_ns) {
            return Err(Misfit::Unaligned {
                start: other.start_unix_ns,
                bin_us: other.bin_us,
                packet_start: self.start_unix_ns,
            });
        }
        let start = self.start_unix_ns.min(other.start_unix_ns);
        let bins = (self.end().max(other.end()) - u128::from(start)) / bin_ns;
        if bins > MAX_BINS as u128 {
            return Err(Misfit::TooWide { bins });
        }
        Ok(Window {
            start_unix_ns: start,
            bin_us: self.bin_us,
            bins: bins as usize,
        })
    }

    /// `None`, or the union, to fold windows one after another.
    pub fn join(have: Option<Window>, other: Option<Window>) -> Result<Option<Window>, Misfit> {
        match (have, other) {
            (Some(a), Some(b)) => a.union(&b).map(Some),
            (a, b) => Ok(a.or(b)),
        }
    }

    /// The bin of `self` where `inner` (a window inside it, aligned) begins.
    pub fn offset_of(&self, inner: &Window) -> usize {
        ((inner.start_unix_ns - self.start_unix_ns) as u128 / self.bin_ns()) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn w(start_ms: u64, bins: usize) -> Window {
        Window::of(start_ms * MS, 1000, bins).unwrap()
    }

    #[test]
    fn union_spans_both_and_gaps_between() {
        let u = w(10, 3).union(&w(20, 2)).unwrap();
        assert_eq!(u, w(10, 12));
        assert_eq!(w(20, 2).union(&w(10, 3)).unwrap(), u);
        assert_eq!(u.offset_of(&w(20, 2)), 10);
        assert_eq!(Window::join(None, Some(u)).unwrap(), Some(u));
        assert_eq!(Window::join(Some(u), None).unwrap(), Some(u));
        assert_eq!(Window::of(5, 1000, 0), None);
    }

    #[test]
    fn misfits_say_which() {
        let wide = Window::of(0, 2000, 1).unwrap();
        assert_eq!(
            w(0, 1).union(&wide).unwrap_err().to_string(),
            "bin_us 2000 differs from the packet's bin_us 1000"
        );
        let off = Window::of(MS / 2, 1000, 1).unwrap();
        assert_eq!(
            w(0, 1).union(&off).unwrap_err().to_string(),
            "start_unix_ns 500000 is not a whole number of 1000 us bins from the packet's start 0"
        );
        assert_eq!(
            w(0, 1).union(&w(MAX_BINS as u64, 1)).unwrap_err().to_string(),
            "the packet's window would span 32769 bins, more than 32768"
        );
        assert_eq!(w(0, 1).union(&w(MAX_BINS as u64 - 1, 1)).unwrap().bins, MAX_BINS);
        // Near the end of time the arithmetic does not wrap.
        let late = Window::of(u64::MAX - u64::MAX % MS, 1000, 3).unwrap();
        assert_eq!(late.union(&late).unwrap(), late);
    }
}
