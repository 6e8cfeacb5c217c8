//! When the wrapper dumps, from the environment: CANOPY_MPI_DUMP_ON, then CANOPY_DUMP_PERIOD_MS, then every
//! 1000 ms. A bad value is reported in one line naming the variable, and the next rule applies; nothing here
//! stops the application.

use canopy_wire::options::MAX_PERIOD_MS;

/// The period the wrapper gives the SDK when nothing else chooses the dumps.
pub(crate) const DEFAULT_PERIOD_MS: u64 = 1000;

/// Who takes the dumps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rounds {
    /// The wrapper, after every `every`-th call of the function at `index` in `FUNCTIONS`.
    EveryNth { index: usize, every: u64 },
    /// The application, with its own `canopy_dump`.
    App,
    /// The SDK's period thread, every `ms` (CANOPY_DUMP_PERIOD_MS, or the default).
    Period { ms: u64 },
}

/// CANOPY_DUMP_PERIOD_MS for the SDK's own reading of the environment: kept, or dropped because its value is
/// bad (the SDK would refuse to start on it; the policy's period replaces it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeriodVar {
    Keep,
    Drop,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    pub rounds: Rounds,
    pub period_var: PeriodVar,
    /// Lines for stderr: bad values, and settings that another one overrides.
    pub notes: Vec<String>,
}

fn parse_dump_on(value: &str, functions: &[&str]) -> Result<Rounds, String> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("app") {
        return Ok(Rounds::App);
    }
    let (name, every) = match value.split_once(':') {
        Some((name, n)) => {
            let every = n.trim().parse::<u64>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                format!("the count after `:` must be a whole number of at least 1, not {n:?}")
            })?;
            (name.trim(), every)
        }
        None => (value, 1),
    };
    let index = functions
        .iter()
        .position(|f| f.eq_ignore_ascii_case(name))
        .ok_or_else(|| format!("{name:?} is not an MPI call the wrapper intercepts"))?;
    if matches!(functions[index], "MPI_Init" | "MPI_Init_thread" | "MPI_Finalize") {
        return Err(format!(
            "{} is called once; choose a call the application repeats",
            functions[index]
        ));
    }
    Ok(Rounds::EveryNth { index, every })
}

fn parse_period(value: &str) -> Result<u64, String> {
    match value.trim().parse::<u64>() {
        Ok(ms) if ms <= MAX_PERIOD_MS => Ok(ms),
        Ok(_) => Err(format!("over the limit of {MAX_PERIOD_MS} ms (one hour)")),
        Err(e) => Err(e.to_string()),
    }
}

