//! The body encoding: little-endian fixed-width integers, `u32`-length-prefixed strings and byte
//! strings, and [`List`], a counted run of items that is validated once and then iterated without
//! allocating.
//!
//! Every field type implements [`Field`]: `read` from a [`Reader`] (a bounds-checked cursor over a
//! frame body) and `write` into a `BytesMut`. Messages and list items are sequences of fields, so
//! their encodings are declared once, by the `wire_struct!` macro and the message table, and
//! nothing else in the crate parses bytes.
//!
//! The encoding is canonical: every value has exactly one encoding, and a body that decodes
//! re-encodes to the same bytes. The fuzz targets check this.

use std::fmt;
use std::marker::PhantomData;

use bytes::{BufMut, BytesMut};

use super::WireError;

/// A bounds-checked cursor over a frame body. Reads never go past the end; a short body is a
/// [`WireError::Truncated`].
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
    /// Set only for bytes that a previous pass has validated in full (see [`List`]): string
    /// fields then skip the UTF-8 check.
    trusted: bool,
}

impl<'a> Reader<'a> {
    /// A reader over untrusted bytes.
    pub fn new(body: &'a [u8]) -> Self {
        Reader {
            rest: body,
            trusted: false,
        }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// The next `len` bytes, borrowed.
    #[inline]
    pub fn take(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        if len > self.rest.len() {
            return Err(WireError::Truncated {
                needed: len,
                remaining: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(len);
        self.rest = tail;
        Ok(head)
    }

    /// The next `N` bytes as an array reference.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<&'a [u8; N], WireError> {
        match self.rest.split_first_chunk::<N>() {
            Some((head, tail)) => {
                self.rest = tail;
                Ok(head)
            }
            None => Err(WireError::Truncated {
                needed: N,
                remaining: self.rest.len(),
            }),
        }
    }

    /// A `u32` length prefix followed by that many bytes.
    #[inline]
    pub fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let len = u32::read(self)?;
        self.take(len as usize)
    }

    /// A `u32` length prefix followed by that many bytes of UTF-8.
    #[inline]
    pub fn str(&mut self) -> Result<&'a str, WireError> {
        let raw = self.bytes()?;
        if self.trusted {
            // SAFETY: `trusted` is set only by `List::iter` over bytes that `List::read` already
            // decoded in full with an untrusted reader, which checked this very slice with
            // `std::str::from_utf8`. `List`'s fields are private, so no other bytes get here.
            return Ok(unsafe { std::str::from_utf8_unchecked(raw) });
        }
        // Names and ids are short and ASCII: checking that first is several times cheaper than
        // the general validator's setup for a few bytes.
        if raw.iter().fold(0u8, |high, byte| high | byte) < 0x80 {
            // SAFETY: every byte is below 0x80, and ASCII is valid UTF-8.
            return Ok(unsafe { std::str::from_utf8_unchecked(raw) });
        }
        std::str::from_utf8(raw).map_err(|_| WireError::BadUtf8)
    }

    /// Succeeds only if every byte was read: a message ends where its frame ends.
    pub fn finish(self) -> Result<(), WireError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(WireError::TrailingBytes {
                count: self.rest.len(),
            })
        }
    }
}

/// A value with a wire encoding.
pub trait Field<'a>: Sized {
    /// The fewest bytes any encoding of this type takes. It bounds how many items a list count
    /// may claim before a single item is read, so a lying count cannot make a decoder allocate
    /// or loop beyond what the frame holds.
    const ENCODED_LEN_MIN: usize;
    /// Reads one value, borrowing strings and byte strings from the reader's buffer.
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError>;
    /// Appends the encoding of this value.
    fn write(&self, out: &mut BytesMut);
    /// Appends a random valid encoding (property tests build messages from these).
    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut);
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl<'a> Field<'a> for $t {
            const ENCODED_LEN_MIN: usize = std::mem::size_of::<$t>();
            #[inline]
            fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
                reader.array().map(|raw| <$t>::from_le_bytes(*raw))
            }
            #[inline]
            fn write(&self, out: &mut BytesMut) {
                out.put_slice(&self.to_le_bytes());
            }
            #[cfg(test)]
            fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
                (rng.next_u64() as $t).write(out);
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64, i32);

