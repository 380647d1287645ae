//! What the benches that measure MariaDB itself share (`mod support;` in dbcost, txmsg, fleet):
//! the server's process and CPU time, and their flags' whole numbers.

/// A flag's value as a whole number of at least 1; panics naming the flag otherwise.
pub fn at_least_one(flag: &str, v: Option<String>) -> usize {
    let v = v.unwrap_or_else(|| panic!("{flag} needs a value"));
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => n,
        _ => panic!("{flag} must be a whole number of at least 1, not {v:?}"),
    }
}

/// MariaDB's process id (the only `mariadbd` or `mysqld` on the machine; with several, which
/// one is the measured server is for the bench's `--pid` to say, where it has one).
pub fn server_pid() -> u32 {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if matches!(comm.trim(), "mariadbd" | "mysqld") {
            found.push(pid);
        }
    }
    match found[..] {
        [pid] => pid,
        [] => panic!("no mariadbd process found: this bench reads the server's CPU time from /proc"),
        _ => panic!("several mariadbd processes ({found:?}): name the measured server's with --pid"),
    }
}

/// The server's CPU time so far (user + system), in seconds.
pub fn server_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / ticks
}
