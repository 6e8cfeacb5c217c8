//! The groups of ranks scored together, in the packets: phase 0's per-group rank counts and summaries, phase 2's
//! per-group top lists; how each is checked when it arrives and merged at a relay or the root. Groups are
//! sorted by class id, each once, so the union of a node's inputs is one pass.

use std::collections::BTreeMap;

use canopy_filter_common::classes::app_group;
use canopy_filter_common::columns;
use canopy_filter_proto::v1::{Outlier, OutlierGroup, OutliersPacket, StatsColumns};

use crate::settings::{MAX_KEEP, Scored};
use crate::top;

/// What every check needs to know of the stream.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub by_class: bool,
    pub by_app: bool,
    pub metric: Scored,
    pub top_events: u32,
}

fn check_order(groups: &[OutlierGroup], expect: Expect) -> Result<(), String> {
    for (i, g) in groups.iter().enumerate() {
        match (expect.by_class, expect.by_app) {
            (false, false) if g.class_id != 0 => {
                return Err(format!(
                    "group {:#018x}: this stream scores all ranks together (group 0 only)",
                    g.class_id
                ));
            }
            (false, true) if g.class_id != app_group(&g.app) => {
                return Err(format!(
                    "group {:#018x}: this stream scores each application's ranks together, and this is not \
                     the group of application {:?}",
                    g.class_id, g.app
                ));
            }
            (_, false) if !g.app.is_empty() => {
                return Err(format!(
                    "group {:#018x}: this stream does not score applications apart (by_app: false), but the \
                     group names application {:?}",
                    g.class_id, g.app
                ));
            }
            _ => {}
        }
        if i > 0 && g.class_id <= groups[i - 1].class_id {
            return Err(format!(
                "group {:#018x} at {i} does not follow the previous one (sorted by class id, each once)",
                g.class_id
            ));
        }
    }
    Ok(())
}

/// Refuses a phase-0 (or phase-1) packet this node cannot use: groups out of order, a group of no ranks or
/// without usable summaries of the stream's metric, or carrying a top list.
pub fn check_summaries(p: &OutliersPacket, expect: Expect) -> Result<(), String> {
    check_order(&p.groups, expect)?;
    for g in &p.groups {
        let what = |e: String| format!("group {:#018x}: {e}", g.class_id);
        if g.ranks == 0 {
            return Err(what("no ranks".to_string()));
        }
        if !g.top.is_empty() {
            return Err(what("a top list in a summaries packet".to_string()));
        }
        let s = g
            .summaries
            .as_ref()
            .ok_or_else(|| what("no summaries".to_string()))?;
        columns::check(s)
            .and_then(|()| columns::check_breakdown(s, false))
            .map_err(|e| what(format!("summaries: {e}")))?;
        if let Some(m) = s.metric.iter().find(|m| !expect.metric.admits(**m)) {
            let own: Vec<String> = expect
                .metric
                .metrics()
                .iter()
                .map(|m| (*m as i32).to_string())
                .collect();
            return Err(what(format!(
                "summaries of metric {m}, this stream's {} {}",
                if own.len() == 1 { "is" } else { "are" },
                own.join(", ")
            )));
        }
    }
    Ok(())
}

/// Refuses a phase-2 packet this node cannot merge: groups out of order, a `keep` above the most a stream
/// keeps, a top list [`top::check`] refuses.
pub fn check_tops(p: &OutliersPacket, expect: Expect) -> Result<(), String> {
    check_order(&p.groups, expect)?;
    for g in &p.groups {
        if g.keep > MAX_KEEP {
            return Err(format!(
                "group {:#018x} keeps {}, at most {MAX_KEEP}",
                g.class_id, g.keep
            ));
        }
        top::check(&g.top, g.keep, expect.top_events)
            .map_err(|e| format!("group {:#018x}: {e}", g.class_id))?;
    }
    Ok(())
}

/// Checked phase-0 packets merged: per group, the ranks added, the smallest example kept, the summaries
/// merged in the order given.
pub fn merge_summaries(packets: &[OutliersPacket]) -> OutliersPacket {
    let mut by_class: BTreeMap<u64, (u64, String, Vec<&StatsColumns>, &str)> = BTreeMap::new();
    let mut raw_bytes = 0u64;
    for p in packets {
        raw_bytes = raw_bytes.saturating_add(p.raw_bytes);
        for g in &p.groups {
            // A group's id hashes its application's name: children agree on it.
            let (ranks, example, summaries, _) = by_class
                .entry(g.class_id)
                .or_insert_with(|| (0, g.example_event.clone(), Vec::new(), g.app.as_str()));
            *ranks = ranks.saturating_add(g.ranks);
            // Members of a class share their names, so their examples agree; the smallest settles a collision.
            if g.example_event < *example {
                example.clone_from(&g.example_event);
            }
            summaries.extend(g.summaries.as_ref());
        }
    }
    let groups = by_class
        .into_iter()
        .map(|(class_id, (ranks, example_event, summaries, app))| {
            let mut merged = StatsColumns::default();
            columns::merge(&summaries, &mut merged);
            OutlierGroup {
                class_id,
                ranks,
                example_event,
                summaries: Some(merged),
                app: app.to_string(),
                ..Default::default()
            }
        })
        .collect();
    OutliersPacket { groups, raw_bytes }
}

