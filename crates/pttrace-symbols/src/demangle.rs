//! Demangling as perf shows names: C++ with parameter types, Rust without hashes.

use std::borrow::Cow;

/// The demangled form of a symbol name; the name itself when it is not mangled (C) or
/// cannot be demangled.
///
/// Rust names (legacy `_ZN…17h<hash>E` and v0 `_R…`) lose their hash and crate
/// disambiguators, as perf prints them (`prog::m::work`); C++ names (`_Z…`) are printed with
/// their parameter types, as `c++filt` does (`_ZN4node5StartEiPPc` -> `node::Start(int,
/// char**)`), clone suffixes as ` [clone .cold]`.
pub fn demangle(name: &str) -> Cow<'_, str> {
    if !(name.starts_with("_Z") || name.starts_with("_R") || name.starts_with("__Z")) {
        return Cow::Borrowed(name);
    }
    // Rust first: a legacy Rust name is also a valid C++ name, whose C++ form would keep
    // the hash; rustc-demangle rejects C++ names that carry parameter types.
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return Cow::Owned(format!("{d:#}"));
    }
    let cpp = name
        .strip_prefix('_')
        .filter(|n| n.starts_with("_Z"))
        .unwrap_or(name);
    if cpp.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(cpp) {
            if let Ok(s) = sym.demangle(&cpp_demangle::DemangleOptions::default()) {
                return Cow::Owned(s);
            }
        }
    }
    Cow::Borrowed(name)
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn cpp_rust_and_plain_names() {
        assert_eq!(demangle("_ZN4node5StartEiPPc"), "node::Start(int, char**)");
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Znot_really"), "_Znot_really");
        // Rust legacy: the hash goes.
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        // Rust v0: crate disambiguators go.
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        // C++ clone suffixes as c++filt prints them.
        assert_eq!(demangle("_Z3fooi.cold"), "foo(int) [clone .cold]");
    }
}
