//! The `chronofs` command: the CLI edge of the library (see `cli`).
fn main() {
    std::process::exit(chronofs::cli::main());
}
