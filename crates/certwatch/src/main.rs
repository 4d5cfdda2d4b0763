//! certwatch: the daemon binary (being built).

fn main() {
    eprintln!("certwatch: not built yet");
    std::process::exit(2);
}
