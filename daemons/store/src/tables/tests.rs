use super::*;

#[test]
fn ranges_read_as_text() {
    let r = |app: &str, first, last| RankRange {
        app: app.into(),
        first,
        last,
    };
    assert_eq!(ranges_text(&[r("", 0, 0), r("", 2, 9)]), "0,2-9");
    assert_eq!(ranges_text(&[r("lulesh", 4, 7)]), "lulesh:4-7");
    assert_eq!(
        ranges_text(&[r("a", 0, 7), r("a", 9, 9), r("b", 0, 1)]),
        "a:0-7,9,b:0-1"
    );
    let ranges = [r("a", 0, 7), r("a", 9, 9), r("b", 0, 1), r("x:y", 3, 3)];
    let back: Vec<_> = crate::schema::ranges_from_text_v10(&ranges_text(&ranges))
        .into_iter()
        .map(|(app, first, last)| r(&app, first, last))
        .collect();
    assert_eq!(back, ranges);
    assert_eq!(
        crate::schema::ranges_from_text_v10("0,2-9"),
        [("".to_string(), 0, 0), ("".to_string(), 2, 9)]
    );
    assert_eq!(
        crate::schema::ranges_from_text_v10("a:junk,,5"),
        [("a".to_string(), 5, 5)]
    );
}