impl<'a> Field<'a> for &'a str {
    const ENCODED_LEN_MIN: usize = 4;
    #[inline]
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        reader.str()
    }
    #[inline]
    fn write(&self, out: &mut BytesMut) {
        self.as_bytes().write(out);
    }
    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
        rng.text().as_str().write(out);
    }
}

impl<'a> Field<'a> for &'a [u8] {
    const ENCODED_LEN_MIN: usize = 4;
    #[inline]
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        reader.bytes()
    }
    /// A slice longer than `u32::MAX` gets a wrong length prefix, but such a body is larger
    /// than any frame may be, so the frame encoder refuses it before it is sent.
    #[inline]
    fn write(&self, out: &mut BytesMut) {
        out.put_u32_le(self.len() as u32);
        // An empty one (a task's empty payload or result) skips the copy's call.
        if !self.is_empty() {
            out.put_slice(self);
        }
    }
    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
        rng.blob().as_slice().write(out);
    }
}

impl<'a, const N: usize> Field<'a> for [u8; N] {
    const ENCODED_LEN_MIN: usize = N;
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        reader.array().copied()
    }
    fn write(&self, out: &mut BytesMut) {
        out.put_slice(self);
    }
    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
        (0..N).for_each(|_| out.put_u8(rng.next_u64() as u8));
    }
}

/// `Option<i32>` (an exit code that may be absent): a tag byte, 0 or 1, then the value if 1.
impl<'a> Field<'a> for Option<i32> {
    const ENCODED_LEN_MIN: usize = 1;
    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        match u8::read(reader)? {
            0 => Ok(None),
            1 => i32::read(reader).map(Some),
            tag => Err(WireError::InvalidValue {
                field: "option tag",
                value: tag.into(),
            }),
        }
    }
    fn write(&self, out: &mut BytesMut) {
        match self {
            None => out.put_u8(0),
            Some(value) => {
                out.put_u8(1);
                value.write(out);
            }
        }
    }
    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
        let value = (rng.next_u64() % 2 == 0).then_some(rng.next_u64() as i32);
        value.write(out);
    }
}

/// The byte a `wire_enum!` value is encoded as.
pub trait WireByte: Copy {
    /// Its byte on the wire.
    fn wire_byte(self) -> u8;
}

/// The hottest items (a launch, a status update) read and written with their fixed-size head
/// (ids, counts, the trailing bytes' length) at once: one bounds check to read it, one append
/// to write it, where a field at a time checks and appends once per field (about 30
/// instructions an item on the driver's per-task path). Their encoding is a
/// [`wire_struct!`]'s, field by field in order; the offsets are constants, so the range checks
/// below fold away.
pub(crate) mod head {
    use bytes::{BufMut, BytesMut};

    /// The `W` bytes at `at` of head `h`, for `u64::from_le_bytes` and the like.
    #[inline(always)]
    pub fn bytes_at<const N: usize, const W: usize>(h: &[u8; N], at: usize) -> [u8; W] {
        debug_assert!(at + W <= N, "{W} bytes at {at} of a {N}-byte head");
        let mut raw = [0; W];
        if let Some(src) = h.get(at..at + W) {
            raw.copy_from_slice(src);
        }
        raw
    }

