//! Decoding a call's inputs: a bad input is rejected through the emitter and the others go on, and the good
//! ones come back in a canonical order so that merging does not depend on arrival order.

use canopy_filter_sdk::Emit;
use canopy_wire::v1::{ProfileBatch, RankProfile};
use prost::Message;

/// The rank profiles of a leaf's inputs (each an encoded `ProfileBatch`), sorted by (app, rank), and the
/// summed length of the inputs that decoded: the raw bytes the result stands for. An input that does not
/// decode is rejected and adds nothing.
pub fn profiles(inputs: &[&[u8]], out: &mut dyn Emit) -> (Vec<RankProfile>, u64) {
    let mut raw_bytes = 0u64;
    let mut profiles = Vec::new();
    for i in canonical_order(inputs) {
        match ProfileBatch::decode(inputs[i]) {
            Ok(batch) => {
                raw_bytes += inputs[i].len() as u64;
                profiles.extend(batch.profiles);
            }
            Err(e) => out.reject(i, &format!("input is not a canopy.v1.ProfileBatch: {e}")),
        }
    }
    // Stable: two profiles of the same rank keep the canonical order of their inputs.
    profiles.sort_by(|a, b| (a.app.as_str(), a.rank).cmp(&(b.app.as_str(), b.rank)));
    (profiles, raw_bytes)
}

/// The rank profiles of a leaf's inputs read into `into` without building messages (see `stream`): the same
/// profiles, order, rejections and raw byte count as `profiles`. The inputs are read as they come and the
/// profiles sorted by (app, rank) after, with the inputs' bytes deciding only between profiles of the same
/// rank: one comparison of whole inputs per tie instead of a sort of every input by its bytes.
pub fn profile_views<'a>(
    inputs: &[&'a [u8]],
    into: &mut crate::stream::Buffers,
    out: &mut dyn Emit,
) -> (Vec<crate::stream::ProfileView<'a>>, u64) {
    let mut raw_bytes = 0u64;
    let mut views = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.iter().enumerate() {
        match crate::stream::read_batch(input, into) {
            Ok(v) => {
                raw_bytes += input.len() as u64;
                views.extend(v.into_iter().map(|v| (v, i)));
            }
            Err(e) => out.reject(i, &format!("input is not a canopy.v1.ProfileBatch: {e}")),
        }
    }
    // Stable: two profiles of the same rank from one input keep their order in it.
    views.sort_by(|(a, i), (b, j)| {
        (a.app, a.rank)
            .cmp(&(b.app, b.rank))
            .then_with(|| inputs[*i].cmp(inputs[*j]))
            .then(i.cmp(j))
    });
    (views.into_iter().map(|(v, _)| v).collect(), raw_bytes)
}

