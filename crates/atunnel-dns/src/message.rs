//! The only two facts about a DNS message the relay relies on: its minimum
//! length and its ID. Nothing else in a message is ever read.

/// Length of the fixed DNS header; anything shorter is not a DNS message and
/// is not worth a trip to the resolvers.
pub(crate) const HEADER_LEN: usize = 12;

/// Whether `answer` can be the answer to `query`: long enough to be a DNS
/// message and carrying the same 2-byte ID.
///
/// The ID check is what stops a stray or spoofed datagram (or a late answer
/// to an earlier query) from being handed to the client as this answer.
pub(crate) fn answers(query: &[u8], answer: &[u8]) -> bool {
    answer.len() >= HEADER_LEN && query.len() >= 2 && answer[..2] == query[..2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_same_id_and_full_header_match() {
        let q = [0xab, 0xcd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut a = q.to_vec();
        a[2] |= 0x80;
        assert!(answers(&q, &a));
        a[1] ^= 1;
        assert!(!answers(&q, &a));
        assert!(!answers(&q, &q[..11]));
    }
}
