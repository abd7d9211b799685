//! Sideband: perf records (mappings, comm, task, loss) and their sources.
