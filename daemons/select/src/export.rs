//! The training set for other tools: CSV (pandas, a spreadsheet) and ARFF (Weka).
//!
//! Numbers are written with Rust's shortest round-trip formatting (`{}`: the fewest digits that read back to
//! the same value, without an exponent). Both writers issue many small writes: give them a buffered writer.

use std::borrow::Cow;
use std::io::{self, Write};

use crate::Dataset;

/// The training set as CSV: a header `latency,<name>,...` (names quoted per RFC 4180 when they hold a comma, quote
/// or newline), one row per observation, numbers with Rust's shortest round-trip formatting.
///
/// The header's first field is `target_name`, quoted by the same rule; lines end with `\n`.
///
/// # Errors
/// The writer's.
pub fn write_csv(ds: &Dataset, target_name: &str, w: &mut impl Write) -> io::Result<()> {
    w.write_all(csv_field(target_name).as_bytes())?;
    for name in &ds.names {
        write!(w, ",{}", csv_field(name))?;
    }
    writeln!(w)?;
    for (row, target) in ds.target.iter().enumerate() {
        write!(w, "{target}")?;
        for column in &ds.columns {
            write!(w, ",{}", column[row])?;
        }
        writeln!(w)?;
    }
    Ok(())
}

/// A CSV field: as it is, or in double quotes with its double quotes doubled when it holds a comma, a double
/// quote, a carriage return or a line feed (RFC 4180).
fn csv_field(text: &str) -> Cow<'_, str> {
    if text.contains([',', '"', '\r', '\n']) {
        Cow::Owned(format!("\"{}\"", text.replace('"', "\"\"")))
    } else {
        Cow::Borrowed(text)
    }
}

/// The same as Weka's ARFF: `@relation <relation>`, one `@attribute '<name>' numeric` per feature (single quotes
/// escaped as \'), the target last (`@attribute '<target_name>' numeric`, Weka's convention of the class last),
/// `@data`, rows comma-separated.
///
/// A blank line precedes the first `@attribute` and `@data`, as in Weka's own files. Inside the single quotes
/// a backslash is written `\\`, a tab `\t`, a line feed `\n` and a carriage return `\r`, which Weka reads back.
/// The relation is quoted the same way only when it needs to be (empty, `?`, or holding a space, comma, brace,
/// quote, `%` or one of those characters).
///
/// # Errors
/// The writer's.
pub fn write_arff(ds: &Dataset, relation: &str, target_name: &str, w: &mut impl Write) -> io::Result<()> {
    let bare = !relation.is_empty()
        && relation != "?"
        && !relation.contains([' ', ',', '{', '}', '\'', '"', '%', '\\', '\t', '\n', '\r']);
    if bare {
        writeln!(w, "@relation {relation}\n")?;
    } else {
        writeln!(w, "@relation {}\n", arff_quoted(relation))?;
    }
    for name in ds.names.iter().map(String::as_str).chain([target_name]) {
        writeln!(w, "@attribute {} numeric", arff_quoted(name))?;
    }
    writeln!(w, "\n@data")?;
    for (row, target) in ds.target.iter().enumerate() {
        for column in &ds.columns {
            write!(w, "{},", column[row])?;
        }
        writeln!(w, "{target}")?;
    }
    Ok(())
}

/// A name in single quotes, with backslash escapes for what would end or break the quoted string.
fn arff_quoted(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('\'');
    for c in text.chars() {
        match c {
            '\\' => quoted.push_str("\\\\"),
            '\'' => quoted.push_str("\\'"),
            '\t' => quoted.push_str("\\t"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            c => quoted.push(c),
        }
    }
    quoted.push('\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two metrics, one of them named with a comma and both kinds of quote, over three observations.
    fn tiny() -> Dataset {
        Dataset::new(
            vec!["bonds: read_input".into(), "csym \"send\", it's".into()],
            vec![0.25, 1.0, 12.5],
            vec![vec![3.0, -0.0, 1e-7], vec![0.1, 2.5e20, -7.0]],
        )
        .unwrap()
    }

    #[test]
    fn csv_quotes_only_the_names_that_need_it() {
        let mut out = Vec::new();
        write_csv(&tiny(), "latency", &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "latency,bonds: read_input,\"csym \"\"send\"\", it's\"\n\
             0.25,3,0.1\n\
             1,-0,250000000000000000000\n\
             12.5,0.0000001,-7\n"
        );
    }

    #[test]
    fn csv_quotes_a_target_name_with_a_comma() {
        let mut out = Vec::new();
        write_csv(&tiny(), "latency, s", &mut out).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .starts_with("\"latency, s\",bonds")
        );
    }

    #[test]
    fn arff_puts_the_target_last_and_escapes_quotes() {
        let mut out = Vec::new();
        write_arff(&tiny(), "lammps", "latency", &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "@relation lammps\n\
             \n\
             @attribute 'bonds: read_input' numeric\n\
             @attribute 'csym \"send\", it\\'s' numeric\n\
             @attribute 'latency' numeric\n\
             \n\
             @data\n\
             3,0.1,0.25\n\
             -0,250000000000000000000,1\n\
             0.0000001,-7,12.5\n"
        );
    }

    #[test]
    fn arff_quotes_a_relation_only_when_needed() {
        let mut out = Vec::new();
        write_arff(&tiny(), "lammps run 7", "latency", &mut out).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .starts_with("@relation 'lammps run 7'\n\n")
        );
        assert_eq!(arff_quoted("a\\b\tc\nd'e"), "'a\\\\b\\tc\\nd\\'e'");
    }
}
