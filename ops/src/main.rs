//! `sendium`: the SMS gateway binary. See `sendium help`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sendium_ops::cli::main()
}
