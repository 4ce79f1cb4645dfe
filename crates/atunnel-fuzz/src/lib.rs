//! Development only: a few random edits to valid input. The parsers'
//! property tests (CONNECT heads, actor identities, cgroup and proc files)
//! start from something valid and edit it, which reaches the corners of a
//! grammar that random bytes rarely do. proptest shrinks and replays; it
//! has no strategy that edits a sequence, so this is the one copy of it.

use std::fmt::Debug;
use std::ops::Range;

use proptest::prelude::*;

/// One edit of a sequence. Positions are taken modulo its length at the
/// time, so any edit applies to any sequence.
#[derive(Clone, Debug)]
pub enum Edit<T> {
    Replace(usize, T),
    Insert(usize, T),
    Delete(usize),
    Truncate(usize),
}

/// How often each kind of edit is drawn, relative to the others.
#[derive(Clone, Copy, Debug)]
pub struct Weights {
    pub replace: u32,
    pub insert: u32,
    pub delete: u32,
    pub truncate: u32,
}

impl Weights {
    pub const EVEN: Weights = Weights {
        replace: 1,
        insert: 1,
        delete: 1,
        truncate: 1,
    };
}

/// `count` edits whose new elements come from `item`.
pub fn edits<T, S>(
    item: S,
    weights: Weights,
    count: Range<usize>,
) -> impl Strategy<Value = Vec<Edit<T>>>
where
    T: Clone + Debug + 'static,
    S: Strategy<Value = T> + Clone + 'static,
{
    let edit = prop_oneof![
        weights.replace => (any::<usize>(), item.clone()).prop_map(|(i, x)| Edit::Replace(i, x)),
        weights.insert => (any::<usize>(), item).prop_map(|(i, x)| Edit::Insert(i, x)),
        weights.delete => any::<usize>().prop_map(Edit::Delete),
        weights.truncate => any::<usize>().prop_map(Edit::Truncate),
    ];
    prop::collection::vec(edit, count)
}

/// `items` with `edits` applied in order.
pub fn apply<T: Clone>(mut items: Vec<T>, edits: &[Edit<T>]) -> Vec<T> {
    for edit in edits {
        let len = items.len();
        match edit {
            Edit::Replace(i, x) if len > 0 => items[i % len] = x.clone(),
            Edit::Insert(i, x) => items.insert(i % (len + 1), x.clone()),
            Edit::Delete(i) if len > 0 => {
                items.remove(i % len);
            }
            Edit::Truncate(i) => items.truncate(i % (len + 1)),
            _ => {}
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_edit_lands_where_its_position_wraps_to() {
        let abc = b"abc".to_vec();
        assert_eq!(apply(abc.clone(), &[Edit::Replace(4, b'x')]), b"axc");
        assert_eq!(apply(abc.clone(), &[Edit::Insert(3, b'x')]), b"abcx");
        assert_eq!(apply(abc.clone(), &[Edit::Delete(5)]), b"ab");
        assert_eq!(apply(abc.clone(), &[Edit::Truncate(1)]), b"a");
        // Edits of an empty sequence that need an element are skipped.
        assert_eq!(
            apply(Vec::<u8>::new(), &[Edit::Replace(0, 1), Edit::Delete(0)]),
            b""
        );
    }
}
