//! Utilization profiles (seed 000): the share of each bin of wall time a rank spends in each activity.
//! [`Replay`] turns a rank's activity switches into one period's profile; [`Bins`] accumulates time per bin and
//! activity and compresses a period into the sparse [`Utilization`] a rank ships; [`check`] is what every reader
//! of one runs before trusting its indices.

use std::collections::HashMap;

use crate::v1::Utilization;

/// The width of a bin unless configured otherwise, in microseconds.
pub const BIN_US: u32 = 1000;
/// A share of the whole bin.
pub const FULL: u32 = 250;
/// The activity id of the record that folds the activities below the threshold together.
pub const OTHER: u64 = 0;
/// The most bins one profile (or one merged packet) may hold: seed 000's circular buffer, 2^15 bins.
pub const MAX_BINS: usize = 1 << 15;
/// Records below this share of their bin are folded into "other" unless configured otherwise (10%).
pub const DEFAULT_THRESHOLD: u32 = FULL / 10;

/// A share of a bin (0 to [`FULL`]) from a time, rounded to the nearest.
pub fn share_of(ns: u64, bin_ns: u64) -> u32 {
    if bin_ns == 0 {
        return 0;
    }
    let num = u128::from(ns) * u128::from(FULL) * 2 + u128::from(bin_ns);
    ((num / (u128::from(bin_ns) * 2)) as u32).min(FULL)
}

/// Time per bin and activity over one period, kept between periods so its memory is reused.
#[derive(Debug, Default, Clone)]
pub struct Bins {
    start_unix_ns: u64,
    bin_ns: u64,
    /// Per bin, (activity id, nanoseconds); a handful per bin, so a scan beats a map.
    bins: Vec<Vec<(u64, u64)>>,
    used: usize,
    /// Compression's scratch: (bin, activity id, share) and the ids in use.
    records: Vec<(u32, u64, u32)>,
    ids: Vec<u64>,
}

impl Bins {
    /// Empties the bins for a new period of `bins` bins of `bin_ns` from `start_unix_ns` (at most
    /// [`MAX_BINS`]).
    pub fn reset(&mut self, start_unix_ns: u64, bin_ns: u64, bins: usize) {
        let bins = bins.min(MAX_BINS);
        for b in &mut self.bins[..self.used] {
            b.clear();
        }
        if self.bins.len() < bins {
            self.bins.resize_with(bins, Vec::new);
        }
        self.used = bins;
        self.start_unix_ns = start_unix_ns;
        self.bin_ns = bin_ns.max(1);
    }

    /// When the period begins and ends, in nanoseconds since the Unix epoch.
    pub fn window(&self) -> (u64, u64) {
        let end = self.start_unix_ns + self.bin_ns * self.used as u64;
        (self.start_unix_ns, end)
    }

    /// Credits the time from `from` to `to` (Unix nanoseconds) to `activity`; what falls outside the period is
    /// left out.
    pub fn add(&mut self, from: u64, to: u64, activity: u64) {
        let (start, end) = self.window();
        let (from, to) = (from.max(start), to.min(end));
        if from >= to {
            return;
        }
        let mut t = from;
        let mut bin = ((t - start) / self.bin_ns) as usize;
        while t < to && bin < self.used {
            let bin_end = start + (bin as u64 + 1) * self.bin_ns;
            let upto = bin_end.min(to);
            let cell = &mut self.bins[bin];
            match cell.iter_mut().find(|(id, _)| *id == activity) {
                Some((_, ns)) => *ns += upto - t,
                None => cell.push((activity, upto - t)),
            }
            t = upto;
            bin += 1;
        }
    }

    /// The period as a sparse profile: each bin's shares, divided among `threads` threads, with records below
    /// `threshold` (0 to [`FULL`]) folded into one [`OTHER`] record. `lost` is carried as is.
    pub fn compress(&mut self, threads: u32, threshold: u32, lost: u64, out: &mut Utilization) {
        let bin_ns = self.bin_ns * u64::from(threads.max(1));
        self.records.clear();
        self.ids.clear();
        for (bin, cell) in self.bins[..self.used].iter_mut().enumerate() {
            cell.sort_unstable_by_key(|(id, _)| *id);
            let mut other_ns = 0;
            for &(id, ns) in cell.iter() {
                let share = share_of(ns, bin_ns);
                if id == OTHER || share < threshold {
                    other_ns += ns;
                } else {
                    self.records.push((bin as u32, id, share));
                }
            }
            let other = share_of(other_ns, bin_ns);
            if other > 0 {
                // OTHER sorts first in the bin: the records of one bin stay in increasing id order.
                let first = self.records.partition_point(|(b, _, _)| *b < bin as u32);
                self.records.insert(first, (bin as u32, OTHER, other));
            }
        }
        self.ids.extend(self.records.iter().map(|(_, id, _)| *id));
        self.ids.sort_unstable();
        self.ids.dedup();
        out.start_unix_ns = self.start_unix_ns;
        out.bin_us = (self.bin_ns / 1000) as u32;
        out.threads = threads.max(1);
        out.lost = lost;
        out.activities.clear();
        out.activities.extend_from_slice(&self.ids);
        out.counts.clear();
        out.counts.resize(self.used, 0);
        out.activity.clear();
        out.share.clear();
        for &(bin, id, share) in &self.records {
            out.counts[bin as usize] += 1;
            out.activity.push(self.ids.partition_point(|x| *x < id) as u32);
            out.share.push(share);
        }
    }
}

