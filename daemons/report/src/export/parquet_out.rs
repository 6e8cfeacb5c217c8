//! A table as a Parquet file, through the parquet crate's column writer: INT64, DOUBLE, and BYTE_ARRAY with the
//! String logical type, REQUIRED or OPTIONAL as the column may hold nulls, snappy-compressed, in row groups of
//! at most [`ROW_GROUP`] rows. pandas (pyarrow), DuckDB and Spark read these types as they are.

use std::fs::File;
use std::sync::Arc;

use parquet::basic::{Compression, LogicalType, Repetition, Type as Physical};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

use super::table::{Column, Data, Table};

/// Rows per row group.
pub const ROW_GROUP: usize = 64 * 1024;

/// The table's Parquet schema.
pub fn schema(table: &Table) -> anyhow::Result<Type> {
    let fields = table
        .columns
        .iter()
        .map(|c| {
            let (physical, logical) = match c.data {
                Data::Int(_) => (Physical::INT64, None),
                Data::Float(_) => (Physical::DOUBLE, None),
                Data::Text(_) => (Physical::BYTE_ARRAY, Some(LogicalType::String)),
            };
            let repetition = if c.nullable {
                Repetition::OPTIONAL
            } else {
                Repetition::REQUIRED
            };
            Ok(Arc::new(
                Type::primitive_type_builder(&c.name, physical)
                    .with_repetition(repetition)
                    .with_logical_type(logical)
                    .build()?,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Type::group_type_builder(table.name).with_fields(fields).build()?)
}

pub fn write(table: &Table, file: File) -> anyhow::Result<()> {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_created_by(format!("canopy export {}", env!("CARGO_PKG_VERSION")))
        .build();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema(table)?), Arc::new(props))?;
    let rows = table.rows();
    let mut start = 0;
    // An empty table still gets its schema (and no row group).
    while start < rows {
        let end = (start + ROW_GROUP).min(rows);
        let mut group = writer.next_row_group()?;
        for column in &table.columns {
            let mut w = group
                .next_column()?
                .ok_or_else(|| anyhow::anyhow!("the schema of {} lacks {}", table.name, column.name))?;
            write_column(&mut w, column, start..end)?;
            w.close()?;
        }
        group.close()?;
        start = end;
    }
    writer.close()?;
    Ok(())
}

fn write_column(
    w: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    column: &Column,
    rows: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    match &column.data {
        Data::Int(v) => {
            let (values, levels) = split(&v[rows], column.nullable, |x| *x);
            w.typed::<Int64Type>()
                .write_batch(&values, levels.as_deref(), None)?;
        }
        Data::Float(v) => {
            let (values, levels) = split(&v[rows], column.nullable, |x| *x);
            w.typed::<DoubleType>()
                .write_batch(&values, levels.as_deref(), None)?;
        }
        Data::Text(v) => {
            let (values, levels) = split(&v[rows], column.nullable, |s| ByteArray::from(s.as_str()));
            w.typed::<ByteArrayType>()
                .write_batch(&values, levels.as_deref(), None)?;
        }
    }
    Ok(())
}

/// The non-null values of a column and, for an OPTIONAL one, its definition levels (1: a value, 0: null).
fn split<T, V>(column: &[Option<T>], nullable: bool, value: impl Fn(&T) -> V) -> (Vec<V>, Option<Vec<i16>>) {
    let values = column.iter().flatten().map(value).collect();
    let levels = nullable.then(|| column.iter().map(|v| i16::from(v.is_some())).collect());
    (values, levels)
}

#[cfg(test)]
mod tests {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    use super::*;

    #[test]
    fn a_table_reads_back_with_its_types_and_nulls() {
        let t = Table::new("t")
            .int("round", [0u64, 1, 2].into_iter())
            .float("mean_us", [Some(1.5), None, Some(-0.25)].into_iter())
            .column(
                "event",
                true,
                Data::Text(vec![Some("MPI_Send".to_string()), None, Some("é".to_string())]),
            );
        let path = std::env::temp_dir().join(format!("canopy-export-{}.parquet", std::process::id()));
        write(&t, File::create(&path).unwrap()).unwrap();
        let reader = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let names: Vec<_> = schema.columns().iter().map(|c| c.name().to_string()).collect();
        assert_eq!(names, ["round", "mean_us", "event"]);
        assert_eq!(schema.column(2).logical_type_ref(), Some(&LogicalType::String));
        let rows: Vec<Vec<Field>> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| r.unwrap().get_column_iter().map(|(_, f)| f.clone()).collect())
            .collect();
        assert_eq!(
            rows,
            vec![
                vec![Field::Long(0), Field::Double(1.5), Field::Str("MPI_Send".into())],
                vec![Field::Long(1), Field::Null, Field::Null],
                vec![Field::Long(2), Field::Double(-0.25), Field::Str("é".into())],
            ]
        );
    }
}
