//! Dividing a key range into spans of about equal data volume, so that a large read can be
//! served as several streams in parallel.
//!
//! The embedded stores walk the range once, summing key and value lengths (redb reads the
//! lengths off its pages without copying a value); TiKV already keeps its data in regions of
//! about equal size, so there a range divides at the region boundaries PD reports.

use super::KeyRange;

/// How finely a range is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Division {
    /// Aim for spans of about this many key and value bytes.
    pub span_bytes: u64,
    /// At most this many spans.
    pub max_spans: usize,
}

/// A range divided: the keys at which a new span begins, in key order, and the volume of each
/// span where the backend knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Divided {
    /// Each cut is the first key (or a key at or before the first key) of a span after the
    /// first; `cuts.len() + 1` spans in all.
    pub cuts: Vec<Vec<u8>>,
    /// Key and value bytes per span, `cuts.len() + 1` of them, when measured.
    pub volumes: Option<Vec<u64>>,
}

/// Accumulates a walk of a range in key order and decides its cuts. Memory stays bounded
/// whatever the range holds: when the candidate cuts grow past a few times the spans wanted,
/// every other one is dropped and the span size doubles.
#[derive(Debug)]
pub(crate) struct Divider {
    division: Division,
    span: u64,
    since_cut: u64,
    total: u64,
    /// Candidate cuts, with the volume before each.
    cuts: Vec<(Vec<u8>, u64)>,
}

impl Divider {
    pub(crate) fn new(division: Division) -> Self {
        Self {
            division: Division {
                span_bytes: division.span_bytes.max(1),
                max_spans: division.max_spans.max(1),
            },
            span: division.span_bytes.max(1),
            since_cut: 0,
            total: 0,
            cuts: Vec::new(),
        }
    }

    /// The next pair of the walk: its key and its key and value bytes.
    pub(crate) fn add(&mut self, key: &[u8], bytes: usize) {
        if self.since_cut >= self.span {
            self.cuts.push((key.to_vec(), self.total));
            self.since_cut = 0;
            if self.cuts.len() >= self.division.max_spans.saturating_mul(4) {
                let mut keep = false;
                self.cuts.retain(|_| {
                    keep = !keep;
                    !keep
                });
                self.span = self.span.saturating_mul(2);
            }
        }
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        self.since_cut = self.since_cut.saturating_add(bytes);
        self.total = self.total.saturating_add(bytes);
    }

    /// The cuts: at most `max_spans - 1` of the candidates, those nearest to equal volumes.
    pub(crate) fn finish(self) -> Divided {
        let wanted = usize::try_from(self.total / self.division.span_bytes)
            .unwrap_or(usize::MAX)
            .clamp(1, self.division.max_spans);
        let mut chosen: Vec<(Vec<u8>, u64)> = Vec::with_capacity(wanted);
        if wanted > 1 {
            let mut candidates = self.cuts.into_iter().peekable();
            for j in 1..wanted {
                let target = u64::try_from(
                    u128::from(self.total) * j as u128 / u128::try_from(wanted).unwrap_or(1),
                )
                .unwrap_or(u64::MAX);
                while let Some((key, before)) = candidates.next() {
                    let next_closer = candidates.peek().is_some_and(|(_, after)| {
                        after.abs_diff(target) <= before.abs_diff(target)
                    });
                    if !next_closer {
                        chosen.push((key, before));
                        break;
                    }
                }
            }
        }
        let mut volumes = Vec::with_capacity(chosen.len() + 1);
        let mut previous = 0;
        for (_, before) in &chosen {
            volumes.push(before - previous);
            previous = *before;
        }
        volumes.push(self.total - previous);
        Divided {
            cuts: chosen.into_iter().map(|(key, _)| key).collect(),
            volumes: Some(volumes),
        }
    }
}

/// `cuts` thinned to at most `max_spans - 1`, evenly by position: the division of a backend
/// whose cuts are of about equal volume already (TiKV's region boundaries).
#[cfg(any(feature = "tikv", test))]
pub(crate) fn thinned(cuts: Vec<Vec<u8>>, max_spans: usize) -> Vec<Vec<u8>> {
    let max_cuts = max_spans.max(1) - 1;
    if cuts.len() <= max_cuts {
        return cuts;
    }
    let spans = cuts.len() + 1;
    let mut taken = Vec::with_capacity(max_cuts);
    let mut next = 1;
    for (i, cut) in cuts.into_iter().enumerate() {
        // Cut i starts span i + 1 of `spans`; take it when it is the first past the next
        // even share.
        if (i + 1) * (max_cuts + 1) >= next * spans {
            taken.push(cut);
            next += 1;
        }
    }
    taken
}

/// Whether `key` lies inside `range` and not at its start (a cut there divides nothing).
pub(crate) fn cuts_inside(range: &KeyRange, key: &[u8]) -> bool {
    range.contains(key) && key != range.start.as_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn divided(pairs: &[(u8, usize)], division: Division) -> Divided {
        let mut divider = Divider::new(division);
        for (key, bytes) in pairs {
            divider.add(&[*key], *bytes);
        }
        divider.finish()
    }

    #[test]
    fn equal_pairs_divide_into_equal_spans() {
        let pairs: Vec<(u8, usize)> = (0..100).map(|k| (k, 10)).collect();
        let out = divided(
            &pairs,
            Division {
                span_bytes: 250,
                max_spans: 16,
            },
        );
        assert_eq!(out.cuts, vec![vec![25], vec![50], vec![75]]);
        assert_eq!(out.volumes, Some(vec![250, 250, 250, 250]));
    }

    #[test]
    fn spans_are_capped_and_memory_stays_bounded() {
        let pairs: Vec<(u8, usize)> = (0..=255).map(|k| (k, 1)).collect();
        let mut divider = Divider::new(Division {
            span_bytes: 1,
            max_spans: 4,
        });
        for (key, bytes) in &pairs {
            divider.add(&[*key], *bytes);
            assert!(divider.cuts.len() < 16, "candidates stay bounded");
        }
        let out = divider.finish();
        assert_eq!(out.cuts.len(), 3);
        let volumes = out.volumes.expect("measured");
        assert_eq!(volumes.iter().sum::<u64>(), 256);
        assert!(volumes.iter().all(|v| (48..=80).contains(v)), "{volumes:?}");
    }

    #[test]
    fn a_small_range_is_one_span_and_one_huge_pair_is_not_cut() {
        let out = divided(
            &[(1, 10), (2, 10)],
            Division {
                span_bytes: 1000,
                max_spans: 8,
            },
        );
        assert!(out.cuts.is_empty());
        assert_eq!(out.volumes, Some(vec![20]));
        let out = divided(
            &[(1, 5000)],
            Division {
                span_bytes: 10,
                max_spans: 8,
            },
        );
        assert!(out.cuts.is_empty());
    }

    #[test]
    fn thinning_keeps_evenly_spaced_cuts() {
        let cuts: Vec<Vec<u8>> = (1..=9).map(|k| vec![k]).collect();
        assert_eq!(thinned(cuts.clone(), 100), cuts);
        assert_eq!(thinned(cuts.clone(), 2), vec![vec![5]]);
        assert_eq!(thinned(cuts.clone(), 1), Vec::<Vec<u8>>::new());
        assert_eq!(thinned(cuts, 5), vec![vec![2], vec![4], vec![6], vec![8]]);
    }
}
