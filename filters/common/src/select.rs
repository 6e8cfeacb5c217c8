//! Which events a rank's analysis looks at (classify's and kmeans's schemes): every event, or those whose
//! names a regex matches. An event whose name the node was never told takes its id in 16 hex digits as its name.

use std::collections::HashMap;

use regex_lite::Regex;

use crate::Params;

/// Which event names are selected.
#[derive(Debug, Clone)]
pub enum Scheme {
    /// Every event the rank reports.
    All,
    /// Only the events whose names match (anywhere in the name: anchor it with `^` for a prefix).
    Pattern(Regex),
}

impl Scheme {
    /// From the parameters `key` (`"all"`, the default, or `"pattern"`; classify and kmeans call it `scheme`,
    /// outliers `events`) and `pattern` (with `"pattern"` only).
    pub fn from_params(params: &Params, key: &str) -> Result<Scheme, String> {
        match (
            params.choice(key, &["all", "pattern"], "all")?,
            params.string("pattern")?,
        ) {
            ("all", None) => Ok(Scheme::All),
            ("all", Some(_)) => Err(format!("pattern needs {key} \"pattern\"")),
            (_, None) => Err(format!("{key} \"pattern\" needs a pattern")),
            (_, Some(p)) => Regex::new(p)
                .map(Scheme::Pattern)
                .map_err(|e| format!("pattern \"{p}\" is not a valid regex: {e}")),
        }
    }

    /// As results report it: `all`, or `pattern:` followed by the regex.
    pub fn describe(&self) -> String {
        match self {
            Scheme::All => "all".to_string(),
            Scheme::Pattern(re) => format!("pattern:{}", re.as_str()),
        }
    }

    pub fn selects(&self, name: &str) -> bool {
        match self {
            Scheme::All => true,
            Scheme::Pattern(re) => re.is_match(name),
        }
    }
}

/// A scheme with the names a node was told: decides once per id whether it is selected, and under which name.
#[derive(Debug, Clone)]
pub struct Selection {
    pub scheme: Scheme,
    names: HashMap<u64, String>,
    chosen: HashMap<u64, Option<String>>,
}

impl Selection {
    pub fn new(scheme: Scheme) -> Selection {
        Selection {
            scheme,
            names: HashMap::new(),
            chosen: HashMap::new(),
        }
    }

    /// Learns names; a name may replace an id's hex stand-in, so every id is decided again.
    pub fn learn(&mut self, names: &[(u64, &str)]) {
        for (id, name) in names {
            self.names.insert(*id, (*name).to_string());
        }
        self.chosen.clear();
    }

    /// Decides, once per id, whether the scheme selects it and under which name.
    pub fn remember(&mut self, id: u64) {
        if self.chosen.contains_key(&id) {
            return;
        }
        let name = self
            .names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("{id:016x}"));
        let chosen = self.scheme.selects(&name).then_some(name);
        self.chosen.insert(id, chosen);
    }

    /// The name a remembered `id` is selected under; `None` when the scheme leaves it out or it was not
    /// remembered.
    pub fn selected(&self, id: u64) -> Option<&str> {
        self.chosen.get(&id).and_then(|c| c.as_deref())
    }

    /// [`Selection::remember`], then [`Selection::selected`].
    pub fn get(&mut self, id: u64) -> Option<&str> {
        self.remember(id);
        self.selected(id)
    }

    /// A name the node was told, if any.
    pub fn name(&self, id: u64) -> Option<&str> {
        self.names.get(&id).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheme(text: &str) -> Result<Scheme, String> {
        Scheme::from_params(&Params::parse(text, &["scheme", "pattern"]).unwrap(), "scheme")
    }

    #[test]
    fn schemes_parse_and_refuse_by_name() {
        assert_eq!(scheme("").unwrap().describe(), "all");
        assert_eq!(
            scheme(r#"{"scheme": "pattern", "pattern": "^MPI_"}"#)
                .unwrap()
                .describe(),
            "pattern:^MPI_"
        );
        assert_eq!(
            scheme(r#"{"pattern": "x"}"#).unwrap_err(),
            "pattern needs scheme \"pattern\""
        );
        assert_eq!(
            scheme(r#"{"scheme": "pattern"}"#).unwrap_err(),
            "scheme \"pattern\" needs a pattern"
        );
        assert!(
            scheme(r#"{"scheme": "pattern", "pattern": "("}"#)
                .unwrap_err()
                .starts_with("pattern \"(\" is not a valid regex: ")
        );
    }

    #[test]
    fn unnamed_ids_match_as_hex_until_named() {
        let mut s = Selection::new(scheme(r#"{"scheme": "pattern", "pattern": "^MPI_"}"#).unwrap());
        assert_eq!(s.get(7), None);
        s.learn(&[(7, "MPI_Send")]);
        assert_eq!(s.get(7), Some("MPI_Send"));
        let mut all = Selection::new(Scheme::All);
        assert_eq!(all.get(255), Some("00000000000000ff"));
    }
}
