//! The process's open-file limit (`RLIMIT_NOFILE`, getrlimit(2)): `runnev serve` raises its soft
//! limit to the hard one at start, and the payload segments size the handles they keep open
//! from what it then is.
//!
//! Owns: reading and raising the limit. Must never: open files itself, or lower a limit.
//!
//! Why: a node with many streams keeps one payload segment file per stream
//! ([`crate::storage::payloads`]); with the common soft limit of 1,024 it must close and reopen
//! them on nearly every append to a stream not written lately, which cost about a quarter of
//! the CPU the 10,000-stream benchmark's nodes spent in the apply (7 % of all their CPU). The hard limit is what the administrator
//! allows; the soft one is only a default (Go's runtime raises it the same way since 1.19).

use std::io;

/// What [`raise_soft_to_hard`] did: the soft limit before and after, in open files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    /// The soft limit found at start.
    pub from: u64,
    /// The soft limit now (the hard limit, or `from` when it already was).
    pub to: u64,
}

/// The soft and hard limits on open files, in files (`RLIM_INFINITY` as `u64::MAX`).
///
/// Errors: getrlimit(2) failed (it does not, for this resource, on Linux).
pub fn limits() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the `rlimit` it is given, which lives for the call.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => Ok((lim.rlim_cur, lim.rlim_max)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Raises the soft limit on open files to the hard limit (never lowers it).
///
/// Errors: getrlimit(2) or setrlimit(2) failed; the limit is then unchanged.
pub fn raise_soft_to_hard() -> io::Result<Raised> {
    let (soft, hard) = limits()?;
    if soft >= hard {
        return Ok(Raised { from: soft, to: soft });
    }
    let lim = libc::rlimit { rlim_cur: hard, rlim_max: hard };
    // SAFETY: setrlimit reads the `rlimit` it is given, which lives for the call.
    match unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } {
        0 => Ok(Raised { from: soft, to: hard }),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raising leaves the soft limit at the hard one and never above it; a second raise changes
    /// nothing.
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_and_no_further() {
        let (_, hard) = limits().unwrap();
        let r = raise_soft_to_hard().unwrap();
        assert!(r.to >= r.from);
        assert_eq!(limits().unwrap(), (hard, hard));
        assert_eq!(raise_soft_to_hard().unwrap(), Raised { from: hard, to: hard });
    }
}