/// One activity switch of one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    /// The thread, by any number that tells the rank's threads apart.
    pub thread: u32,
    /// When, in nanoseconds since the Unix epoch; a thread's switches come in time order.
    pub at_unix_ns: u64,
    /// An activity begins (true) or ends (false). Idle is the activity "Idle".
    pub begin: bool,
    /// The activity's event id.
    pub activity: u64,
}

/// A thread as the replay left it: its running activities, innermost last, and the time credited so far.
#[derive(Debug, Default)]
struct Stack {
    running: Vec<u64>,
    credited: u64,
}

/// Replays a rank's activity switches period after period: each stretch of a thread's time goes to the activity
/// running innermost on it. What a period leaves running goes on into the next, and switches after a period's
/// end wait for it.
#[derive(Debug, Default)]
pub struct Replay {
    bins: Bins,
    threads: HashMap<u32, Stack>,
    pending: Vec<Switch>,
}

impl Replay {
    /// Forgets every thread's running activities and the switches waiting (the measurement was off).
    pub fn clear(&mut self) {
        self.threads.clear();
        self.pending.clear();
    }

    /// The profile of the period from `from` to `to` (Unix ns) in bins of `bin_ns`: the switches waiting from
    /// before, then `switches` (taken), each thread's in time order. A bin's shares are divided among the threads
    /// that ran an activity in the period; records below `threshold` fold into "other"; `lost` is carried.
    #[allow(clippy::too_many_arguments)]
    pub fn period(
        &mut self,
        from: u64,
        to: u64,
        bin_ns: u64,
        switches: &mut Vec<Switch>,
        threshold: u32,
        lost: u64,
        out: &mut Utilization,
    ) {
        let bins = to.saturating_sub(from).div_ceil(bin_ns.max(1)) as usize;
        self.bins.reset(from, bin_ns, bins);
        let mut all = std::mem::take(&mut self.pending);
        all.append(switches);
        // Each thread's switches together, in the order they came.
        all.sort_by_key(|s| s.thread);
        let mut active = 0u32;
        let mut at = 0;
        while at < all.len() {
            let thread = all[at].thread;
            let run = all[at..].iter().take_while(|s| s.thread == thread).count();
            let mut st = self.threads.remove(&thread).unwrap_or_default();
            let mut busy = !st.running.is_empty();
            for &s in &all[at..at + run] {
                if s.at_unix_ns >= to {
                    self.pending.push(s);
                    continue;
                }
                busy = true;
                self.credit(&mut st, s.at_unix_ns);
                if s.begin {
                    st.running.push(s.activity);
                } else if st.running.last() == Some(&s.activity) {
                    // An end that is not of the activity begun last is ignored, as the profile module does.
                    st.running.pop();
                }
            }
            self.credit(&mut st, to);
            active += u32::from(busy);
            self.threads.insert(thread, st);
            at += run;
        }
        // Threads with no switch this period: their innermost activity ran on all along.
        for st in self.threads.values_mut() {
            if st.credited < to && !st.running.is_empty() {
                if let Some(&top) = st.running.last() {
                    self.bins.add(st.credited, to, top);
                }
                st.credited = to;
                active += 1;
            }
        }
        // Threads that ended with nothing running are not remembered.
        self.threads.retain(|_, st| !st.running.is_empty());
        // The switches' buffer goes back to the caller, empty, for the next period.
        all.clear();
        *switches = all;
        self.bins.compress(active.max(1), threshold, lost, out);
    }

    fn credit(&mut self, st: &mut Stack, t: u64) {
        if let Some(&top) = st.running.last()
            && t > st.credited
        {
            self.bins.add(st.credited, t, top);
        }
        st.credited = st.credited.max(t);
    }
}

