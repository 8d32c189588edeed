//! Copy-up: an object of a read-only branch copied into a read-write one,
//! never visible half-copied.
