//! The branch list of a union mount: `BR1[=rw|=ro]:BR2[=ro]:...`.
