//! Fitting text to a terminal's width: names cut with an ellipsis, and the columns of a table kept in priority
//! order until the width runs out.

/// `s` in at most `width` columns: unchanged if it fits, otherwise cut with a trailing `…`.
pub fn truncate(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(width - 1).collect();
    out.push('…');
    out
}

/// A column of a table: its natural width and its priority (0 is kept first).
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub width: u16,
    pub priority: u8,
}

/// Which columns fit in `avail` columns, one space between neighbours: the columns of the lowest priorities
/// are taken first, in order, while they fit; a column that does not fit is left out, and so is every column
/// of a higher priority number. The result has one flag per column, in the table's order.
pub fn columns_that_fit(cols: &[Column], avail: u16) -> Vec<bool> {
    let mut order: Vec<usize> = (0..cols.len()).collect();
    order.sort_by_key(|&i| (cols[i].priority, i));
    let mut keep = vec![false; cols.len()];
    let mut used = 0u16;
    for i in order {
        let need = cols[i].width + u16::from(used > 0);
        if used.saturating_add(need) > avail {
            break;
        }
        used += need;
        keep[i] = true;
    }
    keep
}

/// The first of a row of labels (of these widths, side by side) to draw in `width` columns so that label
/// `shown` is whole on screen: 0 when it fits from the start, otherwise the fewest leading labels left out.
pub fn first_shown(widths: &[u16], shown: usize, width: u16) -> usize {
    let end: u32 = widths.iter().take(shown + 1).map(|w| u32::from(*w)).sum();
    let mut first = 0;
    let mut start = 0u32;
    while first < shown && end - start > u32::from(width) {
        start += u32::from(widths[first]);
        first += 1;
    }
    first
}

/// The widest a name column grows.
const NAME_MAX: usize = 40;

/// A table as lines, each at most `width` columns: the header first.
pub struct Lines {
    pub header: String,
    pub rows: Vec<String>,
}

/// Lays out cells in the columns that fit `width`: `cells[0]` is the name (left-aligned, cut to fit), the rest
/// numbers (right-aligned), each cut to its column. `cols` gives each column's natural width and priority; the
/// name takes `name_min` columns when deciding what fits, then what is left, up to its longest (at most
/// `NAME_MAX`).
pub fn lay_out(head: &[String], body: &[Vec<String>], cols: &[Column], width: u16, name_min: u16) -> Lines {
    let mut want = cols.to_vec();
    want[0].width = name_min;
    let keep = columns_that_fit(&want, width);
    let others: u16 = want
        .iter()
        .zip(&keep)
        .skip(1)
        .filter(|(_, k)| **k)
        .map(|(c, _)| c.width + 1)
        .sum();
    let longest = body
        .iter()
        .chain(std::iter::once(&head.to_vec()))
        .map(|r| r[0].chars().count())
        .max()
        .unwrap_or(0)
        .min(NAME_MAX);
    let name_w = usize::from(width.saturating_sub(others)).min(longest.max(usize::from(name_min)));
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if i == 0 {
                out.push_str(&format!("{:<name_w$}", truncate(cell, name_w)));
            } else {
                let w = usize::from(cols[i].width);
                out.push_str(&format!(" {:>w$}", truncate(cell, w)));
            }
        }
        truncate(out.trim_end(), usize::from(width))
    };
    Lines {
        header: line(head),
        rows: body.iter().map(|r| line(r)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_short_text_and_cuts_long_text_with_an_ellipsis() {
        assert_eq!(truncate("MPI_Allreduce", 20), "MPI_Allreduce");
        assert_eq!(truncate("MPI_Allreduce", 13), "MPI_Allreduce");
        assert_eq!(truncate("MPI_Allreduce", 8), "MPI_All…");
        assert_eq!(truncate("MPI_Allreduce", 8).chars().count(), 8);
        assert_eq!(truncate("héllo wörld", 5), "héll…");
        assert_eq!(truncate("abc", 0), "");
    }

    #[test]
    fn the_shown_label_is_kept_on_screen() {
        let widths = [10, 10, 10, 10];
        assert_eq!(first_shown(&widths, 0, 25), 0);
        assert_eq!(first_shown(&widths, 1, 25), 0);
        // The third ends at 30: the first label goes.
        assert_eq!(first_shown(&widths, 2, 25), 1);
        assert_eq!(first_shown(&widths, 3, 25), 2);
        // Too narrow even for the shown label alone: it is drawn first.
        assert_eq!(first_shown(&widths, 3, 5), 3);
    }

    #[test]
    fn columns_are_kept_in_priority_order_until_the_width_runs_out() {
        let cols = [
            Column {
                width: 20,
                priority: 0,
            },
            Column {
                width: 8,
                priority: 2,
            },
            Column {
                width: 8,
                priority: 1,
            },
            Column {
                width: 8,
                priority: 3,
            },
        ];
        assert_eq!(columns_that_fit(&cols, 200), vec![true; 4]);
        // 20 + 1 + 8 = 29: the name and the priority-1 column.
        assert_eq!(columns_that_fit(&cols, 29), vec![true, false, true, false]);
        assert_eq!(columns_that_fit(&cols, 38), vec![true, true, true, false]);
        // Once a column is dropped, every column of a lower priority goes too, even one that would fit.
        let cols = [
            Column {
                width: 10,
                priority: 0,
            },
            Column {
                width: 30,
                priority: 1,
            },
            Column {
                width: 2,
                priority: 2,
            },
        ];
        assert_eq!(columns_that_fit(&cols, 20), vec![true, false, false]);
        assert_eq!(columns_that_fit(&cols, 5), vec![false, false, false]);
    }
}
