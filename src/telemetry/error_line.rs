//! An error and its causes told on one line, for log fields, stored errors and stderr.

/// Each cause once, joined by `: ` (drivers and clients often repeat their cause's text).
pub fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut cause = Some(err);
    while let Some(err) = cause {
        let text = err.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = err.source();
    }
    line
}
