//! The report's figures as a browser draws them: the DOM from headless Chromium, and the SVG figures' lines.

use std::path::Path;

/// The DOM headless Chromium builds from an HTML page (`--dump-dom`), or None (the check is skipped, and says
/// so) where Chromium is not installed; with `CANOPY_CHROMIUM_TEST` set (CI installs it) that fails the test.
pub fn browser_dom(page: &Path) -> Option<String> {
    let found = std::process::Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CANOPY_CHROMIUM_TEST").is_none(),
            "CANOPY_CHROMIUM_TEST is set but chromium is not installed (apt-get install chromium)"
        );
        eprintln!("skipped the browser check: chromium is not installed (apt-get install chromium)");
        return None;
    }
    let out = std::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The figures of a report page (its file or a browser's DOM of it), by name, each with its SVG.
pub fn svg_figures(html: &str) -> std::collections::HashMap<String, String> {
    html.split("<figure data-figure=\"")
        .skip(1)
        .map(|f| {
            let (name, rest) = f.split_once('"').unwrap();
            let svg = rest.split("</figure>").next().unwrap();
            (name.to_string(), svg.to_string())
        })
        .collect()
}

/// The points of every `<polyline>` of an SVG, one count per line.
pub fn polyline_points(svg: &str) -> Vec<usize> {
    svg.split("<polyline")
        .skip(1)
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .map(|pts| pts.split_whitespace().count())
        .collect()
}

/// Every figure of a browser's DOM of a report drew data over the run's `rounds`: a series (a line with a point
/// per round, or per round after the first: the stats figure leaves the start-up out, and a round's time is
/// from the one before) or a heat map (a cell per round and bin, ten bins or more). Returns the figures' names.
pub fn assert_figures_drawn(dom: &str, rounds: usize) -> Vec<String> {
    let figs = svg_figures(dom);
    assert!(!figs.is_empty(), "no figure in the page");
    assert_eq!(
        dom.matches("<svg").count(),
        figs.len(),
        "a figure that is not one SVG"
    );
    for name in figs.keys() {
        assert_figure_drawn(dom, name, rounds);
    }
    let mut names: Vec<String> = figs.into_keys().collect();
    names.sort();
    names
}

/// The figure `name` of a browser's DOM of a report drew data over `rounds`, as [`assert_figures_drawn`] says.
pub fn assert_figure_drawn(dom: &str, name: &str, rounds: usize) {
    let figs = svg_figures(dom);
    let svg = figs
        .get(name)
        .unwrap_or_else(|| panic!("no figure {name} in the page, only {:?}", figs.keys()));
    let points = polyline_points(svg);
    let series = points.contains(&rounds) || points.contains(&(rounds - 1));
    let cells = svg.matches("<rect").count() >= rounds * 10;
    assert!(
        series || cells,
        "figure {name} drew no data over {rounds} rounds: lines of {:?} points, {} rects",
        polyline_points(svg),
        svg.matches("<rect").count()
    );
}
