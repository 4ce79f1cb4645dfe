//! A markdown table for report.md: a header, then rows of cells, each
//! cell anything that displays. Written by hand: the tables are a few
//! lines of `|`, which no crate would make shorter.

use std::fmt::{Display, Write as _};

/// A table being written: its header and separator are there from the
/// start; each [`Table::row`] adds a line.
pub struct Table(String);

impl Table {
    pub fn new<S: AsRef<str>>(header: &[S]) -> Self {
        let mut t = Table(String::new());
        t.line(header.iter().map(AsRef::as_ref));
        t.0.push('|');
        t.0.push_str(&"---|".repeat(header.len()));
        t.0.push('\n');
        t
    }

    pub fn row<D: Display>(&mut self, cells: impl IntoIterator<Item = D>) -> &mut Self {
        self.line(cells);
        self
    }

    fn line<D: Display>(&mut self, cells: impl IntoIterator<Item = D>) {
        self.0.push('|');
        for cell in cells {
            let _ = write!(self.0, " {cell} |");
        }
        self.0.push('\n');
    }

    /// The table and the blank line that ends it.
    pub fn end(mut self) -> String {
        self.0.push('\n');
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_its_header_a_separator_and_a_line_per_row() {
        let mut t = Table::new(&["a", "b"]);
        t.row([1, 2]).row(["x", "y"]);
        assert_eq!(t.end(), "| a | b |\n|---|---|\n| 1 | 2 |\n| x | y |\n\n");
    }
}
