//! A scan of HCL text for quoted strings left open, run before hcl-rs parses agent configs,
//! jobspecs and volume specs.
//!
//! hcl-rs takes time exponential in the number of lines holding an unterminated string (found
//! by the fuzzer: 40 lines like `path = "/srv/{` took 3.9 s, 62 never finished), so one typo
//! repeated down a file, or a hostile jobspec, would hang the CLI or the agent. HCL's quoted
//! strings cannot span lines, so an open one is an error at the line it starts on, and this
//! scan says so at once, in the words of HCL's own parser. Comments, heredocs and the strings
//! inside `${ }` interpolations are followed as HCL reads them; anything else is left to
//! hcl-rs.

/// `Err` naming the line and column of the first quoted string that does not end on its line.
pub fn strings_terminated(text: &str) -> Result<(), String> {
    Scanner::new(text).run()
}

struct Scanner<'a> {
    chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    text: &'a str,
    line: usize,
    column: usize,
}

/// Where the scan is: in an expression (top level, or inside an interpolation with this many
/// braces open), or inside a quoted string that started at (line, column).
enum Context {
    Expression { braces: usize },
    Quoted { line: usize, column: usize },
}

impl<'a> Scanner<'a> {
    fn new(text: &'a str) -> Self {
        Scanner {
            chars: text.char_indices().peekable(),
            text,
            line: 1,
            column: 0,
        }
    }

    fn next(&mut self) -> Option<char> {
        let (_, c) = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.column = 0;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn peek(&mut self) -> Option<char> {
        self.chars.peek().map(|(_, c)| *c)
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek() {
            if c == '\n' {
                return;
            }
            self.next();
        }
    }

    fn skip_block_comment(&mut self) {
        let mut star = false;
        while let Some(c) = self.next() {
            if star && c == '/' {
                return;
            }
            star = c == '*';
        }
    }

    /// After `<<`: a heredoc (`<<EOF` or `<<-EOF` then a newline) runs to the line holding
    /// only its marker. Anything else (a shift, a typo) is left to the parser.
    fn skip_heredoc(&mut self) {
        let Some((start, _)) = self.chars.peek().copied() else {
            return;
        };
        let rest = &self.text[start..];
        let marker_start = usize::from(rest.starts_with('-'));
        let marker: String = rest[marker_start..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        let after = &rest[marker_start + marker.len()..];
        if marker.is_empty() || !(after.starts_with('\n') || after.starts_with("\r\n")) {
            return;
        }
        self.skip_line();
        self.next();
        loop {
            let Some((at, _)) = self.chars.peek().copied() else {
                return;
            };
            let line = self.text[at..].lines().next().unwrap_or("");
            let ends = line.trim() == marker;
            self.skip_line();
            self.next();
            if ends {
                return;
            }
        }
    }

    fn run(mut self) -> Result<(), String> {
        let mut stack = vec![Context::Expression { braces: 0 }];
        while let Some(c) = self.next() {
            match stack.last_mut().expect("the top level is never popped") {
                Context::Quoted { line, column } => match c {
                    '\\' => {
                        self.next();
                    }
                    '"' => {
                        stack.pop();
                    }
                    '\n' => return Err(unterminated(*line, *column)),
                    '$' | '%' if self.peek() == Some(c) => {
                        // `$${` and `%%{` are literal.
                        self.next();
                    }
                    '$' | '%' if self.peek() == Some('{') => {
                        self.next();
                        stack.push(Context::Expression { braces: 0 });
                    }
                    _ => {}
                },
                Context::Expression { braces } => match c {
                    '#' => self.skip_line(),
                    '/' if self.peek() == Some('/') => self.skip_line(),
                    '/' if self.peek() == Some('*') => {
                        self.next();
                        self.skip_block_comment();
                    }
                    '<' if self.peek() == Some('<') => {
                        self.next();
                        self.skip_heredoc();
                    }
                    '"' => stack.push(Context::Quoted {
                        line: self.line,
                        column: self.column,
                    }),
                    '{' => *braces += 1,
                    '}' if *braces > 0 => *braces -= 1,
                    // The `}` closing an interpolation: back in its string.
                    '}' if stack.len() > 1 => {
                        stack.pop();
                    }
                    _ => {}
                },
            }
        }
        // Whatever is still open at the end lies inside the outermost string left open.
        match stack.iter().find(|context| matches!(context, Context::Quoted { .. })) {
            Some(Context::Quoted { line, column }) => Err(unterminated(*line, *column)),
            _ => Ok(()),
        }
    }
}

fn unterminated(line: usize, column: usize) -> String {
    format!(
        "{line}:{column}: Unterminated template string; a quoted string must end with a double quote (\") on the line \
         it starts"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_hcl_passes() {
        let text = r#"
# a comment with a " quote
// another "
/* a block " comment
   over lines */
job "web" {
  meta = { a = "x\"y", b = "${upper("z")}", c = "$${literal" }
  template {
    data = <<EOF
an "unbalanced quote in a heredoc
{{ key "a" }}
EOF
  }
  args = ["%{ if true }\"yes\"%{ endif }", "a { brace"]
  text = <<-EOT
    indented " heredoc
    EOT
}
"#;
        assert_eq!(strings_terminated(text), Ok(()));
    }

    #[test]
    fn an_open_string_is_named_by_its_line_and_column() {
        let text = "client {\n  servers = [\"a\"]\n  path = \"/srv/{\n}\n";
        let error = strings_terminated(text).unwrap_err();
        assert!(error.starts_with("3:10: Unterminated template string"), "{error}");
        // At the end of the text too.
        assert!(strings_terminated("a = \"open").unwrap_err().starts_with("1:5:"));
        // Inside an interpolation's own string.
        assert!(strings_terminated("a = \"${f(\"x)}\"\n").is_err());
    }

    #[test]
    fn the_fuzzers_exponential_input_is_refused_at_once() {
        let mut text = String::from("client {\n  host_volume \"data\" {\n");
        for _ in 0..200 {
            text.push_str("    path = \"/srv/ {\n");
        }
        text.push_str("  }\n}\n");
        let error = strings_terminated(&text).unwrap_err();
        assert!(error.starts_with("3:12:"), "{error}");
    }
}
