//! Error messages about the settings file without the values they quote.

/// `message` with what it quotes (`"..."`, a value from the file, perhaps a secret) left out;
/// field names, which serde quotes with backticks, stay.
pub(super) fn unquoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let (mut quoted, mut escaped) = (false, false);
    for c in message.chars() {
        match (quoted, escaped, c) {
            // Inside quotes, a backslash escapes the next character (an escaped quote does
            // not end the value).
            (true, false, '\\') => escaped = true,
            (true, true, _) => escaped = false,
            (true, false, '"') => {
                quoted = false;
                out.push_str("[value]\"");
            }
            (true, false, _) => {}
            (false, _, '"') => {
                quoted = true;
                out.push('"');
            }
            (false, _, c) => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unquoted;

    #[test]
    fn quoted_values_are_left_out_of_file_errors() {
        assert_eq!(
            unquoted(r#"invalid type: string "s3cr\"et\\", expected a sequence"#),
            r#"invalid type: string "[value]", expected a sequence"#
        );
        assert_eq!(unquoted("unknown field `bindd`"), "unknown field `bindd`");
    }
}