/// Checked phase-2 packets merged: per group, the union of the top lists, of which the first `keep` stay.
pub fn merge_tops(packets: Vec<OutliersPacket>) -> OutliersPacket {
    let mut by_class: BTreeMap<u64, (u32, Vec<Outlier>, String)> = BTreeMap::new();
    for p in packets {
        for g in p.groups {
            // A group's id hashes its application's name: children agree on it.
            let (keep, list, _) = by_class
                .entry(g.class_id)
                .or_insert_with(|| (0, Vec::new(), g.app));
            // Every leaf computes keep from the same rank count; the largest is kept should one differ.
            *keep = (*keep).max(g.keep);
            list.extend(g.top);
        }
    }
    let groups = by_class
        .into_iter()
        .map(|(class_id, (keep, list, app))| OutlierGroup {
            class_id,
            keep,
            top: top::select(list, keep as usize),
            app,
            ..Default::default()
        })
        .collect();
    OutliersPacket { groups, raw_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_filter_proto::v1::Metric;

    const EXPECT: Expect = Expect {
        by_class: true,
        by_app: false,
        metric: Scored::One(Metric::Exclusive),
        top_events: 3,
    };

    fn group(class_id: u64, ranks: u64) -> OutlierGroup {
        OutlierGroup {
            class_id,
            ranks,
            summaries: Some(StatsColumns {
                id: vec![1],
                metric: vec![Metric::Exclusive as i32],
                count: vec![ranks],
                mean: vec![1.0],
                m2: vec![0.0],
                min: vec![1.0],
                max: vec![1.0],
                min_rank: vec![0],
                max_rank: vec![0],
                min_app: vec![0],
                max_app: vec![0],
                apps: vec!["a".into()],
                ..StatsColumns::default()
            }),
            ..Default::default()
        }
    }

    fn packet(groups: Vec<OutlierGroup>) -> OutliersPacket {
        OutliersPacket { groups, raw_bytes: 0 }
    }

    #[test]
    fn summaries_are_refused_by_name() {
        assert_eq!(
            check_summaries(&packet(vec![group(1, 2), group(5, 1)]), EXPECT),
            Ok(())
        );
        assert_eq!(
            check_summaries(&packet(vec![group(5, 2), group(1, 1)]), EXPECT).unwrap_err(),
            "group 0x0000000000000001 at 1 does not follow the previous one (sorted by class id, each once)"
        );
        assert_eq!(
            check_summaries(&packet(vec![group(5, 0)]), EXPECT).unwrap_err(),
            "group 0x0000000000000005: no ranks"
        );
        let all = Expect {
            by_class: false,
            ..EXPECT
        };
        assert_eq!(
            check_summaries(&packet(vec![group(5, 1)]), all).unwrap_err(),
            "group 0x0000000000000005: this stream scores all ranks together (group 0 only)"
        );
        let per_app = Expect {
            by_class: false,
            by_app: true,
            ..EXPECT
        };
        let mut sim = group(app_group("sim"), 1);
        sim.app = "sim".into();
        assert_eq!(check_summaries(&packet(vec![sim.clone()]), per_app), Ok(()));
        sim.app = "analysis".into();
        assert_eq!(
            check_summaries(&packet(vec![sim.clone()]), per_app).unwrap_err(),
            format!(
                "group {:#018x}: this stream scores each application's ranks together, and this is not the \
                 group of application \"analysis\"",
                app_group("sim")
            )
        );
        let mut named = group(5, 1);
        named.app = "sim".into();
        assert_eq!(
            check_summaries(&packet(vec![named]), EXPECT).unwrap_err(),
            "group 0x0000000000000005: this stream does not score applications apart (by_app: false), but the \
             group names application \"sim\""
        );
        let mut bare = group(0, 1);
        bare.summaries = None;
        assert_eq!(
            check_summaries(&packet(vec![bare]), all).unwrap_err(),
            "group 0x0000000000000000: no summaries"
        );
        let mut by_app = group(0, 1);
        by_app.summaries.as_mut().unwrap().app = vec![0];
        assert_eq!(
            check_summaries(&packet(vec![by_app]), all).unwrap_err(),
            "group 0x0000000000000000: summaries: the stream does not break rows down by application (by_app: \
             false), but the packet has an app column"
        );
        let mut calls = group(0, 1);
        calls.summaries.as_mut().unwrap().metric = vec![Metric::Calls as i32];
        assert_eq!(
            check_summaries(&packet(vec![calls]), all).unwrap_err(),
            "group 0x0000000000000000: summaries of metric 1, this stream's is 3"
        );
        let mut short = group(0, 1);
        short.summaries.as_mut().unwrap().mean.clear();
        assert_eq!(
            check_summaries(&packet(vec![short]), all).unwrap_err(),
            "group 0x0000000000000000: summaries: column mean has 0 entries for 1 rows"
        );
    }

    #[test]
    fn tops_keep_the_largest_keep() {
        let o = |rank: u32, score: f64| Outlier {
            app: "a".into(),
            rank,
            score,
            events: Vec::new(),
        };
        let a = OutlierGroup {
            class_id: 3,
            keep: 2,
            top: vec![o(0, 5.0), o(1, 1.0)],
            ..Default::default()
        };
        let b = OutlierGroup {
            class_id: 3,
            keep: 2,
            top: vec![o(2, 3.0)],
            ..Default::default()
        };
        for p in [packet(vec![a.clone()]), packet(vec![b.clone()])] {
            assert_eq!(check_tops(&p, EXPECT), Ok(()));
        }
        let merged = merge_tops(vec![packet(vec![a]), packet(vec![b])]);
        let ranks: Vec<u32> = merged.groups[0].top.iter().map(|o| o.rank).collect();
        assert_eq!(ranks, [0, 2]);
        let mut huge = merged.clone();
        huge.groups[0].keep = MAX_KEEP + 1;
        assert_eq!(
            check_tops(&huge, EXPECT).unwrap_err(),
            "group 0x0000000000000003 keeps 10001, at most 10000"
        );
    }
}
