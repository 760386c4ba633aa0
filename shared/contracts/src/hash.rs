//! The one stable hash behind deterministic ids and seeds (decision ids,
//! pending-status digests, sweep seeds, simulated uids). FNV-1a is stable
//! across builds and platforms, unlike `DefaultHasher`, so ids derived from it
//! survive restarts and upgrades.

/// Where an FNV-1a hash starts.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a continued over `bytes` from `hash`.
pub fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// FNV-1a of `bytes` from the start.
pub fn fnv1a_of(bytes: &[u8]) -> u64 {
    fnv1a(FNV_OFFSET, bytes)
}

/// FNV-1a of `parts`, each followed by a byte no UTF-8 text contains, which
/// keeps ("ab", "c") apart from ("a", "bc").
pub fn fnv1a_parts(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .fold(FNV_OFFSET, |hash, part| fnv1a(fnv1a(hash, part), &[0xff]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_fnv1a_values() {
        assert_eq!(fnv1a_of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_of(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn parts_are_kept_apart() {
        assert_ne!(fnv1a_parts(&[b"ab", b"c"]), fnv1a_parts(&[b"a", b"bc"]));
    }
}
