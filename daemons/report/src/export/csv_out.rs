//! A table as CSV: a header of the column names, a line per row; a null is an empty field, text is quoted
//! where it must be, floats are written in their shortest form that reads back to the same value.

use std::io::Write;

use super::table::{Data, Table};

pub fn write(table: &Table, out: impl Write) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_writer(out);
    w.write_record(table.columns.iter().map(|c| c.name.as_str()))?;
    let mut record: Vec<String> = Vec::with_capacity(table.columns.len());
    for row in 0..table.rows() {
        record.clear();
        for c in &table.columns {
            record.push(match &c.data {
                Data::Int(v) => v[row].map(|x| x.to_string()).unwrap_or_default(),
                Data::Float(v) => v[row].map(|x| x.to_string()).unwrap_or_default(),
                Data::Text(v) => v[row].clone().unwrap_or_default(),
            });
        }
        w.write_record(&record)?;
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nulls_are_empty_and_text_is_quoted() {
        let t = Table::new("t")
            .int("round", [1u32, 2].into_iter())
            .float("mean_us", [Some(0.1), None].into_iter())
            .column("event", true, Data::Text(vec![Some("a,\"b\"".to_string()), None]));
        let mut out = Vec::new();
        write(&t, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "round,mean_us,event\n1,0.1,\"a,\"\"b\"\"\"\n2,,\n"
        );
    }
}
