//! Where fused eager mode cuts a graph that reaches the size limit. A loop that reads nothing
//! for a while (a training loop that logs every N steps) is cut every `limit` ops wherever its
//! iterations are, so its pieces drift along the iteration and none repeats. Here the ops'
//! programs are followed as a stream: once the stream repeats with a period, cuts fall at the
//! same places in every repetition, and each piece is a structure met again and again (fused.rs
//! compiles it once). Pure bookkeeping: which ops run, and their order, never change.
use std::collections::VecDeque;

/// The longest period looked for, in ops (a step of a small model's training loop is a few
/// hundred to a few thousand ops).
pub const MAX_PERIOD: usize = 8192;

/// Where the stream repeats: every `len` ops from op `start`; cuts fall every `unit` ops from
/// `start` (the period, or its largest multiple within the size limit) and, within a unit
/// longer than the limit, every `limit` ops.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Period {
    len: usize,
    start: u64,
    unit: usize,
}

#[derive(Default)]
pub struct Repeats {
    /// The last ops' program ids (at most 2 * MAX_PERIOD) and how many were recorded in all.
    history: VecDeque<u64>,
    count: u64,
    period: Option<Period>,
    /// Where the graph being recorded started in the stream.
    graph_start: u64,
}

impl Repeats {
    /// Forgets the stream (a graph run for another reason than its size: a read, a
    /// synchronization): the next graph starts where a read leaves it, at the same op each
    /// time already.
    pub fn reset(&mut self) {
        *self = Repeats::default();
    }

    /// Notes a new graph's first position in the stream.
    pub fn graph_started(&mut self) {
        self.graph_start = self.count;
    }

    /// Notes a recorded op (its program's id). A repetition that differs ends the period.
    pub fn push(&mut self, id: u64) {
        if let Some(p) = self.period {
            if self.history.len() >= p.len && self.history[self.history.len() - p.len] != id {
                self.period = None;
            }
        }
        if self.history.len() == 2 * MAX_PERIOD {
            self.history.pop_front();
        }
        self.history.push_back(id);
        self.count += 1;
    }

    /// Whether a graph of `len` ops is cut before the next op: at the size `limit`, or at the
    /// next place where the period puts a cut. A cut by size without a period looks for one.
    pub fn cut_before_next(&mut self, len: usize, limit: usize) -> bool {
        if len == 0 {
            return false;
        }
        if let Some(p) = self.period {
            let at = ((self.count - p.start) % p.unit as u64) as usize;
            if at % limit == 0 {
                return true;
            }
        }
        if len < limit {
            return false;
        }
        if self.period.is_none() {
            self.period = find_period(&self.history, limit).map(|len| Period { len, start: self.count, unit: if len > limit { len } else { limit / len * len } });
        }
        true
    }

    /// Where in its unit the graph being cut started, if it started at one of the period's
    /// cuts (a piece that every repetition has): part of the fused program's key.
    pub fn aligned_piece(&self, limit: usize) -> Option<usize> {
        let p = self.period?;
        let at = (self.graph_start.checked_sub(p.start)? % p.unit as u64) as usize;
        (at % limit == 0).then_some(at)
    }
}

/// The shortest period `p` with which the end of `ids` repeats over at least `window` ops
/// (and twice): the last max(p, window) ops equal the ones `p` before them. The window keeps
/// a run of one op inside a longer iteration from passing for the loop's period.
fn find_period(ids: &VecDeque<u64>, window: usize) -> Option<usize> {
    let n = ids.len();
    let last = *ids.back()?;
    let fits = |p: usize| p + p.max(window) <= n;
    (1..=MAX_PERIOD).take_while(|&p| fits(p) || p < window).filter(|&p| fits(p)).find(|&p| {
        ids[n - 1 - p] == last && (0..p.max(window)).all(|i| ids[n - 1 - i] == ids[n - 1 - i - p])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `ids` through a Repeats with size limit `limit`; returns each graph's (start, len).
    fn cuts(ids: &[u64], limit: usize) -> Vec<(u64, usize)> {
        let mut r = Repeats::default();
        let (mut graphs, mut len) = (Vec::new(), 0);
        for &id in ids {
            if r.cut_before_next(len, limit) {
                graphs.push((r.graph_start, len));
                r.graph_started();
                len = 0;
            }
            r.push(id);
            len += 1;
        }
        graphs
    }

    #[test]
    fn finds_the_shortest_period() {
        let ids: VecDeque<u64> = [9, 1, 2, 3, 1, 2, 3, 1, 2, 3].into_iter().collect();
        assert_eq!(find_period(&ids, 1), Some(3));
        assert_eq!(find_period(&ids, 6), Some(3));
        assert_eq!(find_period(&ids, 7), None);
        let ids: VecDeque<u64> = [1, 2, 3, 4, 5].into_iter().collect();
        assert_eq!(find_period(&ids, 1), None);
        let ids: VecDeque<u64> = [7; 6].into_iter().collect();
        assert_eq!(find_period(&ids, 1), Some(1));
        // Five of one op then two of another, repeated: not a period of 1 within the window.
        let ids: VecDeque<u64> = (0..28).map(|i| u64::from(i % 7 >= 5)).collect();
        assert_eq!(find_period(&ids, 1), Some(1));
        assert_eq!(find_period(&ids, 4), Some(7));
    }

    #[test]
    fn a_period_longer_than_the_limit_is_cut_at_the_same_places_each_time() {
        // Period 7, limit 3: once a cut by size finds the period, every repetition is cut
        // into pieces of 3, 3 and 1 ops starting at the same places.
        let ids: Vec<u64> = (0..70).map(|i| i % 7).collect();
        let graphs = cuts(&ids, 3);
        let first_short = graphs.iter().position(|g| g.1 == 1).unwrap();
        let steady = &graphs[first_short + 1..];
        assert!(steady.len() >= 9, "{graphs:?}");
        for (i, g) in steady.iter().enumerate() {
            assert_eq!(g.1, [3, 3, 1][i % 3], "{graphs:?}");
            assert_eq!(g.0 % 7, steady[i % 3].0 % 7, "{graphs:?}");
        }
    }

    #[test]
    fn a_short_period_is_cut_at_its_largest_multiple_within_the_limit() {
        let ids: Vec<u64> = (0..100).map(|i| i % 3).collect();
        let graphs = cuts(&ids, 8);
        assert_eq!(graphs[..2], [(0, 8), (8, 8)]);
        assert!(graphs[2..].iter().all(|&(s, len)| len == 6 && (s - 16) % 6 == 0), "{graphs:?}");
    }

    #[test]
    fn a_stream_that_stops_repeating_is_cut_by_size_again() {
        let mut ids: Vec<u64> = (0..40).map(|i| i % 2).collect();
        ids.extend(100..140);
        let graphs = cuts(&ids, 8);
        let tail: Vec<usize> = graphs.iter().filter(|g| g.0 >= 48).map(|g| g.1).collect();
        assert!(tail.iter().all(|&len| len == 8), "{graphs:?}");
    }
}
