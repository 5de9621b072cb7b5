//! Helpers shared by Sendium's fuzz targets (`fuzz_targets/`), and the seed corpus.
//!
//! The targets read their input with [`Input`], which hands out fuzzer-chosen numbers
//! and byte strings and never fails: an exhausted input reads as zeros and empty
//! slices, so every byte string is a valid input for every target.
#![forbid(unsafe_code)]

pub mod seeds;

/// A cursor over the fuzzer's input.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// The next byte (0 once the input is exhausted).
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, big endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    /// The next four bytes, big endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// The next eight bytes, big endian.
    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { usize::from(self.byte()) % n }
    }

    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A byte string whose length is the next byte.
    pub fn short_bytes(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte());
        self.take(n)
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}