/// Why a utilization profile (or packet) cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UtilizationError {
    BinWidth,
    TooManyBins(usize),
    Unsorted,
    Records {
        counted: u64,
        activities: usize,
        shares: usize,
    },
    Index {
        record: usize,
        index: u32,
        activities: usize,
    },
    Order {
        bin: usize,
    },
    Share {
        record: usize,
        share: u32,
    },
}

impl std::fmt::Display for UtilizationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UtilizationError::BinWidth => write!(f, "bin_us is 0"),
            UtilizationError::TooManyBins(n) => write!(f, "{n} bins, more than {MAX_BINS}"),
            UtilizationError::Unsorted => write!(f, "activities are not sorted and distinct"),
            UtilizationError::Records {
                counted,
                activities,
                shares,
            } => write!(
                f,
                "the bins count {counted} records but there are {activities} activity indices and {shares} shares"
            ),
            UtilizationError::Index {
                record,
                index,
                activities,
            } => write!(f, "record {record} names activity {index} of {activities}"),
            UtilizationError::Order { bin } => {
                write!(f, "bin {bin}: records are not in increasing activity order")
            }
            UtilizationError::Share { record, share } => {
                write!(f, "record {record}: share {share} is above {FULL}")
            }
        }
    }
}

impl std::error::Error for UtilizationError {}

/// The shape every sparse table of bins must have: `counts` one per bin (at most [`MAX_BINS`]), as many
/// records as they count, indices into sorted distinct `activities`, increasing within a bin, and `shares`
/// values beside them.
pub fn check_table(
    bin_us: u32,
    activities: &[u64],
    counts: &[u32],
    activity: &[u32],
    shares: usize,
) -> Result<(), UtilizationError> {
    if bin_us == 0 {
        return Err(UtilizationError::BinWidth);
    }
    if counts.len() > MAX_BINS {
        return Err(UtilizationError::TooManyBins(counts.len()));
    }
    if activities.windows(2).any(|w| w[0] >= w[1]) {
        return Err(UtilizationError::Unsorted);
    }
    let counted: u64 = counts.iter().map(|&c| u64::from(c)).sum();
    if counted != activity.len() as u64 || shares != activity.len() {
        return Err(UtilizationError::Records {
            counted,
            activities: activity.len(),
            shares,
        });
    }
    let mut at = 0;
    for (bin, &c) in counts.iter().enumerate() {
        let records = &activity[at..at + c as usize];
        for (k, &index) in records.iter().enumerate() {
            if index as usize >= activities.len() {
                return Err(UtilizationError::Index {
                    record: at + k,
                    index,
                    activities: activities.len(),
                });
            }
        }
        if records.windows(2).any(|w| w[0] >= w[1]) {
            return Err(UtilizationError::Order { bin });
        }
        at += c as usize;
    }
    Ok(())
}

/// Checks a rank's profile: [`check_table`], and every share at most [`FULL`].
pub fn check(u: &Utilization) -> Result<(), UtilizationError> {
    check_table(u.bin_us, &u.activities, &u.counts, &u.activity, u.share.len())?;
    if let Some((record, &share)) = u.share.iter().enumerate().find(|(_, s)| **s > FULL) {
        return Err(UtilizationError::Share { record, share });
    }
    Ok(())
}

