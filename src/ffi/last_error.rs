//! The calling thread's message for its last failed drpttracer call.
//!
//! Kept in a fixed buffer in thread-local storage that is const-initialised and has no
//! destructor, so touching it registers nothing with the C library: a `thread_local!` of a
//! type with `Drop` registers through `__cxa_thread_atexit_impl`, which dereferences NULL
//! under DynamoRIO's private loader (its clients load this library). The buffer lives as
//! long as the thread and is never freed, so no allocation and no per-thread table to
//! clean up; messages longer than the buffer are cut at a character boundary with "...".

use std::cell::RefCell;
use std::ffi::c_char;

/// Bytes kept per thread, the terminating NUL included.
const CAPACITY: usize = 1024;

#[repr(C)]
struct Text {
    /// NUL-terminated; `buf[0] == 0` is the empty message.
    buf: [u8; CAPACITY],
}

// The point of this module: nothing here may need a TLS destructor.
const _: () = assert!(!std::mem::needs_drop::<RefCell<Text>>());

thread_local! {
    static LAST_ERROR: RefCell<Text> = const { RefCell::new(Text { buf: [0; CAPACITY] }) };
}

/// Sets the message ("" clears it). NUL bytes inside `msg` become spaces.
pub fn set(msg: &str) {
    let _ = LAST_ERROR.try_with(|t| {
        let Ok(mut t) = t.try_borrow_mut() else {
            return;
        };
        let bytes = fit(msg);
        let cut = bytes.len() < msg.len();
        let ellipsis: &[u8] = if cut { b"..." } else { b"" };
        let n = bytes.len();
        for (dst, &b) in t.buf.iter_mut().zip(bytes.iter().chain(ellipsis)) {
            *dst = if b == 0 { b' ' } else { b };
        }
        t.buf[n + ellipsis.len()] = 0;
    });
}

/// The longest prefix of `msg` that fits with "..." and the NUL, cut at a char boundary.
fn fit(msg: &str) -> &[u8] {
    if msg.len() < CAPACITY {
        return msg.as_bytes();
    }
    let mut end = CAPACITY - 4;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    &msg.as_bytes()[..end]
}

/// The message as a C string, valid until this thread's next call of [`set`].
pub fn as_ptr() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    LAST_ERROR
        .try_with(|t| t.as_ptr() as *const Text as *const c_char)
        .unwrap_or(EMPTY.as_ptr() as *const c_char)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn text() -> String {
        // SAFETY: as_ptr returns a NUL-terminated buffer owned by this thread.
        unsafe { CStr::from_ptr(as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn messages_are_kept_cleared_and_cut_at_a_char_boundary() {
        set("bad shift");
        assert_eq!(text(), "bad shift");
        set("");
        assert_eq!(text(), "");
        set("a\0b");
        assert_eq!(text(), "a b");
        // 1,021 bytes + a 2-byte char that does not fit: cut before it.
        let long = format!("{}é{}", "x".repeat(CAPACITY - 4 - 1), "y".repeat(50));
        set(&long);
        assert_eq!(text(), format!("{}...", "x".repeat(CAPACITY - 5)));
        let exact = "z".repeat(CAPACITY - 1);
        set(&exact);
        assert_eq!(text(), exact);
    }
}
