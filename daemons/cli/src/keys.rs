//! What a key asks of a full-screen view (`canopy watch`, `canopy top`).

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    /// `h`: the other view of a utilization stream.
    ToggleView,
    /// Tab or right: the next stream.
    Next,
    /// Shift-Tab or left: the previous stream.
    Previous,
    /// `m`: the next metric of the tables.
    Metric,
    /// `s`: the next sort column.
    Sort,
    /// `?`: the help line on or off.
    Help,
    /// Up, down, page up, page down: scroll by this many rows (a page is `PAGE`).
    Scroll(i32),
    Redraw,
    Nothing,
}

/// A page of scrolling, in rows (the view clamps it to what it holds).
pub const PAGE: i32 = 10;

pub fn action_of(ev: &Event) -> Action {
    match ev {
        Event::Key(KeyEvent {
            code,
            modifiers,
            kind: KeyEventKind::Press | KeyEventKind::Repeat,
            ..
        }) => match code {
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
            KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
            KeyCode::Char('h') => Action::ToggleView,
            KeyCode::Tab | KeyCode::Right => Action::Next,
            KeyCode::BackTab | KeyCode::Left => Action::Previous,
            KeyCode::Char('m') => Action::Metric,
            KeyCode::Char('s') => Action::Sort,
            KeyCode::Char('?') => Action::Help,
            KeyCode::Up => Action::Scroll(-1),
            KeyCode::Down => Action::Scroll(1),
            KeyCode::PageUp => Action::Scroll(-PAGE),
            KeyCode::PageDown => Action::Scroll(PAGE),
            _ => Action::Nothing,
        },
        Event::Resize(..) => Action::Redraw,
        _ => Action::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_quit_switch_streams_cycle_metric_and_sort_and_scroll() {
        let key = |c| Event::Key(KeyEvent::new(c, KeyModifiers::NONE));
        assert_eq!(action_of(&key(KeyCode::Char('q'))), Action::Quit);
        assert_eq!(action_of(&key(KeyCode::Esc)), Action::Quit);
        assert_eq!(
            action_of(&Event::Key(KeyEvent::new(
                KeyCode::Char('c'),
                KeyModifiers::CONTROL
            ))),
            Action::Quit
        );
        assert_eq!(action_of(&key(KeyCode::Char('c'))), Action::Nothing);
        assert_eq!(action_of(&key(KeyCode::Char('h'))), Action::ToggleView);
        assert_eq!(action_of(&key(KeyCode::Tab)), Action::Next);
        assert_eq!(action_of(&key(KeyCode::Right)), Action::Next);
        assert_eq!(action_of(&key(KeyCode::BackTab)), Action::Previous);
        assert_eq!(action_of(&key(KeyCode::Left)), Action::Previous);
        assert_eq!(action_of(&key(KeyCode::Char('m'))), Action::Metric);
        assert_eq!(action_of(&key(KeyCode::Char('s'))), Action::Sort);
        assert_eq!(action_of(&key(KeyCode::Char('?'))), Action::Help);
        assert_eq!(action_of(&key(KeyCode::Down)), Action::Scroll(1));
        assert_eq!(action_of(&key(KeyCode::PageUp)), Action::Scroll(-PAGE));
        assert_eq!(action_of(&Event::Resize(100, 40)), Action::Redraw);
    }
}
