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

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any two byte strings: no panic, and a match only for a full
        /// header carrying the query's ID.
        #[test]
        fn an_answer_matches_only_with_a_header_and_the_query_id(
            query in prop::collection::vec(any::<u8>(), 0..20),
            answer in prop::collection::vec(any::<u8>(), 0..20),
            same_id in any::<bool>(),
        ) {
            let mut answer = answer;
            if same_id && query.len() >= 2 && answer.len() >= 2 {
                answer[..2].copy_from_slice(&query[..2]);
            }
            let want = answer.len() >= 12 && query.len() >= 2 && answer[..2] == query[..2];
            prop_assert_eq!(answers(&query, &answer), want);
        }

        /// Near-valid: the answer is the query with its flags and body
        /// changed (always a match) and then its ID changed (never one).
        #[test]
        fn only_the_id_and_length_decide(
            query in prop::collection::vec(any::<u8>(), 12..64),
            body in prop::collection::vec(any::<u8>(), 10..64),
            flip in 1u16..=u16::MAX,
        ) {
            let mut answer = query[..2].to_vec();
            answer.extend_from_slice(&body);
            prop_assert!(answers(&query, &answer));
            let id = u16::from_be_bytes([answer[0], answer[1]]) ^ flip;
            answer[..2].copy_from_slice(&id.to_be_bytes());
            prop_assert!(!answers(&query, &answer));
        }
    }
}
