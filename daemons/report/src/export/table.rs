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

    /// A column of values already typed.
    pub fn column(self, name: &str, nullable: bool, data: Data) -> Table {
        self.push(name, nullable, data)
    }

    /// The table with `other`'s columns after its column `after` (at the end when it has none of that name).
    pub fn insert_after(mut self, after: &str, other: Table) -> Table {
        let at = self
            .columns
            .iter()
            .position(|c| c.name == after)
            .map_or(self.columns.len(), |i| i + 1);
        self.columns.splice(at..at, other.columns);
        self
    }

    /// An integer column without nulls; unsigned values above 2^63 - 1 are stored as 2^63 - 1 (as the store).
    pub fn int<T: TryInto<i64>>(self, name: &str, values: impl Iterator<Item = T>) -> Table {
        let data = values.map(|v| Some(v.try_into().unwrap_or(i64::MAX))).collect();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_keep_types_nulls_and_saturate() {
        let t = Table::new("t")
            .int("round", [1u64, u64::MAX].into_iter())
            .column("event_id", false, Data::Int(vec![Some(-1), Some(7)]))
            .column("app", true, Data::Text(vec![None, Some("a".to_string())]))
            .int("late", [1, 0].into_iter());
        assert_eq!(t.rows(), 2);
        assert_eq!(t.columns[0].data, Data::Int(vec![Some(1), Some(i64::MAX)]));
        assert_eq!(t.columns[1].data, Data::Int(vec![Some(-1), Some(7)]));
        assert!(t.columns[2].nullable && !t.columns[0].nullable);
        assert_eq!(t.columns[3].data, Data::Int(vec![Some(1), Some(0)]));
        assert_eq!(Table::new("empty").rows(), 0);
    }

    #[test]
    fn a_table_inserted_after_a_column_lands_after_it() {
        let t = Table::new("t")
            .int("a", [1].into_iter())
            .int("c", [3].into_iter())
            .insert_after("a", Table::new("x").int("b", [2].into_iter()));
        let names: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        let t = t.insert_after("none", Table::new("x").int("d", [4].into_iter()));
        assert_eq!(t.columns.last().unwrap().name, "d");
    }
}
