//! The terminal while a full-screen view runs (`canopy watch`, `canopy top`): raw mode and the alternate
//! screen, put back when dropped, however the view ends.

use crossterm::event::Event;

pub struct Tui {
    pub terminal: ratatui::DefaultTerminal,
}

impl Tui {
    /// Takes the terminal and starts a thread that forwards its events (keys, resizes) to `events`.
    pub fn start(events: tokio::sync::mpsc::Sender<Event>) -> anyhow::Result<Tui> {
        let terminal = ratatui::try_init()?;
        let tui = Tui { terminal };
        std::thread::Builder::new()
            .name("tui-keys".into())
            .spawn(move || {
                while let Ok(ev) = crossterm::event::read() {
                    if events.blocking_send(ev).is_err() {
                        break;
                    }
                }
            })?;
        Ok(tui)
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        ratatui::restore();
    }
}
