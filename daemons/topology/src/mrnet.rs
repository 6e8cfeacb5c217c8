//! MRNet's topology file format: a lexer and a recursive-descent parser that point every error at its line and
//! column, and the writer that renders a tree back.

use std::fmt;

use crate::{Builder, NodeName, Topology, TopologyError};

impl Topology {
    /// Parses MRNet's topology file format: lines `host:N => child:N child:N ;`, `#` comments to end of line,
    /// whitespace and newlines free (a rule may span lines; it ends at `;`). The first rule's parent is the root.
    /// A rule `host:N ;` (no children) is accepted as MRNet does, so a lone root can be written down, and a
    /// parent may have several rules, whose children are appended.
    /// Errors: a `TopologyError::Parse { line, column, message }` (1-based) for: missing `=>`, missing `;`,
    /// a name without `:N` or with a non-numeric N, a node that has two parents, a node that is its own
    /// ancestor (cycle), a rule whose parent never appeared as a child of an earlier rule nor is the root
    /// (disconnected), an empty file. Line/column point at the offending token.
    pub fn parse_mrnet(text: &str) -> Result<Topology, TopologyError> {
        Parser {
            tokens: lex(text),
            pos: 0,
        }
        .parse()
    }

    /// Renders back to MRNet format: one rule per non-leaf node in BFS order (a lone root as `host:N ;`), so
    /// that `parse_mrnet(&t.to_mrnet()) == Ok(t)`.
    pub fn to_mrnet(&self) -> String {
        if self.order.len() == 1 {
            return format!("{} ;\n", self.order[0]);
        }
        let mut out = String::new();
        for (node, children) in self.order.iter().zip(&self.children) {
            if children.is_empty() {
                continue;
            }
            out.push_str(&format!("{node} =>"));
            for child in children {
                out.push_str(&format!(" {child}"));
            }
            out.push_str(" ;\n");
        }
        out
    }
}

/// MRNet's scanner accepts `[a-zA-Z0-9][a-zA-Z0-9._-]*`; anything else would not survive `to_mrnet`.
pub(crate) fn is_host_name(host: &str) -> bool {
    host.starts_with(|c: char| c.is_ascii_alphanumeric()) && host.chars().all(is_host_char)
}

fn is_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind<'a> {
    Word(&'a str),
    Colon,
    Arrow,
    Semi,
    Stray(char),
    End,
}

#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    kind: Kind<'a>,
    line: usize,
    column: usize,
}

impl fmt::Display for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Word(w) => write!(f, "`{w}`"),
            Kind::Colon => f.write_str("`:`"),
            Kind::Arrow => f.write_str("`=>`"),
            Kind::Semi => f.write_str("`;`"),
            Kind::Stray(c) => write!(f, "`{c}`"),
            Kind::End => f.write_str("end of file"),
        }
    }
}

/// Splits the whole text up front; characters MRNet would reject become `Stray` tokens so that the parser
/// reports errors in file order. The `End` token sits just after the last real token.
fn lex(text: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let (mut line, mut column) = (1, 1);
    let mut end = (1, 1);
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let (tline, tcolumn) = (line, column);
        column += 1;
        let kind = match c {
            '\n' => {
                line += 1;
                column = 1;
                continue;
            }
            '#' => {
                while chars.next_if(|&(_, c)| c != '\n').is_some() {}
                continue;
            }
            c if c.is_whitespace() => continue,
            ':' => Kind::Colon,
            ';' => Kind::Semi,
            '=' if chars.next_if(|&(_, c)| c == '>').is_some() => {
                column += 1;
                Kind::Arrow
            }
            c if is_host_char(c) => {
                let mut stop = start + c.len_utf8();
                while let Some((i, c)) = chars.next_if(|&(_, c)| is_host_char(c)) {
                    stop = i + c.len_utf8();
                    column += 1;
                }
                Kind::Word(&text[start..stop])
            }
            c => Kind::Stray(c),
        };
        end = (line, column);
        tokens.push(Token {
            kind,
            line: tline,
            column: tcolumn,
        });
    }
    tokens.push(Token {
        kind: Kind::End,
        line: end.0,
        column: end.1,
    });
    tokens
}

