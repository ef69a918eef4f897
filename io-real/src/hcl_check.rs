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

/// `Err` naming the line and column of the first quoted string that does not end on its line,
/// or of the first bracket that opens more than [`MAX_NESTING`] levels deep.
pub fn strings_terminated(text: &str) -> Result<(), String> {
    Scanner::new(text).run()
}

/// How deep HCL may nest braces, brackets, parentheses and interpolations, and (with
/// [`MAX_LABELS`]) how deep a parsed body's values may nest. hcl-rs parses and converts
/// recursively: a jobspec nesting far deeper (the fuzzer grew one block's labels, each of which
/// becomes a level of the value, into the thousands) overflowed the parsing thread's stack,
/// and a stack overflow aborts the whole agent. Nomad's own jobspecs nest under ten levels.
pub const MAX_NESTING: usize = 64;
/// The most labels one block may carry (Nomad's blocks take at most two).
pub const MAX_LABELS: usize = 8;

/// `text` parsed into an HCL body, after the scan above, with no block carrying more than
/// [`MAX_LABELS`] labels and no value nested deeper than [`MAX_NESTING`] levels once labels
/// are counted: what the callers then convert cannot overflow a stack.
pub fn parse_body(text: &str) -> Result<hcl::Body, String> {
    strings_terminated(text)?;
    let body = hcl::parse(text).map_err(|error| error.to_string())?;
    body_within(&body, 0)?;
    Ok(body)
}

fn body_within(body: &hcl::Body, depth: usize) -> Result<(), String> {
    for block in body.blocks() {
        let name = block.identifier();
        if block.labels().len() > MAX_LABELS {
            return Err(format!(
                "block {name:?} has {} labels; a block takes at most {MAX_LABELS}",
                block.labels().len()
            ));
        }
        let inner = depth + 1 + block.labels().len();
        if inner > MAX_NESTING {
            return Err(format!("block {name:?} nests more than {MAX_NESTING} levels deep"));
        }
        body_within(block.body(), inner)?;
    }
    Ok(())
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
        // Brackets and parentheses open in expressions (braces are counted per context).
        let mut brackets = 0usize;
        while let Some(c) = self.next() {
            let open: usize = stack
                .iter()
                .map(|context| match context {
                    Context::Expression { braces } => braces + 1,
                    Context::Quoted { .. } => 1,
                })
                .sum::<usize>()
                + brackets;
            if open > MAX_NESTING {
                return Err(format!(
                    "{}:{}: nested more than {MAX_NESTING} levels deep",
                    self.line, self.column
                ));
            }
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
                    '[' | '(' => brackets += 1,
                    ']' | ')' => brackets = brackets.saturating_sub(1),
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

    /// Nesting that would overflow a parser's or a converter's stack is refused by line and
    /// column before hcl-rs sees it, and labels (each a level of the parsed value) count.
    #[test]
    fn nesting_past_the_bound_is_refused_before_the_parser() {
        let deep = |open: &str, close: &str, n: usize| format!("a = {}1{}\n", open.repeat(n), close.repeat(n));
        for (open, close) in [("[", "]"), ("(", ")"), ("{x = ", "}")] {
            assert!(
                parse_body(&deep(open, close, MAX_NESTING - 2)).is_ok(),
                "{open} within the bound"
            );
            let error = strings_terminated(&deep(open, close, 100_000)).unwrap_err();
            assert!(error.contains("nested more than 64 levels deep"), "{error}");
            assert!(error.starts_with("1:"), "named by its line: {error}");
        }
        // Blocks nested by braces, and a block's labels.
        let blocks = |n: usize| format!("{}{}", "b {\n".repeat(n), "}\n".repeat(n));
        assert!(parse_body(&blocks(MAX_NESTING - 1)).is_ok());
        assert!(parse_body(&blocks(MAX_NESTING + 1)).is_err());
        let labels = |n: usize| format!("config {} {{\n}}\n", "f ".repeat(n));
        assert!(parse_body(&labels(2)).is_ok());
        let error = parse_body(&labels(3_000)).unwrap_err();
        assert_eq!(
            error,
            format!("block \"config\" has 3000 labels; a block takes at most {MAX_LABELS}")
        );
        // Labels deep inside nested blocks add up.
        let stacked = format!("{}{}", "b l l l l l l l {\n".repeat(9), "}\n".repeat(9));
        assert!(
            parse_body(&stacked)
                .unwrap_err()
                .contains("nests more than 64 levels deep")
        );
    }

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
