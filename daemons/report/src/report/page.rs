//! The report as one HTML page: inline CSS, every figure inline SVG, no script and nothing fetched, so the file
//! opens anywhere and can be mailed or archived alone.

use std::fmt::Write as _;

use canopy_store::StoreReader;

use super::Section;
use super::summary::Summary;

const STYLE: &str = "
body { font-family: sans-serif; margin: 0 auto; max-width: 1000px; padding: 1em 2em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
p.intro { color: #444; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { text-align: left; padding: 0.15em 0.8em 0.15em 0; vertical-align: top; }
th { color: #555; font-weight: normal; }
table.streams td, table.streams th { border-bottom: 1px solid #eee; }
table.ranks td, table.ranks th { border-bottom: 1px solid #eee; font-variant-numeric: tabular-nums; }
caption { text-align: left; color: #555; font-size: 0.85em; }
div.glance { display: flex; flex-wrap: wrap; gap: 0 3em; align-items: flex-start; }
nav ul { padding: 0; margin: 0.8em 0; }
nav li { display: inline; margin-right: 1.2em; }
figure { margin: 1em 0; }
figure svg { width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
code { background: #f4f4f4; padding: 0 0.2em; }
";

/// The whole page.
pub fn render(reader: &StoreReader, summary: &Summary, sections: &[Section]) -> anyhow::Result<String> {
    // Through a `latest.sqlite` link, the run file it names.
    let real = std::fs::canonicalize(reader.path()).unwrap_or_else(|_| reader.path().to_path_buf());
    let name = real
        .file_name()
        .map_or_else(|| "run".to_string(), |n| n.to_string_lossy().into_owned());
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Canopy report: {}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>Canopy report: {}</h1>\n",
        escape(&name),
        escape(&name)
    );
    html.push_str("<section id=\"summary\" class=\"summary\">\n<h2>Summary</h2>\n<div class=\"glance\">\n");
    facts(&mut html, &summary.facts);
    html.push_str(
        "<table class=\"streams\">\n<tr><th>stream</th><th>filter</th><th>state</th><th>rounds</th>\
         <th>full coverage</th><th>late packets</th></tr>\n",
    );
    for row in &summary.streams {
        html.push_str("<tr>");
        for cell in row {
            let _ = write!(html, "<td>{}</td>", escape(cell));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n</div>\n<nav><ul>\n");
    for s in sections {
        let _ = writeln!(
            html,
            "<li><a href=\"#{}\">{}</a></li>",
            escape(&s.anchor),
            escape(&s.title)
        );
    }
    html.push_str("</ul></nav>\n</section>\n");
    for s in sections {
        section(&mut html, s)?;
    }
    html.push_str(
        "<p class=\"intro\">Written by <code>canopy report</code>; docs/report.md says how each figure is made \
         from the store.</p>\n</body>\n</html>\n",
    );
    Ok(html)
}

fn section(html: &mut String, s: &Section) -> anyhow::Result<()> {
    let _ = write!(
        html,
        "<section id=\"{}\" class=\"stream\">\n<h2>{}</h2>\n<p class=\"intro\">{}</p>\n",
        escape(&s.anchor),
        escape(&s.title),
        escape(&s.intro)
    );
    facts(html, &s.facts);
    for t in &s.tables {
        let _ = write!(
            html,
            "<table class=\"ranks\">\n<caption>{}</caption>\n<tr>",
            escape(&t.caption)
        );
        for h in &t.head {
            let _ = write!(html, "<th>{}</th>", escape(h));
        }
        html.push_str("</tr>\n");
        for row in &t.rows {
            html.push_str("<tr>");
            for cell in row {
                let _ = write!(html, "<td>{}</td>", escape(cell));
            }
            html.push_str("</tr>\n");
        }
        html.push_str("</table>\n");
    }
    if s.figures.is_empty() {
        html.push_str("<p>Nothing to draw: the store holds no rows for it.</p>\n");
    }
    for f in &s.figures {
        let svg = f.svg()?;
        let _ = write!(
            html,
            "<figure data-figure=\"{}\">\n{}\n<figcaption>{} (<code>--format png --figure {}</code>)</figcaption>\n\
             </figure>\n",
            escape(&f.id),
            svg.trim(),
            escape(&f.title),
            escape(&f.id)
        );
    }
    html.push_str("</section>\n");
    Ok(())
}

fn facts(html: &mut String, facts: &[(String, String)]) {
    if facts.is_empty() {
        return;
    }
    html.push_str("<table class=\"facts\">\n");
    for (k, v) in facts {
        let _ = writeln!(html, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
    }
    html.push_str("</table>\n");
}

/// Text made safe inside HTML elements and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_names_is_escaped() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(escape("MPI_Send"), "MPI_Send");
    }
}