/// The records of a checked profile, bin by bin: (bin, activity id, share).
pub fn records(u: &Utilization) -> impl Iterator<Item = (usize, u64, u32)> + '_ {
    u.counts
        .iter()
        .enumerate()
        .flat_map(|(bin, &c)| std::iter::repeat_n(bin, c as usize))
        .zip(u.activity.iter().zip(&u.share))
        .map(|(bin, (&index, &share))| (bin, u.activities[index as usize], share))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_is_split_across_bins_and_small_shares_fold_into_other() {
        let mut b = Bins::default();
        // Four bins of 1 ms from t = 1 s.
        let t0 = 1_000_000_000;
        b.reset(t0, 1_000_000, 4);
        // Activity 7: 1.5 ms from the start; activity 9: the rest of bin 1; activity 3: 50 us of bin 3 (5%).
        b.add(t0 - 500_000, t0 + 1_500_000, 7);
        b.add(t0 + 1_500_000, t0 + 2_000_000, 9);
        b.add(t0 + 3_000_000, t0 + 3_050_000, 3);
        b.add(t0 + 3_050_000, t0 + 9_000_000, 7);
        let mut u = Utilization::default();
        b.compress(1, DEFAULT_THRESHOLD, 2, &mut u);
        check(&u).unwrap();
        let got: Vec<_> = records(&u).collect();
        assert_eq!(
            got,
            vec![(0, 7, 250), (1, 7, 125), (1, 9, 125), (3, OTHER, 13), (3, 7, 238)]
        );
        assert_eq!(u.activities, vec![OTHER, 7, 9]);
        assert_eq!((u.counts.len(), u.lost, u.bin_us, u.threads), (4, 2, 1000, 1));
        // Reused for the next period: nothing of the last one is left.
        b.reset(t0 + 4_000_000, 1_000_000, 2);
        b.compress(2, DEFAULT_THRESHOLD, 0, &mut u);
        assert_eq!((u.counts, u.activity.len(), u.threads), (vec![0, 0], 0, 2));
    }

    #[test]
    fn a_replay_gives_the_innermost_activity_the_time_and_carries_what_runs_on() {
        let ms = 1_000_000;
        let sw = |t: f64, begin, activity| Switch {
            thread: 9,
            at_unix_ns: (t * ms as f64) as u64,
            begin,
            activity,
        };
        // Outer (1) from 0 to 3 ms, inner (2) from 1 to 1.5 ms, idle (3) from 3 ms to 6 ms.
        let mut switches = vec![
            sw(0.0, true, 1),
            sw(1.0, true, 2),
            sw(1.5, false, 2),
            sw(3.0, false, 1),
            sw(3.0, true, 3),
            sw(6.0, false, 3),
        ];
        let mut r = Replay::default();
        let mut u = Utilization::default();
        r.period(0, 4 * ms, ms, &mut switches, 0, 0, &mut u);
        check(&u).unwrap();
        let got: Vec<_> = records(&u).collect();
        assert_eq!(
            got,
            vec![(0, 1, 250), (1, 1, 125), (1, 2, 125), (2, 1, 250), (3, 3, 250)]
        );
        assert!(switches.is_empty());
        // The next period: idle until 6 ms, then nothing; a thread with nothing running is forgotten.
        r.period(4 * ms, 8 * ms, ms, &mut switches, 0, 0, &mut u);
        assert_eq!(records(&u).collect::<Vec<_>>(), vec![(0, 3, 250), (1, 3, 250)]);
        assert!(r.threads.is_empty());
        // Two threads, one busy all along: each bin is half that activity.
        let mut switches = vec![Switch {
            thread: 1,
            at_unix_ns: 8 * ms,
            begin: true,
            activity: 5,
        }];
        r.period(8 * ms, 9 * ms, ms, &mut switches, 0, 0, &mut u);
        let mut switches = vec![Switch {
            thread: 2,
            at_unix_ns: 9 * ms,
            begin: true,
            activity: 5,
        }];
        r.period(9 * ms, 10 * ms, ms, &mut switches, 0, 0, &mut u);
        assert_eq!(records(&u).collect::<Vec<_>>(), vec![(0, 5, 250)]);
        assert_eq!(u.threads, 2);
    }

    #[test]
    fn shares_divide_among_threads_and_never_pass_the_whole_bin() {
        assert_eq!(share_of(500_000, 1_000_000), 125);
        assert_eq!(share_of(2_000_000, 1_000_000), FULL);
        assert_eq!(share_of(1_999, 1_000_000), 0);
        assert_eq!(share_of(2_000, 1_000_000), 1);
        let mut b = Bins::default();
        b.reset(0, 1_000_000, 1);
        b.add(0, 1_000_000, 5);
        let mut u = Utilization::default();
        b.compress(4, 0, 0, &mut u);
        assert_eq!(u.share, vec![63]);
    }

    #[test]
    fn a_bad_table_is_named() {
        let good = Utilization {
            bin_us: 1000,
            activities: vec![1, 5],
            counts: vec![2, 0],
            activity: vec![0, 1],
            share: vec![100, 100],
            ..Default::default()
        };
        check(&good).unwrap();
        let bad = |f: fn(&mut Utilization)| {
            let mut u = good.clone();
            f(&mut u);
            check(&u).unwrap_err().to_string()
        };
        assert_eq!(
            bad(|u| u.activity = vec![1, 0]),
            "bin 0: records are not in increasing activity order"
        );
        assert_eq!(bad(|u| u.activity[1] = 2), "record 1 names activity 2 of 2");
        assert_eq!(bad(|u| u.share[0] = 251), "record 0: share 251 is above 250");
        assert_eq!(
            bad(|u| u.counts[1] = 9),
            "the bins count 11 records but there are 2 activity indices and 2 shares"
        );
        assert_eq!(
            bad(|u| u.activities = vec![5, 1]),
            "activities are not sorted and distinct"
        );
        assert_eq!(
            bad(|u| u.counts = vec![0; MAX_BINS + 1]),
            "32769 bins, more than 32768"
        );
        assert_eq!(bad(|u| u.bin_us = 0), "bin_us is 0");
    }
}
