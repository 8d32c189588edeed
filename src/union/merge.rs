//! Merging the listings of a directory's layers into one, with offsets
//! that survive a reopen.
