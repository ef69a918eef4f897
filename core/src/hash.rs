//! FNV-1a, 64 bits: a digest that is the same on every build, platform and run (std's
//! hashers are seeded per process), for fingerprints that travel between agents.

/// An FNV-1a hasher over the values written to it, in order.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }

    /// A string and a separator, so ("ab", "c") and ("a", "bc") differ.
    pub fn str(&mut self, text: &str) -> &mut Self {
        self.bytes(text.as_bytes()).bytes(&[0xff])
    }

    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes(&value.to_le_bytes())
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_value_and_separated_strings() {
        // FNV-1a 64 of "a" (the published test vector).
        assert_eq!(Fnv1a::default().bytes(b"a").finish(), 0xaf63_dc4c_8601_ec8c);
        let ab_c = Fnv1a::default().str("ab").str("c").finish();
        let a_bc = Fnv1a::default().str("a").str("bc").finish();
        assert_ne!(ab_c, a_bc);
    }
}
