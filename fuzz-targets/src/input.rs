//! Reading a fuzzer's bytes as a sequence of choices: small numbers, lengths and byte strings. Every read
//! succeeds (an exhausted input reads as zeros and empty strings), so any byte string is a valid input.

/// A cursor over a fuzzer's input.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte (0 once the input is exhausted).
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A little-endian number of `n` bytes (at most 8).
    pub fn uint(&mut self, n: usize) -> u64 {
        (0..n.min(8)).fold(0u64, |v, i| v | (u64::from(self.byte()) << (8 * i)))
    }

    pub fn u32(&mut self) -> u32 {
        self.uint(4) as u32
    }

    pub fn u64(&mut self) -> u64 {
        self.uint(8)
    }

    /// A number below `n` (n > 0) from one byte.
    pub fn below(&mut self, n: u8) -> u8 {
        self.byte() % n.max(1)
    }

    /// A byte string of a length read first (two bytes), at most `max` and what is left.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = (self.uint(2) as usize) % (max + 1);
        let len = len.min(self.data.len());
        let (head, rest) = self.data.split_at(len);
        self.data = rest;
        head
    }

    /// A string: a byte string read as UTF-8, lossily.
    pub fn string(&mut self, max: usize) -> String {
        String::from_utf8_lossy(self.bytes(max)).into_owned()
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// Builds inputs for [`Input`]: what the seed corpora are written with.
#[derive(Debug, Default, Clone)]
pub struct Builder {
    pub out: Vec<u8>,
}

impl Builder {
    pub fn byte(&mut self, b: u8) -> &mut Self {
        self.out.push(b);
        self
    }

    pub fn uint(&mut self, v: u64, n: usize) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes()[..n.min(8)]);
        self
    }

    /// A byte string as [`Input::bytes`] reads it (at most 65,535 bytes).
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let len = b.len().min(u16::MAX as usize);
        self.uint(len as u64, 2);
        self.out.extend_from_slice(&b[..len]);
        self
    }

    pub fn rest(&mut self, b: &[u8]) -> &mut Self {
        self.out.extend_from_slice(b);
        self
    }

    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }
}
