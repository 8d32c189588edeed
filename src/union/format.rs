//! On-disk formats shared with kernel overlayfs: whiteouts, opaque
//! directories and redirects.
