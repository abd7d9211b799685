//! Library-wide status codes and the error type.
//!
//! [`Status`] mirrors DynamoRIO's `drpttracer_status_t` one to one (same order, same values),
//! so converting to the C enum in `ffi` is a plain cast. Every [`Error`] carries a status
//! and a human-readable message saying what went wrong and what to do about it.

use std::fmt;

/// Outcome categories of the drpttracer API (values are the C ABI's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Status {
    Success = 0,
    Error = 1,
    InvalidParameter = 2,
    FailedToOpenPerfEvent = 3,
    FailedToMmapPerfData = 4,
    FailedToMmapPtData = 5,
    FailedToAllocateOutputBuffer = 6,
    FailedToStartTracing = 7,
    FailedToStopTracing = 8,
    OverwrittenPtTrace = 9,
    FailedToReadPtData = 10,
    OverwrittenSidebandData = 11,
    FailedToReadSidebandData = 12,
}

impl Status {
    /// The C enumerator's name, e.g. `DRPTTRACER_ERROR_INVALID_PARAMETER`.
    pub fn c_name(self) -> &'static str {
        match self {
            Status::Success => "DRPTTRACER_SUCCESS",
            Status::Error => "DRPTTRACER_ERROR",
            Status::InvalidParameter => "DRPTTRACER_ERROR_INVALID_PARAMETER",
            Status::FailedToOpenPerfEvent => "DRPTTRACER_ERROR_FAILED_TO_OPEN_PERF_EVENT",
            Status::FailedToMmapPerfData => "DRPTTRACER_ERROR_FAILED_TO_MMAP_PERF_DATA",
            Status::FailedToMmapPtData => "DRPTTRACER_ERROR_FAILED_TO_MMAP_PT_DATA",
            Status::FailedToAllocateOutputBuffer => {
                "DRPTTRACER_ERROR_FAILED_TO_ALLOCATE_OUTPUT_BUFFER"
            }
            Status::FailedToStartTracing => "DRPTTRACER_ERROR_FAILED_TO_START_TRACING",
            Status::FailedToStopTracing => "DRPTTRACER_ERROR_FAILED_TO_STOP_TRACING",
            Status::OverwrittenPtTrace => "DRPTTRACER_ERROR_OVERWRITTEN_PT_TRACE",
            Status::FailedToReadPtData => "DRPTTRACER_ERROR_FAILED_TO_READ_PT_DATA",
            Status::OverwrittenSidebandData => "DRPTTRACER_ERROR_OVERWRITTEN_SIDEBAND_DATA",
            Status::FailedToReadSidebandData => "DRPTTRACER_ERROR_FAILED_TO_READ_SIDEBANBD_DATA",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.c_name())
    }
}

/// An error with its API status and an actionable message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }

    /// An `ERROR_INVALID_PARAMETER` naming the parameter and the problem.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(Status::InvalidParameter, message)
    }

    /// Wraps the current `errno` into a message: `"{what}: {strerror} (errno N)"`.
    pub fn from_errno(status: Status, what: impl fmt::Display) -> Self {
        let e = std::io::Error::last_os_error();
        Error::new(status, format!("{what}: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, Error>;
