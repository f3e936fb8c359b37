//! The engine lock, as a type. One mutex serializes the engine: the executable cache (and the
//! rest of dispatch's state) lives inside it, and every storage cell's buffer slot is read and
//! written only while it is held. Locking it yields a `Locked` guard that lends out `Held`, a
//! zero-sized token that cannot be made any other way; `Guarded<T>` (a cell's slot) opens only
//! with a borrow of that token: `&Held` to read, `&mut Held` to write. So touching a cell
//! without the lock does not compile, and the borrow checker keeps a read from living across
//! a write. Nothing here costs anything at run time: the token is a ZST inside the mutex.
//!
//! Imports nothing of the engine.
use std::cell::UnsafeCell;
use std::sync::{Mutex, MutexGuard};

/// Proof that the engine lock is held, lent out by `Locked` for as long as the lock is.
/// Not `Clone`, `Copy` or `Default`, and its field is private: the one in the engine lock is
/// the only one there is.
///
/// A cell cannot be read without it:
/// ```compile_fail
/// fn read(c: &engine::cell::Cell) -> bool {
///     c.get().is_some()
/// }
/// ```
/// nor the token made:
/// ```compile_fail
/// fn read(c: &engine::cell::Cell) -> bool {
///     c.get(&engine::lock::Held(())).is_some()
/// }
/// ```
/// and a read does not live across a write:
/// ```compile_fail
/// fn swap(c: &engine::cell::Cell, held: &mut engine::lock::Held) {
///     let old = c.get(held);
///     c.set(held, None);
///     drop(old);
/// }
/// ```
/// while this compiles:
/// ```
/// fn swap(c: &engine::cell::Cell, held: &mut engine::lock::Held) {
///     let old = c.get(held).clone();
///     c.set(held, None);
///     drop(old);
/// }
/// ```
pub struct Held(());

/// What the mutex holds: the token and the data it guards, so that a caller can borrow both
/// at once (`Locked::split`).
struct Inner<T> {
    held: Held,
    data: T,
}

/// The engine lock around `T` (dispatch's state).
pub struct EngineLock<T> {
    m: Mutex<Inner<T>>,
}

/// The engine lock, held.
pub struct Locked<'a, T> {
    g: MutexGuard<'a, Inner<T>>,
}

impl<T> EngineLock<T> {
    /// # Safety
    /// At most one `EngineLock` may exist in the process: the `Held` of each opens every
    /// `Guarded`, so two locks would let two threads into the same cell at once.
    pub const unsafe fn new(data: T) -> EngineLock<T> {
        EngineLock { m: Mutex::new(Inner { held: Held(()), data }) }
    }

    /// Waits for the lock. A panic while it was held does not poison it: the engine's state
    /// stays consistent between any two of its statements that a panic could separate.
    pub fn lock(&self) -> Locked<'_, T> {
        Locked { g: self.m.lock().unwrap_or_else(|p| p.into_inner()) }
    }
}

impl<T> Locked<'_, T> {
    /// The guarded data and the token, borrowed together.
    pub fn split(&mut self) -> (&mut T, &mut Held) {
        let inner = &mut *self.g;
        (&mut inner.data, &mut inner.held)
    }

    pub fn data(&mut self) -> &mut T {
        &mut self.g.data
    }

    pub fn held(&mut self) -> &mut Held {
        &mut self.g.held
    }
}

/// A value read and written only under the engine lock.
pub struct Guarded<T> {
    v: UnsafeCell<T>,
}

// SAFETY: every access to the value goes through a borrow of the one `Held` (or through
// `&mut self`), so threads never touch it at the same time.
unsafe impl<T: Send> Send for Guarded<T> {}
unsafe impl<T: Send + Sync> Sync for Guarded<T> {}

impl<T> Guarded<T> {
    pub const fn new(v: T) -> Guarded<T> {
        Guarded { v: UnsafeCell::new(v) }
    }

    /// Reads the value; the reference lives no longer than the borrow of the token.
    pub fn get<'a>(&'a self, _held: &'a Held) -> &'a T {
        // SAFETY: `_held` proves the engine lock is held, and while it is borrowed shared no
        // `&mut Held` exists, so no `set` or `get_mut` runs until this reference is gone.
        unsafe { &*self.v.get() }
    }

    /// The value, to change in place; exclusive for as long as the token is borrowed.
    pub fn get_mut<'a>(&'a self, _held: &'a mut Held) -> &'a mut T {
        // SAFETY: `_held` is the engine lock's token borrowed exclusively: no other reference
        // into any `Guarded` (all need a borrow of it) lives while this one does.
        unsafe { &mut *self.v.get() }
    }

    /// Replaces the value, dropping the old one.
    pub fn set(&self, held: &mut Held, v: T) {
        *self.get_mut(held) = v;
    }
}
