//! The control in force below a node: the last start or stop, the measurement options (a period of 0 keeps the
//! one in force), and whether a drain is under way. A child that attaches later is told all of it.

use canopy_proto::v1::{Control, Drain, control};

#[derive(Debug, Default)]
pub(crate) struct ControlState {
    collection: Option<Control>,
    /// The window of rounds in force (a start or stop ends it).
    window: Option<Control>,
    options: Option<Control>,
    draining: bool,
}

impl ControlState {
    /// Takes in one control message on its way down.
    pub(crate) fn record(&mut self, c: &Control) {
        match &c.action {
            Some(control::Action::Start(_) | control::Action::Stop(_)) => {
                self.collection = Some(c.clone());
                self.window = None;
            }
            Some(control::Action::Window(_)) => self.window = Some(c.clone()),
            Some(control::Action::Options(o)) => {
                let mut o = o.clone();
                if o.period_ms == 0
                    && let Some(Control {
                        action: Some(control::Action::Options(prev)),
                    }) = &self.options
                {
                    o.period_ms = prev.period_ms;
                }
                self.options = Some(Control {
                    action: Some(control::Action::Options(o)),
                });
            }
            Some(control::Action::Drain(_)) => self.draining = true,
            Some(control::Action::FinAck(_)) | None => {}
        }
    }

    /// Whether a drain is under way.
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }

    /// Whether the last start or stop was a start.
    pub(crate) fn collecting(&self) -> bool {
        matches!(
            self.collection,
            Some(Control {
                action: Some(control::Action::Start(_))
            })
        )
    }

    /// What a child attaching now must hear, in order: the options first (the Start that follows may make the
    /// child dump at once), then the start or stop (a start marked as a rejoin), the window of rounds in force,
    /// then a drain under way.
    pub(crate) fn replay(&self) -> Vec<Control> {
        let mut out: Vec<Control> = self
            .options
            .iter()
            .chain(self.collection.iter())
            .chain(self.window.iter())
            .cloned()
            .collect();
        for c in &mut out {
            if let Some(control::Action::Start(s)) = &mut c.action {
                s.rejoin = true;
            }
        }
        if self.draining {
            out.push(Control {
                action: Some(control::Action::Drain(Drain {})),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canopy_proto::v1::{Options, Stop};

    fn options(period_ms: u64, sample_below: u32) -> Control {
        Control {
            action: Some(control::Action::Options(Options {
                period_ms,
                sample_below,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_late_child_hears_the_options_then_the_collection_then_the_drain() {
        let mut s = ControlState::default();
        assert!(s.replay().is_empty());
        s.record(&options(50, 0));
        s.record(&options(0, 2));
        s.record(&Control {
            action: Some(control::Action::Stop(Stop {})),
        });
        s.record(&Control {
            action: Some(control::Action::Drain(Drain {})),
        });
        let r = s.replay();
        assert_eq!(r.len(), 3);
        // A period of 0 kept the one in force.
        assert_eq!(r[0], options(50, 2));
        assert!(matches!(r[1].action, Some(control::Action::Stop(_))));
        assert!(matches!(r[2].action, Some(control::Action::Drain(_))));
    }

    #[test]
    fn a_child_attaching_after_the_start_hears_a_rejoin_and_the_broadcast_one_does_not() {
        let mut s = ControlState::default();
        let start = canopy_proto::v1::Start {
            start_unix_ns: 7,
            first_round: 3,
            rejoin: false,
        };
        s.record(&Control {
            action: Some(control::Action::Start(start)),
        });
        let r = s.replay();
        assert_eq!(r.len(), 1);
        let Some(control::Action::Start(replayed)) = &r[0].action else {
            panic!("the replay is not a start: {r:?}");
        };
        assert_eq!(
            *replayed,
            canopy_proto::v1::Start {
                rejoin: true,
                ..start
            }
        );
        // What was recorded (and broadcast) stays as the parent sent it.
        let Some(Control {
            action: Some(control::Action::Start(kept)),
        }) = &s.collection
        else {
            panic!("no start recorded");
        };
        assert!(!kept.rejoin);
    }

    #[test]
    fn a_late_child_hears_the_window_after_the_start_and_a_stop_ends_it() {
        let mut s = ControlState::default();
        let window = Control {
            action: Some(control::Action::Window(canopy_proto::v1::Window {
                from_round: 40,
                to_round: 49,
            })),
        };
        s.record(&Control {
            action: Some(control::Action::Start(canopy_proto::v1::Start::default())),
        });
        s.record(&window);
        let r = s.replay();
        assert_eq!(r.len(), 2);
        assert!(matches!(r[0].action, Some(control::Action::Start(_))));
        assert_eq!(r[1], window);
        s.record(&Control {
            action: Some(control::Action::Stop(Stop {})),
        });
        let r = s.replay();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(matches!(r[0].action, Some(control::Action::Stop(_))));
    }
}
