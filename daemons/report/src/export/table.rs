//! An exported table: typed columns, nullable or not, that the CSV and Parquet writers both read. Columns are
//! integers (INT64), floats (DOUBLE) or text (UTF-8).

/// A column's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Int(Vec<Option<i64>>),
    Float(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::Int(v) => v.len(),
            Data::Float(v) => v.len(),
            Data::Text(v) => v.len(),
        }
    }
}

/// One column: its name (with its unit where it has one), whether it may hold nulls, and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub name: String,
    pub nullable: bool,
    pub data: Data,
}

/// A table as exported.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    pub name: &'static str,
    pub columns: Vec<Column>,
}

impl Table {
    pub fn new(name: &'static str) -> Table {
        Table {
            name,
            columns: Vec::new(),
        }
    }

    /// Rows: the length of the columns (all the same).
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.data.len())
    }

    fn push(mut self, name: &str, nullable: bool, data: Data) -> Table {
        debug_assert!(
            self.columns.is_empty() || data.len() == self.rows(),
            "column {name} of {} has {} rows, not {}",
            self.name,
            data.len(),
            self.rows()
        );
        self.columns.push(Column {
            name: name.to_string(),
            nullable,
            data,
        });
        self
    }

    /// An integer column without nulls; unsigned values above 2^63 - 1 are stored as 2^63 - 1 (as the store).
    pub fn int<T: TryInto<i64>>(self, name: &str, values: impl Iterator<Item = T>) -> Table {
        let data = values.map(|v| Some(v.try_into().unwrap_or(i64::MAX))).collect();
        self.push(name, false, Data::Int(data))
    }

    /// An integer column that may hold nulls.
    pub fn opt_int<T: TryInto<i64>>(self, name: &str, values: impl Iterator<Item = Option<T>>) -> Table {
        let data = values
            .map(|v| v.map(|v| v.try_into().unwrap_or(i64::MAX)))
            .collect();
        self.push(name, true, Data::Int(data))
    }

    /// A 64-bit id (event, counter, class): its bits as a signed integer, as the store holds it, so ids join
    /// between the export and the store.
    pub fn id(self, name: &str, values: impl Iterator<Item = u64>) -> Table {
        let data = values.map(|v| Some(v as i64)).collect();
        self.push(name, false, Data::Int(data))
    }

    /// A 64-bit id that may be null.
    pub fn opt_id(self, name: &str, values: impl Iterator<Item = Option<u64>>) -> Table {
        let data = values.map(|v| v.map(|v| v as i64)).collect();
        self.push(name, true, Data::Int(data))
    }

    /// A 0 or 1 column (`late`).
    pub fn flag(self, name: &str, values: impl Iterator<Item = bool>) -> Table {
        let data = values.map(|v| Some(i64::from(v))).collect();
        self.push(name, false, Data::Int(data))
    }

    /// A float column; not finite values are stored as such.
    pub fn float(self, name: &str, values: impl Iterator<Item = Option<f64>>) -> Table {
        self.push(name, true, Data::Float(values.collect()))
    }

    /// A text column without nulls.
    pub fn text<S: Into<String>>(self, name: &str, values: impl Iterator<Item = S>) -> Table {
        let data = values.map(|v| Some(v.into())).collect();
        self.push(name, false, Data::Text(data))
    }

    /// A text column that may hold nulls.
    pub fn opt_text(self, name: &str, values: impl Iterator<Item = Option<String>>) -> Table {
        self.push(name, true, Data::Text(values.collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_keep_types_nulls_and_id_bits() {
        let t = Table::new("t")
            .int("round", [1u64, u64::MAX].into_iter())
            .id("event_id", [u64::MAX].into_iter().chain([7]))
            .opt_text("app", [None, Some("a".to_string())].into_iter())
            .flag("late", [true, false].into_iter());
        assert_eq!(t.rows(), 2);
        assert_eq!(t.columns[0].data, Data::Int(vec![Some(1), Some(i64::MAX)]));
        assert_eq!(t.columns[1].data, Data::Int(vec![Some(-1), Some(7)]));
        assert!(t.columns[2].nullable && !t.columns[0].nullable);
        assert_eq!(t.columns[3].data, Data::Int(vec![Some(1), Some(0)]));
        assert_eq!(Table::new("empty").rows(), 0);
    }
}