fn parse_error(at: Token<'_>, message: impl Into<String>) -> TopologyError {
    TopologyError::Parse {
        line: at.line,
        column: at.column,
        message: message.into(),
    }
}

struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Token<'a> {
        self.tokens[self.pos]
    }

    fn next(&mut self) -> Token<'a> {
        let token = self.tokens[self.pos];
        if token.kind != Kind::End {
            self.pos += 1;
        }
        token
    }

    fn parse(mut self) -> Result<Topology, TopologyError> {
        let mut tree = Builder::default();
        // The line of the rule that attached each node, to point a two-parents error at the first one.
        let mut attached_on: Vec<usize> = Vec::new();
        let mut root = None;
        while self.peek().kind != Kind::End {
            let (name, at) = self.host()?;
            let parent = match root {
                None => {
                    let id = tree.insert(name.clone());
                    attached_on.push(at.line);
                    root = Some(id);
                    id
                }
                // Only the root and attached children are ever inserted, so membership means connected.
                Some(_) => match tree.ids.get(&name) {
                    Some(&id) => id,
                    None => {
                        return Err(parse_error(
                            at,
                            format!(
                                "`{name}` is neither the root nor a child in an earlier rule (disconnected)"
                            ),
                        ));
                    }
                },
            };
            let after = self.next();
            match after.kind {
                Kind::Semi => continue,
                Kind::Arrow => {}
                _ => {
                    return Err(parse_error(
                        after,
                        format!("expected `=>` after `{name}`, found {after}"),
                    ));
                }
            }
            let mut count = 0;
            loop {
                let token = self.peek();
                match token.kind {
                    Kind::Semi if count == 0 => {
                        return Err(parse_error(
                            token,
                            format!("rule for `{name}` has no children after `=>`"),
                        ));
                    }
                    Kind::Semi => {
                        self.next();
                        break;
                    }
                    Kind::End => {
                        return Err(parse_error(
                            token,
                            format!("missing `;` at the end of the rule for `{name}`"),
                        ));
                    }
                    _ => {}
                }
                let (child, at) = self.host()?;
                if self.peek().kind == Kind::Arrow {
                    return Err(parse_error(at, format!("missing `;` before `{child} =>`")));
                }
                if let Some(&existing) = tree.ids.get(&child) {
                    if tree.is_ancestor_or_self(existing, parent) {
                        return Err(parse_error(
                            at,
                            format!("`{child}` would be its own ancestor (cycle)"),
                        ));
                    }
                    let first = tree.parent[existing].unwrap_or(existing);
                    return Err(parse_error(
                        at,
                        format!(
                            "`{child}` already has parent `{}` (line {})",
                            tree.names[first], attached_on[existing]
                        ),
                    ));
                }
                let id = tree.insert(child);
                attached_on.push(at.line);
                tree.attach(parent, id);
                count += 1;
            }
        }
        match root {
            Some(root) => Ok(tree.finish(root)),
            None => Err(parse_error(self.peek(), "topology file is empty")),
        }
    }

    /// `host:index`, returning the token of the host for error positions.
    fn host(&mut self) -> Result<(NodeName, Token<'a>), TopologyError> {
        let at = self.next();
        let Kind::Word(host) = at.kind else {
            return Err(parse_error(
                at,
                format!("expected a node name `host:index`, found {at}"),
            ));
        };
        if !is_host_name(host) {
            return Err(parse_error(
                at,
                format!("host name `{host}` must start with a letter or digit"),
            ));
        }
        if self.peek().kind != Kind::Colon {
            return Err(parse_error(at, format!("node name `{host}` lacks `:index`")));
        }
        self.next();
        let index = self.next();
        match index.kind {
            Kind::Word(digits) if digits.bytes().all(|b| b.is_ascii_digit()) => match digits.parse::<u32>() {
                Ok(n) => Ok((NodeName::new(host, n), at)),
                Err(_) => Err(parse_error(
                    index,
                    format!("index `{digits}` of `{host}` is out of range"),
                )),
            },
            Kind::Word(word) => Err(parse_error(
                index,
                format!("index `{word}` of `{host}` is not a number"),
            )),
            _ => Err(parse_error(
                index,
                format!("expected an index after `{host}:`, found {index}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{hosts, n};

    fn parse_err(line: usize, column: usize, message: &str) -> TopologyError {
        TopologyError::Parse {
            line,
            column,
            message: message.to_string(),
        }
    }

    const REAL_FILE: &str = "\
# MRNet topology: front-end on the login node, two communication nodes
# generated by hand; comments may follow rules too
login01:0 =>
    node-a.cluster:0    # first comm node
    node-b.cluster:0
    ;

node-a.cluster:0 => be_1:0 be_1:1
                    be_2:0 ;   # two back-ends share be_1
node-b.cluster:0=>be_3:0;
\tbe_3:0 => leaf:7 ;
login01:0 => extra:0 ;  # a second rule for a parent appends, as in MRNet
";

    #[test]
    fn parses_a_multi_line_file_with_comments() {
        let t = Topology::parse_mrnet(REAL_FILE).unwrap();
        assert_eq!(t.root(), &n("login01", 0));
        assert_eq!(
            t.children(t.root()),
            &[n("node-a.cluster", 0), n("node-b.cluster", 0), n("extra", 0)]
        );
        assert_eq!(
            t.children(&n("node-a.cluster", 0)),
            &[n("be_1", 0), n("be_1", 1), n("be_2", 0)]
        );
        assert_eq!(t.parent(&n("leaf", 7)), Some(&n("be_3", 0)));
        assert_eq!(t.parent(&n("be_3", 0)), Some(&n("node-b.cluster", 0)));
        assert_eq!(t.parent(t.root()), None);
        let bfs: Vec<String> = t.nodes().map(ToString::to_string).collect();
        assert_eq!(
            bfs,
            [
                "login01:0",
                "node-a.cluster:0",
                "node-b.cluster:0",
                "extra:0",
                "be_1:0",
                "be_1:1",
                "be_2:0",
                "be_3:0",
                "leaf:7"
            ]
        );
        let leaves: Vec<String> = t.leaves().iter().map(ToString::to_string).collect();
        assert_eq!(leaves, ["extra:0", "be_1:0", "be_1:1", "be_2:0", "leaf:7"]);
        assert_eq!(t.len(), 9);
        assert!(!t.is_empty());
        assert_eq!(t.depth(), 3);
    }

    #[test]
    fn a_lone_root_rule_is_a_one_node_tree() {
        let t = Topology::parse_mrnet("  fe:0 ;  # nothing below\n").unwrap();
        assert_eq!(t.root(), &n("fe", 0));
        assert_eq!(t.len(), 1);
        assert_eq!(t.depth(), 0);
        assert_eq!(t.leaves(), [&n("fe", 0)]);
    }

    #[test]
    fn parse_errors_point_at_the_offending_token() {
        let cases: &[(&str, &str, TopologyError)] = &[
            (
                "missing arrow",
                "root:0 => a:0 ;\na:0 b:1 ;\n",
                parse_err(2, 5, "expected `=>` after `a:0`, found `b`"),
            ),
            (
                "single equals",
                "root:0 = a:0 ;",
                parse_err(1, 8, "expected `=>` after `root:0`, found `=`"),
            ),
            (
                "missing semicolon before the next rule",
                "root:0 => a:0 b:0\na:0 => c:0 ;\n",
                parse_err(2, 1, "missing `;` before `a:0 =>`"),
            ),
            (
                "missing semicolon at end of file",
                "root:0 => a:0 b:0  # trailing\n\n",
                parse_err(1, 18, "missing `;` at the end of the rule for `root:0`"),
            ),
            (
                "missing index",
                "root:0 => a:0 ;\na:0 => b ;\n",
                parse_err(2, 8, "node name `b` lacks `:index`"),
            ),
            (
                "empty index",
                "r:0 => a: ;",
                parse_err(1, 11, "expected an index after `a:`, found `;`"),
            ),
            (
                "non-numeric index",
                "root:0 => a:x ;",
                parse_err(1, 13, "index `x` of `a` is not a number"),
            ),
            (
                "negative index",
                "root:0 => a:-1 ;",
                parse_err(1, 13, "index `-1` of `a` is not a number"),
            ),
            (
                "index too large",
                "r:0 => a:4294967296 ;",
                parse_err(1, 10, "index `4294967296` of `a` is out of range"),
            ),
            (
                "two parents",
                "root:0 => a:0 b:0 ;\na:0 => c:0 ;\nb:0 =>\n  c:0 ;\n",
                parse_err(4, 3, "`c:0` already has parent `a:0` (line 2)"),
            ),
            (
                "listed twice in one rule",
                "r:0 => a:0 a:0 ;",
                parse_err(1, 12, "`a:0` already has parent `r:0` (line 1)"),
            ),
            (
                "own child",
                "a:0 => a:0 ;",
                parse_err(1, 8, "`a:0` would be its own ancestor (cycle)"),
            ),
            (
                "cycle through the root",
                "root:0 => a:0 ;\na:0 => b:0 ;\nb:0 => root:0 ;\n",
                parse_err(3, 8, "`root:0` would be its own ancestor (cycle)"),
            ),
            (
                "cycle below the root",
                "r:0 => a:0 ;\na:0 => b:0 ;\nb:0 => c:0 a:0 ;\n",
                parse_err(3, 12, "`a:0` would be its own ancestor (cycle)"),
            ),
            (
                "disconnected",
                "root:0 => a:0 ;\n# later\nx:0 => y:0 ;\n",
                parse_err(
                    3,
                    1,
                    "`x:0` is neither the root nor a child in an earlier rule (disconnected)",
                ),
            ),
            (
                "rule before its parent's rule",
                "r:0 => a:0 ;\nb:0 => c:0 ;\na:0 => b:0 ;\n",
                parse_err(
                    2,
                    1,
                    "`b:0` is neither the root nor a child in an earlier rule (disconnected)",
                ),
            ),
            ("empty file", "", parse_err(1, 1, "topology file is empty")),
            (
                "only comments",
                "# nothing\n\n   # here\n",
                parse_err(1, 1, "topology file is empty"),
            ),
            (
                "no children",
                "root:0 => ;",
                parse_err(1, 11, "rule for `root:0` has no children after `=>`"),
            ),
            (
                "columns count characters",
                "r:0 => a:0 ; # héllo\n\tä:0",
                parse_err(2, 2, "expected a node name `host:index`, found `ä`"),
            ),
            (
                "host starting with punctuation",
                "r:0 => -a:0 ;",
                parse_err(1, 8, "host name `-a` must start with a letter or digit"),
            ),
        ];
        for (what, text, want) in cases {
            assert_eq!(Topology::parse_mrnet(text).as_ref(), Err(want), "{what}");
        }
    }

    #[test]
    fn parse_error_display_names_line_and_column() {
        let err = Topology::parse_mrnet("r:0 => a:x ;").unwrap_err();
        assert_eq!(
            err.to_string(),
            "topology line 1, column 10: index `x` of `a` is not a number"
        );
    }

    #[test]
    fn to_mrnet_round_trips() {
        let trees = [
            Topology::parse_mrnet(REAL_FILE).unwrap(),
            Topology::from_spec("kary:8", &hosts(&["fe"])).unwrap(),
            Topology::from_spec("kary:3", &hosts(&["a", "b", "a", "c", "a", "b", "d"])).unwrap(),
            Topology::from_spec("b:3x2^2", &hosts(&["x.example.org", "y-1", "z_2"])).unwrap(),
            Topology::for_leaves(1, 2).unwrap(),
            Topology::for_leaves(40, 3).unwrap(),
        ];
        for t in trees {
            let text = t.to_mrnet();
            assert_eq!(Topology::parse_mrnet(&text), Ok(t), "{text}");
        }
        assert_eq!(
            Topology::from_spec("kary:8", &hosts(&["fe"])).unwrap().to_mrnet(),
            "fe:0 ;\n"
        );
    }
}