/// What [`each_profile`] hands its caller, in order.
pub enum Step<'s, 'a> {
    /// Start (or start over): forget every profile handed so far. Always the first step.
    Start,
    /// The next profile, and the buffers its view reads from.
    Profile(&'s crate::stream::ProfileView<'a>, &'s crate::stream::Buffers),
}

/// Hands `f` each rank profile of a leaf's inputs in the order of [`profile_views`], and gives the raw byte
/// count it gives, rejecting the same inputs with the same messages.
///
/// When every input holds one profile (a rank's dump, the usual input) the inputs are ordered by the
/// application and rank at their front ([`crate::stream::rank_hint`]), then read one at a time into `into`,
/// cleared before each: a profile is read and used while it is in the cache, where reading every profile first
/// would write and read back megabytes at a thousand ranks. Each read confirms its input's hint; an input that
/// names another rank further on (no writer does) sends `f` a [`Step::Start`] and every input down
/// [`profile_views`]' path, as do inputs without a hint.
pub fn each_profile<'a>(
    inputs: &[&'a [u8]],
    into: &mut crate::stream::Buffers,
    out: &mut dyn Emit,
    mut f: impl FnMut(Step<'_, 'a>),
) -> u64 {
    f(Step::Start);
    let hinted: Option<Vec<((&str, u32), usize)>> = inputs
        .iter()
        .enumerate()
        .map(|(i, input)| crate::stream::rank_hint(input).map(|at| (at, i)))
        .collect();
    if let Some(mut order) = hinted {
        // As `profile_views` sorts the profiles: by (app, rank), then by their inputs' bytes, then input order.
        order.sort_by(|(a, i), (b, j)| a.cmp(b).then_with(|| inputs[*i].cmp(inputs[*j])).then(i.cmp(j)));
        if let Some((raw_bytes, rejected)) = each_in_order(inputs, &order, into, &mut f) {
            for (i, e) in rejected {
                out.reject(i, &format!("input is not a canopy.v1.ProfileBatch: {e}"));
            }
            return raw_bytes;
        }
        f(Step::Start);
    }
    into.clear();
    let (profiles, raw_bytes) = profile_views(inputs, into, out);
    for p in &profiles {
        f(Step::Profile(p, into));
    }
    raw_bytes
}

/// Reads the inputs in `order`, each confirming its hint, and hands `f` their profiles: the raw byte count
/// and the rejections in input order, or `None` as soon as an input names another rank than its hint.
fn each_in_order<'a>(
    inputs: &[&'a [u8]],
    order: &[((&str, u32), usize)],
    into: &mut crate::stream::Buffers,
    f: &mut impl FnMut(Step<'_, 'a>),
) -> Option<(u64, Vec<(usize, String)>)> {
    let mut raw_bytes = 0u64;
    let mut rejected = Vec::new();
    for &(hint, i) in order {
        into.clear();
        match crate::stream::read_batch(inputs[i], into) {
            Ok(profiles) => match profiles.as_slice() {
                [p] if (p.app, p.rank) == hint => {
                    raw_bytes += inputs[i].len() as u64;
                    f(Step::Profile(p, into));
                }
                _ => return None,
            },
            Err(e) => rejected.push((i, e)),
        }
    }
    rejected.sort_unstable_by_key(|(i, _)| *i);
    Some((raw_bytes, rejected))
}

/// The packets of a relay's or root's inputs, decoded as `M` (named `what` in a rejection) and ordered by
/// their bytes. `check` may refuse a packet that decodes but is unusable; it is rejected like a bad encoding.
pub fn packets<M: Message + Default>(
    inputs: &[&[u8]],
    what: &str,
    out: &mut dyn Emit,
    check: impl Fn(&M) -> Result<(), String>,
) -> Vec<M> {
    let mut good = Vec::with_capacity(inputs.len());
    for i in canonical_order(inputs) {
        match M::decode(inputs[i])
            .map_err(|e| e.to_string())
            .and_then(|m| check(&m).map(|()| m))
        {
            Ok(m) => good.push(m),
            Err(e) => out.reject(i, &format!("input is not a {what}: {e}")),
        }
    }
    good
}

/// As [`packets`], decoded into `slots` kept between calls, so a node that merges every round reuses their
/// buffers: returns (slot, input index) of the good inputs, in canonical order.
pub fn packets_into<M: Message + Default>(
    inputs: &[&[u8]],
    slots: &mut Vec<M>,
    what: &str,
    out: &mut dyn Emit,
    check: impl Fn(&M) -> Result<(), String>,
) -> Vec<(usize, usize)> {
    let decode = |m: &mut M, bytes: &[u8]| {
        m.clear();
        m.merge(bytes)
    };
    packets_decoded_into(inputs, slots, what, out, decode, check)
}

/// As [`packets_into`], each input decoded into its slot by `decode` (which must leave in it what
/// `clear` then `merge` would, and fail where they would).
pub fn packets_decoded_into<M: Message + Default>(
    inputs: &[&[u8]],
    slots: &mut Vec<M>,
    what: &str,
    out: &mut dyn Emit,
    decode: impl Fn(&mut M, &[u8]) -> Result<(), prost::DecodeError>,
    check: impl Fn(&M) -> Result<(), String>,
) -> Vec<(usize, usize)> {
    if slots.len() < inputs.len() {
        slots.resize_with(inputs.len(), M::default);
    }
    let mut good = Vec::with_capacity(inputs.len());
    for (slot, i) in canonical_order(inputs).into_iter().enumerate() {
        let m = &mut slots[slot];
        match decode(m, inputs[i])
            .map_err(|e| e.to_string())
            .and_then(|()| check(m))
        {
            Ok(()) => good.push((slot, i)),
            Err(e) => out.reject(i, &format!("input is not a {what}: {e}")),
        }
    }
    good
}

/// Input indices sorted by the inputs' bytes: floating-point merging is not associative, so a fixed order
/// makes a node's output the same whatever order its children's packets came in.
pub fn canonical_order(inputs: &[&[u8]]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by(|&a, &b| inputs[a].cmp(inputs[b]).then(a.cmp(&b)));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::StatsResult;
    use canopy_filter_test::Collect;

    fn batch(app: &str, rank: u32) -> Vec<u8> {
        ProfileBatch {
            profiles: vec![RankProfile {
                app: app.into(),
                rank,
                ..Default::default()
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn rejects_bad_profiles_and_sorts_the_rest() {
        let a = batch("x", 5);
        let b = batch("x", 1);
        let bad = vec![0x0a, 0x05, 0x01];
        let mut out = Collect::default();
        let (got, raw) = profiles(&[&a, &bad, &b], &mut out);
        assert_eq!(got.iter().map(|p| p.rank).collect::<Vec<_>>(), vec![1, 5]);
        assert_eq!(raw, (a.len() + b.len()) as u64);
        assert_eq!(out.rejects.len(), 1);
        assert_eq!(out.rejects[0].0, 1);
        assert!(
            out.rejects[0]
                .1
                .starts_with("input is not a canopy.v1.ProfileBatch: "),
            "{}",
            out.rejects[0].1
        );
    }

    /// Views come in the order of `profiles`, whatever the order of the inputs, with profiles of one rank (in
    /// several inputs, or twice in one) ordered as `profiles` orders them; a bad input is rejected by its index.
    #[test]
    fn views_are_ordered_as_profiles_are() {
        // `metrics` tells the profiles of one rank apart, since views carry it.
        let profile = |app: &str, rank: u32, metrics: u32| RankProfile {
            app: app.into(),
            rank,
            metrics,
            ..Default::default()
        };
        let batch_of = |ps: Vec<RankProfile>| ProfileBatch { profiles: ps }.encode_to_vec();
        let inputs = [
            batch_of(vec![profile("y", 1, 0)]),
            batch_of(vec![profile("x", 3, 9), profile("x", 3, 1)]),
            batch_of(vec![profile("x", 7, 0)]),
            vec![0x0a, 0x05],
            batch_of(vec![profile("x", 3, 2), profile("x", 3, 8)]),
            batch_of(vec![profile("x", 3, 5)]),
        ];
        let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let (mut out_a, mut out_b) = (Collect::default(), Collect::default());
        let (expected, raw_a) = profiles(&inputs, &mut out_a);
        let mut buffers = crate::stream::Buffers::default();
        let (views, raw_b) = profile_views(&inputs, &mut buffers, &mut out_b);
        assert_eq!(raw_a, raw_b);
        let rejected = |c: &Collect| c.rejects.iter().map(|r| r.0).collect::<Vec<_>>();
        assert_eq!(rejected(&out_a), vec![3]);
        assert_eq!(rejected(&out_b), vec![3]);
        let got: Vec<(&str, u32, u32)> = views.iter().map(|v| (v.app, v.rank, v.metrics)).collect();
        let want: Vec<(&str, u32, u32)> = expected
            .iter()
            .map(|p| (p.app.as_str(), p.rank, p.metrics))
            .collect();
        assert_eq!(got, want);
        assert_eq!(got.iter().filter(|v| v.1 == 3).count(), 5);
    }

    proptest::proptest! {
        /// `each_profile` gives the profiles, buffers' contents, raw bytes and rejections of `profile_views`,
        /// whatever the inputs: one profile each (the fast path) in any order, ranks twice, batches of several
        /// profiles or none, inputs that do not decode, whose rank can be found or not, and inputs whose front
        /// names another rank than the one that counts.
        #[test]
        fn each_profile_is_profile_views_one_at_a_time(
            inputs in proptest::collection::vec(
                (0u8..20, proptest::collection::vec((0usize..2, 0u32..6, 0u32..4, 0usize..3), 1..3)),
                0..10,
            ),
        ) {
            let profile = |app: usize, rank: u32, metrics: u32, events: usize| RankProfile {
                app: ["x", "y"][app].into(),
                rank,
                metrics,
                events: (0..events as u64)
                    .map(|id| canopy_wire::v1::EventSample { event_id: id, calls: u64::from(rank), ..Default::default() })
                    .collect(),
                ..Default::default()
            };
            let encoded: Vec<Vec<u8>> = inputs
                .iter()
                .map(|(kind, ps)| {
                    let ps: Vec<RankProfile> = ps.iter().map(|&(a, r, m, e)| profile(a, r, m, e)).collect();
                    match kind {
                        0 => vec![0x0a, 0x05, 0x01],
                        1 => ProfileBatch { profiles: ps }.encode_to_vec(),
                        2 => Vec::new(),
                        // One profile whose rank can be found but whose last event does not decode.
                        3 => {
                            let mut p = ps[0].encode_to_vec();
                            p.extend([0x2a, 0x01, 0x08]);
                            let mut b = Vec::new();
                            prost::encoding::bytes::encode(1, &p, &mut b);
                            b
                        }
                        // One profile that names another rank after its events: its front misleads.
                        4 => {
                            let mut p = ps[0].encode_to_vec();
                            prost::encoding::uint32::encode(2, &(ps[0].rank + 3), &mut p);
                            let mut b = Vec::new();
                            prost::encoding::bytes::encode(1, &p, &mut b);
                            b
                        }
                        _ => ProfileBatch { profiles: vec![ps[0].clone()] }.encode_to_vec(),
                    }
                })
                .collect();
            let inputs: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
            let seen = |v: &crate::stream::ProfileView<'_>, b: &crate::stream::Buffers| {
                let calls: Vec<u64> = b.events[v.events.clone()].iter().map(|e| e.calls).collect();
                (v.app.to_string(), v.rank, v.metrics, calls)
            };
            let (mut out_a, mut out_b) = (Collect::default(), Collect::default());
            let mut buffers = crate::stream::Buffers::default();
            let (views, raw_a) = profile_views(&inputs, &mut buffers, &mut out_a);
            let expected: Vec<_> = views.iter().map(|v| seen(v, &buffers)).collect();
            let mut got = Vec::new();
            let mut reused = crate::stream::Buffers::default();
            let raw_b = each_profile(&inputs, &mut reused, &mut out_b, |step| match step {
                Step::Start => got.clear(),
                Step::Profile(v, b) => got.push(seen(v, b)),
            });
            proptest::prop_assert_eq!(got, expected);
            proptest::prop_assert_eq!(raw_b, raw_a);
            proptest::prop_assert_eq!(out_b.rejects, out_a.rejects);
        }
    }

    /// Inputs as the writers write them are read once, in order, whatever order they came in; one whose front
    /// misleads sends everything down the general path, once.
    #[test]
    fn hinted_inputs_are_read_once_and_a_misleading_one_starts_over() {
        let mut inputs: Vec<Vec<u8>> = [3, 1, 2, 0].map(|rank| batch("x", rank)).to_vec();
        let starts = |inputs: &[Vec<u8>]| {
            let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let (mut starts, mut ranks) = (0, Vec::new());
            each_profile(
                &inputs,
                &mut Default::default(),
                &mut Collect::default(),
                |step| match step {
                    Step::Start => {
                        starts += 1;
                        ranks.clear();
                    }
                    Step::Profile(p, _) => ranks.push(p.rank),
                },
            );
            (starts, ranks)
        };
        assert_eq!(starts(&inputs), (1, vec![0, 1, 2, 3]));
        // Rank 1's input names rank 9 at its end: the rank that counts.
        prost::encoding::uint32::encode(2, &9, &mut inputs[1]);
        let mut profile = Vec::new();
        prost::encoding::string::encode(1, &"x".to_string(), &mut profile);
        prost::encoding::uint32::encode(2, &1, &mut profile);
        prost::encoding::uint32::encode(2, &9, &mut profile);
        inputs[1].clear();
        prost::encoding::bytes::encode(1, &profile, &mut inputs[1]);
        assert_eq!(starts(&inputs), (2, vec![0, 2, 3, 9]));
    }

    #[test]
    fn packets_are_checked_and_ordered_by_bytes() {
        let p1 = StatsResult {
            raw_bytes: 1,
            ..Default::default()
        }
        .encode_to_vec();
        let p2 = StatsResult {
            raw_bytes: 2,
            ..Default::default()
        }
        .encode_to_vec();
        let p3 = StatsResult {
            raw_bytes: 3,
            ..Default::default()
        }
        .encode_to_vec();
        let mut out = Collect::default();
        let got: Vec<StatsResult> = packets(&[&p3, &p2, &p1], "StatsResult", &mut out, |m: &StatsResult| {
            if m.raw_bytes == 2 {
                Err("two is bad".into())
            } else {
                Ok(())
            }
        });
        assert_eq!(got.iter().map(|m| m.raw_bytes).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(
            out.rejects,
            vec![(1, "input is not a StatsResult: two is bad".to_string())]
        );
    }
}
