//! FNV-1a, 64 bits: a hash that is the same in every build and on every machine (std's hasher
//! promises neither). compactd stores such hashes (a proxied message's fingerprint) and matches
//! later requests against them, so the bytes hashed and the order they come in are a format.
//!
//! [`Fnv`] is fed piece by piece, and is an [`std::io::Write`], so a value can be serialized
//! straight into it instead of into a buffer that is then hashed.

/// An FNV-1a hash being computed.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Hashes `bytes` after everything fed so far.
    pub fn feed(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn finish(self) -> u64 {
        self.0
    }

    /// The hash of `bytes` alone.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut hash = Fnv::default();
        hash.feed(bytes);
        hash.finish()
    }
}

impl std::io::Write for Fnv {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.feed(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_pieces_hash_as_the_whole() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(Fnv::of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(Fnv::of(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(Fnv::of(b"foobar"), 0x8594_4171_f739_67e8);
        let mut pieces = Fnv::default();
        pieces.feed(b"foo");
        pieces.feed(b"");
        pieces.feed(b"bar");
        assert_eq!(pieces.finish(), Fnv::of(b"foobar"));
    }
}