    /// Writes `bytes` at `at` of head `h`.
    #[inline(always)]
    pub fn put<const N: usize>(h: &mut [u8; N], at: usize, bytes: &[u8]) {
        debug_assert!(
            at + bytes.len() <= N,
            "{} bytes at {at} of a {N}-byte head",
            bytes.len()
        );
        if let Some(dst) = h.get_mut(at..at + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
    }

    /// The `u32` length prefix of `tail`, as `&[u8]`'s [`Field`](super::Field) writes it.
    #[inline(always)]
    pub fn len_u32(tail: &[u8]) -> [u8; 4] {
        (tail.len() as u32).to_le_bytes()
    }

    /// Appends head `h`, then `tail` (whose length the head ends with).
    #[inline(always)]
    pub fn finish(out: &mut BytesMut, h: &[u8], tail: &[u8]) {
        out.put_slice(h);
        // An empty tail (a task's empty payload or result) skips the copy's call.
        if !tail.is_empty() {
            out.put_slice(tail);
        }
    }
}

/// Declares a `u8`-encoded enum whose out-of-range values are a [`WireError::InvalidValue`].
///
/// `wire_enum! { impl Field for Name { Variant = 1, ... } }` gives an enum declared elsewhere
/// (the engine's vocabulary, which the wire carries as it is) the same encoding.
macro_rules! wire_enum {
    (impl Field for $name:ident { $($variant:ident = $value:literal),* $(,)? }) => {
        impl $crate::wire::codec::WireByte for $name {
            #[inline]
            fn wire_byte(self) -> u8 {
                match self { $($name::$variant => $value),* }
            }
        }

        impl<'a> $crate::wire::codec::Field<'a> for $name {
            const ENCODED_LEN_MIN: usize = 1;
            fn read(reader: &mut $crate::wire::codec::Reader<'a>) -> Result<Self, $crate::wire::WireError> {
                match <u8 as $crate::wire::codec::Field>::read(reader)? {
                    $($value => Ok($name::$variant),)*
                    value => Err($crate::wire::WireError::InvalidValue {
                        field: stringify!($name),
                        value: value.into(),
                    }),
                }
            }
            fn write(&self, out: &mut bytes::BytesMut) {
                bytes::BufMut::put_u8(out, $crate::wire::codec::WireByte::wire_byte(*self));
            }
            #[cfg(test)]
            fn sample(rng: &mut $crate::wire::sample::Rng, out: &mut bytes::BytesMut) {
                let all: &[u8] = &[$($value),*];
                bytes::BufMut::put_u8(out, all[rng.below(all.len())]);
            }
        }
    };
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $($(#[$vmeta])* $variant = $value),* }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The upper-case name, as logs and `flint status` print it.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => stringify!($variant)),* }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        $crate::wire::codec::wire_enum! { impl Field for $name { $($variant = $value),* } }
    };
}
pub(crate) use wire_enum;

/// Declares a struct of fields that is itself a [`Field`]: its encoding is its fields' in order.
macro_rules! wire_struct {
    ($(#[$meta:meta])* pub struct $name:ident<'a> { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<'a> { $($(#[$fmeta])* pub $field: $ty),* }

        impl<'a> $crate::wire::codec::Field<'a> for $name<'a> {
            const ENCODED_LEN_MIN: usize =
                0 $(+ <$ty as $crate::wire::codec::Field<'a>>::ENCODED_LEN_MIN)*;
            #[inline]
            fn read(reader: &mut $crate::wire::codec::Reader<'a>) -> Result<Self, $crate::wire::WireError> {
                Ok($name { $($field: $crate::wire::codec::Field::read(reader)?),* })
            }
            #[inline]
            fn write(&self, out: &mut bytes::BytesMut) {
                $($crate::wire::codec::Field::write(&self.$field, out);)*
            }
            #[cfg(test)]
            fn sample(rng: &mut $crate::wire::sample::Rng, out: &mut bytes::BytesMut) {
                $(<$ty as $crate::wire::codec::Field<'a>>::sample(rng, out);)*
            }
        }
    };
}
pub(crate) use wire_struct;

/// A counted run of items: a `u32` count, then the items back to back.
///
/// A decoded list is a view over the frame body. Decoding walks it once to validate every item
/// (so a bad item fails the whole message before anything acts on it); iterating walks it again,
/// trusting what was validated, and allocates nothing. A list to be sent wraps a slice of items.
pub struct List<'a, T> {
    repr: Repr<'a, T>,
}

enum Repr<'a, T> {
    /// Validated bytes received from a peer.
    Encoded { count: u32, items: &'a [u8] },
    /// Items to be encoded.
    Items(&'a [T]),
}

impl<'a, T> Clone for List<'a, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<'a, T> Copy for List<'a, T> {}
impl<'a, T> Clone for Repr<'a, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<'a, T> Copy for Repr<'a, T> {}

impl<'a, T: Field<'a> + Copy> List<'a, T> {
    /// A list that encodes `items`.
    pub fn from_items(items: &'a [T]) -> Self {
        List {
            repr: Repr::Items(items),
        }
    }

    /// The empty list.
    pub fn empty() -> Self {
        List {
            repr: Repr::Items(&[]),
        }
    }

    /// How many items.
    pub fn len(&self) -> usize {
        match self.repr {
            Repr::Encoded { count, .. } => count as usize,
            Repr::Items(items) => items.len(),
        }
    }

    /// True if there are no items.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The items, in order.
    pub fn iter(&self) -> ListIter<'a, T> {
        let repr = match self.repr {
            Repr::Encoded { count, items } => IterRepr::Encoded {
                left: count,
                reader: Reader {
                    rest: items,
                    trusted: true,
                },
            },
            Repr::Items(items) => IterRepr::Items(items.iter()),
        };
        ListIter {
            repr,
            item: PhantomData,
        }
    }
}

impl<'a, T: Field<'a> + Copy> Field<'a> for List<'a, T> {
    const ENCODED_LEN_MIN: usize = 4;

    fn read(reader: &mut Reader<'a>) -> Result<Self, WireError> {
        let count = u32::read(reader)?;
        let remaining = reader.remaining();
        // An item takes at least one byte, even a zero-sized one, so a count is bounded by the
        // bytes left; this also keeps a loop over a lying count short.
        if (count as usize).saturating_mul(T::ENCODED_LEN_MIN.max(1)) > remaining {
            return Err(WireError::CountTooLarge { count, remaining });
        }
        let start = reader.rest;
        for _ in 0..count {
            T::read(reader)?;
        }
        let used = remaining - reader.remaining();
        let items = start.get(..used).ok_or(WireError::Truncated {
            needed: used,
            remaining,
        })?;
        Ok(List {
            repr: Repr::Encoded { count, items },
        })
    }

    fn write(&self, out: &mut BytesMut) {
        out.put_u32_le(self.len() as u32);
        match self.repr {
            Repr::Encoded { items, .. } => out.put_slice(items),
            Repr::Items(items) => items.iter().for_each(|item| item.write(out)),
        }
    }

    #[cfg(test)]
    fn sample(rng: &mut super::sample::Rng, out: &mut BytesMut) {
        let count = rng.below(5);
        out.put_u32_le(count as u32);
        (0..count).for_each(|_| T::sample(rng, out));
    }
}

impl<'a, T: Field<'a> + Copy + PartialEq> PartialEq for List<'a, T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}
impl<'a, T: Field<'a> + Copy + Eq> Eq for List<'a, T> {}

impl<'a, T: Field<'a> + Copy + fmt::Debug> fmt::Debug for List<'a, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a, T: Field<'a> + Copy> IntoIterator for List<'a, T> {
    type Item = T;
    type IntoIter = ListIter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Iterator over a [`List`].
pub struct ListIter<'a, T> {
    repr: IterRepr<'a, T>,
    item: PhantomData<T>,
}

enum IterRepr<'a, T> {
    Encoded { left: u32, reader: Reader<'a> },
    Items(std::slice::Iter<'a, T>),
}

impl<'a, T: Field<'a> + Copy> Iterator for ListIter<'a, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        match &mut self.repr {
            IterRepr::Encoded { left, reader } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                // Validated when the list was decoded, so this cannot fail; if it somehow did,
                // the iteration ends rather than panics.
                T::read(reader).ok()
            }
            IterRepr::Items(items) => items.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = match &self.repr {
            IterRepr::Encoded { left, .. } => *left as usize,
            IterRepr::Items(items) => items.len(),
        };
        (left, Some(left))
    }
}

impl<'a, T: Field<'a> + Copy> ExactSizeIterator for ListIter<'a, T> {}