/// The policy for these values of CANOPY_MPI_DUMP_ON and CANOPY_DUMP_PERIOD_MS (unset or blank: `None`).
pub(crate) fn policy(dump_on: Option<&str>, period: Option<&str>, functions: &[&str]) -> Policy {
    let dump_on = dump_on.filter(|v| !v.trim().is_empty());
    let period = period.filter(|v| !v.trim().is_empty());
    let mut notes = Vec::new();
    let mut period_var = PeriodVar::Keep;
    if let Some(v) = dump_on {
        match parse_dump_on(v, functions) {
            Ok(rounds) => {
                if period.is_some() {
                    notes.push(format!(
                        "canopy-mpi: CANOPY_DUMP_PERIOD_MS is ignored: CANOPY_MPI_DUMP_ON={v} chooses when to dump"
                    ));
                }
                // A bad period must not stop the SDK either, though it is not used.
                let period_var = match period.map(parse_period) {
                    Some(Err(_)) => PeriodVar::Drop,
                    _ => PeriodVar::Keep,
                };
                return Policy {
                    rounds,
                    period_var,
                    notes,
                };
            }
            Err(why) => {
                let next = match period {
                    Some(_) => "CANOPY_DUMP_PERIOD_MS applies".to_string(),
                    None => format!("dumping every {DEFAULT_PERIOD_MS} ms instead"),
                };
                notes.push(format!(
                    "canopy-mpi: bad value {v:?} in CANOPY_MPI_DUMP_ON: {why} (expected MPI_<Name>[:N], for \
                     example MPI_Allreduce:10, or app); {next}"
                ));
            }
        }
    }
    if let Some(v) = period {
        match parse_period(v) {
            // 0: no period, as for the SDK: the application dumps.
            Ok(0) => {
                return Policy {
                    rounds: Rounds::App,
                    period_var: PeriodVar::Keep,
                    notes,
                };
            }
            Ok(ms) => {
                return Policy {
                    rounds: Rounds::Period { ms },
                    period_var: PeriodVar::Keep,
                    notes,
                };
            }
            Err(why) => {
                notes.push(format!(
                    "canopy-mpi: bad value {v:?} in CANOPY_DUMP_PERIOD_MS: {why}; dumping every \
                     {DEFAULT_PERIOD_MS} ms instead"
                ));
                period_var = PeriodVar::Drop;
            }
        }
    }
    Policy {
        rounds: Rounds::Period {
            ms: DEFAULT_PERIOD_MS,
        },
        period_var,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: &[&str] = &["MPI_Init", "MPI_Finalize", "MPI_Send", "MPI_Allreduce"];

    #[test]
    fn nothing_set_dumps_every_second() {
        let p = policy(None, None, F);
        assert_eq!(p.rounds, Rounds::Period { ms: 1000 });
        assert_eq!(p.period_var, PeriodVar::Keep);
        assert!(p.notes.is_empty());
        assert_eq!(policy(Some("  "), Some(""), F), p);
    }

    #[test]
    fn a_call_and_a_count_dump_on_that_call() {
        let p = policy(Some("MPI_Allreduce:10"), None, F);
        assert_eq!(p.rounds, Rounds::EveryNth { index: 3, every: 10 });
        assert_eq!(p.period_var, PeriodVar::Keep);
        assert_eq!(
            policy(Some("mpi_send"), None, F).rounds,
            Rounds::EveryNth { index: 2, every: 1 }
        );
        // It wins over a period, said so.
        let p = policy(Some("MPI_Send"), Some("50"), F);
        assert_eq!(p.period_var, PeriodVar::Keep);
        assert_eq!(p.rounds, Rounds::EveryNth { index: 2, every: 1 });
        assert!(
            p.notes[0].contains("CANOPY_DUMP_PERIOD_MS is ignored"),
            "{:?}",
            p.notes
        );
    }

    #[test]
    fn app_and_a_zero_period_leave_the_dumps_to_the_application() {
        assert_eq!(policy(Some("app"), None, F).rounds, Rounds::App);
        assert_eq!(policy(None, Some("0"), F).rounds, Rounds::App);
        assert_eq!(policy(None, Some("25"), F).rounds, Rounds::Period { ms: 25 });
    }

    #[test]
    fn bad_values_are_named_and_the_next_rule_applies() {
        for bad in ["MPI_Nope", "MPI_Send:0", "MPI_Send:x", "MPI_Init", "42"] {
            let p = policy(Some(bad), None, F);
            assert_eq!(p.rounds, Rounds::Period { ms: 1000 }, "{bad}");
            assert_eq!(p.notes.len(), 1, "{bad}: {:?}", p.notes);
            assert!(
                p.notes[0].starts_with(&format!("canopy-mpi: bad value {bad:?} in CANOPY_MPI_DUMP_ON: ")),
                "{}",
                p.notes[0]
            );
        }
        let p = policy(Some("MPI_Nope"), Some("20"), F);
        assert_eq!(p.rounds, Rounds::Period { ms: 20 });
        assert!(
            p.notes[0].ends_with("CANOPY_DUMP_PERIOD_MS applies"),
            "{}",
            p.notes[0]
        );
        for bad in ["soon", "-5", "3600001"] {
            let p = policy(None, Some(bad), F);
            assert_eq!(p.rounds, Rounds::Period { ms: 1000 }, "{bad}");
            assert_eq!(p.period_var, PeriodVar::Drop);
            assert!(
                p.notes[0].starts_with(&format!(
                    "canopy-mpi: bad value {bad:?} in CANOPY_DUMP_PERIOD_MS: "
                )),
                "{}",
                p.notes[0]
            );
        }
    }
}
