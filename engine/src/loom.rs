//! A facade over the synchronisation primitives the runtime's lock-free code uses.
//!
//! Under `--cfg loom` everything here comes from [loom](https://docs.rs/loom), so the model
//! checker can explore every interleaving of the inbox and the pool's park/unpark protocol;
//! otherwise it is `std`. Only code that must be model-checked goes through this module.
#![allow(unused_imports, dead_code)]

#[cfg(loom)]
pub(crate) mod sync {
    pub(crate) use loom::sync::atomic;
    pub(crate) use loom::sync::{Arc, Condvar, Mutex};
}

#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) use std::sync::atomic;
    pub(crate) use std::sync::{Arc, Condvar, Mutex};
}

#[cfg(loom)]
pub(crate) mod thread {
    pub(crate) use loom::thread::{current, park, spawn, yield_now, Thread};
}

#[cfg(not(loom))]
pub(crate) mod thread {
    pub(crate) use std::thread::{current, park, spawn, yield_now, Thread};
}

/// An `UnsafeCell` with loom's closure-based API, backed by `std` outside loom.
#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// An `UnsafeCell` with loom's closure-based API, backed by `std` outside loom.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
