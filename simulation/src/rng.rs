//! The simulation's own random numbers: xoshiro256** seeded through SplitMix64.
//!
//! Owns: every choice the simulation makes (fault schedule, workload, RPC faults). Written here
//! rather than taken from a crate so that a seed replays the same run whatever version of `rand`
//! the lock file holds. Must never: be seeded from anything but the run's seed (no clock, no OS
//! entropy).

/// A small, fast, seedable generator. Not cryptographic; not `Clone` on purpose, so two users
/// never share a sequence by accident (derive independent ones with [`SimRng::fork`]).
#[derive(Debug)]
pub struct SimRng {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over a label, to derive a sub-seed from a name.
fn label_hash(label: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

impl SimRng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm)];
        SimRng { s }
    }

    /// An independent generator for the part of the run named `label` and numbered `n`: the
    /// same (seed, label, n) always gives the same sequence, however much the parent was used.
    pub fn derive(seed: u64, label: &str, n: u64) -> Self {
        let mut sm = seed ^ label_hash(label).rotate_left(17) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        SimRng::new(splitmix64(&mut sm))
    }

    /// A child generator drawn from this one.
    pub fn fork(&mut self) -> SimRng {
        SimRng::new(self.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A number in `0..n` (`n` > 0), without modulo bias worth caring about at these sizes.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "between({lo}, {hi})");
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::SimRng;

    #[test]
    fn same_seed_same_sequence_and_derive_is_independent_of_use() {
        let a: Vec<u64> = {
            let mut r = SimRng::new(7);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SimRng::new(7);
            (0..5).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(SimRng::new(8).next_u64(), a[0]);
        assert_eq!(SimRng::derive(7, "pub", 1).next_u64(), SimRng::derive(7, "pub", 1).next_u64());
        assert_ne!(SimRng::derive(7, "pub", 1).next_u64(), SimRng::derive(7, "pub", 2).next_u64());
        assert_ne!(SimRng::derive(7, "pub", 1).next_u64(), SimRng::derive(7, "sub", 1).next_u64());
    }

    #[test]
    fn ranges_are_respected() {
        let mut r = SimRng::new(1);
        for _ in 0..10_000 {
            let x = r.between(3, 9);
            assert!((3..=9).contains(&x));
            assert!(r.below(1) == 0);
        }
        let mut v: Vec<u32> = (0..20).collect();
        r.shuffle(&mut v);
        v.sort();
        assert_eq!(v, (0..20).collect::<Vec<_>>());
    }
}
