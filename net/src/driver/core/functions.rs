//! Which function each index names on one executor connection (a lane): a launch carries the
//! index (4 bytes; the executor compares no name), and a `DefineFunction` frame goes ahead of
//! the first launch that uses a new one. At most [`FUNCTIONS_PER_CONNECTION`] indexes; past
//! them a new name takes over the index defined longest ago (the launches already batched
//! under its old name are encoded first, see `DriverCore::launch`).

use std::sync::Arc;

use crate::wire::limits::FUNCTIONS_PER_CONNECTION;

/// The functions defined on one connection, by index.
#[derive(Debug, Default)]
pub(super) struct Defined {
    names: Vec<Arc<str>>,
    /// The index asked for last: a job's launches all name the same function.
    last: u32,
    /// The index a new name takes once all are defined.
    next_out: u32,
}

/// An index for a function (see [`Defined::index_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Index {
    /// Defined already on this connection.
    Known(u32),
    /// Defined now, in the free index or in `taken`'s place: send `DefineFunction` first.
    New { index: u32, taken: bool },
}

impl Defined {
    /// The index `function` has on this connection, defining it if it has none.
    #[inline]
    pub fn index_of(&mut self, function: &Arc<str>) -> Index {
        match self.names.get(self.last as usize) {
            Some(name) if Arc::ptr_eq(name, function) => Index::Known(self.last),
            _ => self.find_or_define(function),
        }
    }

    /// The name of `index`, once defined.
    #[cfg(test)]
    pub fn name(&self, index: u32) -> Option<&str> {
        self.names.get(index as usize).map(|n| &**n)
    }

    #[inline(never)]
    fn find_or_define(&mut self, function: &Arc<str>) -> Index {
        let found = (self.names.iter()).position(|n| Arc::ptr_eq(n, function) || **n == **function);
        if let Some(index) = found {
            // The caller's `Arc` from now on: its next launches pass the pointer check.
            self.names[index] = function.clone();
            self.last = index as u32;
            return Index::Known(self.last);
        }
        let (index, taken) = match u32::try_from(self.names.len()) {
            Ok(len) if len < FUNCTIONS_PER_CONNECTION => {
                self.names.push(function.clone());
                (len, false)
            }
            _ => {
                let index = self.next_out;
                self.next_out = (index + 1) % FUNCTIONS_PER_CONNECTION;
                self.names[index as usize] = function.clone();
                (index, true)
            }
        };
        self.last = index;
        debug_assert!(self.names.len() <= FUNCTIONS_PER_CONNECTION as usize);
        Index::New { index, taken }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_gets_one_index_until_all_are_taken_then_the_oldest_is_replaced() {
        let mut d = Defined::default();
        let hash: Arc<str> = Arc::from("hash");
        let noop: Arc<str> = Arc::from("noop");
        assert_eq!(
            d.index_of(&hash),
            Index::New {
                index: 0,
                taken: false
            }
        );
        assert_eq!(d.index_of(&hash), Index::Known(0));
        assert_eq!(
            d.index_of(&noop),
            Index::New {
                index: 1,
                taken: false
            }
        );
        // Another `Arc` of a name defined: the same index, and no new definition.
        assert_eq!(d.index_of(&Arc::from("hash")), Index::Known(0));
        assert_eq!(d.index_of(&noop), Index::Known(1));
        for i in 2..FUNCTIONS_PER_CONNECTION {
            let name: Arc<str> = Arc::from(format!("f{i}"));
            assert_eq!(
                d.index_of(&name),
                Index::New {
                    index: i,
                    taken: false
                }
            );
        }
        // Full: new names take over the oldest indexes in turn.
        for i in 0..3 {
            let name: Arc<str> = Arc::from(format!("g{i}"));
            assert_eq!(
                d.index_of(&name),
                Index::New {
                    index: i,
                    taken: true
                }
            );
            assert_eq!(d.name(i), Some(&*name));
        }
        assert_eq!(
            d.index_of(&Arc::from("hash")),
            Index::New {
                index: 3,
                taken: true
            }
        );
        assert_eq!(d.name(4), Some("f4"));
    }
}
