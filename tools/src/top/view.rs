//! Drawing a [`TopState`]: a header (the dispatcher, its uptime, counts, events per second),
//! a table of workers (an activity bar stacked by op and coloured by op family, the ops'
//! shares, idle share, instructions and bytes per second, live memory), a table of clients
//! (queue depth, instructions per second) and a footer with the keys.

use super::state::{Link, TopState, Worker};
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

/// Ops at or under this share are left out of the list (the seeds' 0.5%).
const HIDE_SHARE: f64 = 0.005;
/// The activity bar's share of the terminal width, and its bounds (the seeds' 30%, 30..60).
const BAR_SHARE: f64 = 0.3;
const BAR_MIN: u16 = 30;
const BAR_MAX: u16 = 60;
/// The narrowest bar drawn when the terminal is too narrow for [`BAR_MIN`].
const BAR_FLOOR: u16 = 8;
/// The widths of the worker table's fixed columns: idle, instr/s, bytes/s, memory.
const IDLE_W: u16 = 6;
const RATE_W: u16 = 8;
const BYTES_W: u16 = 10;
const MEM_W: u16 = 8;
/// The narrowest the op list may get before the bar gives way.
const OPS_MIN: u16 = 12;

const DIM: Style = Style::new().fg(Color::DarkGray);
const HEADING: Style = Style::new().add_modifier(Modifier::BOLD);

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, state: &TopState) {
    let [header, body, footer] =
        Layout::vertical([Constraint::Length(2), Constraint::Fill(1), Constraint::Length(1)]).areas(frame.area());
    draw_header(frame, header, state);
    match state.link() {
        Link::Waiting(looking) => draw_waiting(frame, body, looking),
        Link::Watching { .. } => {
            // Each table: borders, a heading row, and a row per peer (one for 'none').
            let rows = |n: usize| u16::try_from(n.max(1)).unwrap_or(u16::MAX).saturating_add(3);
            let [workers, clients, _] = Layout::vertical([
                Constraint::Length(rows(state.workers().len())),
                Constraint::Length(rows(state.clients().len())),
                Constraint::Fill(1),
            ])
            .areas(body);
            draw_workers(frame, workers, state);
            draw_clients(frame, clients, state);
        }
    }
    let keys = Line::from(vec![Span::styled(" q ", Style::new().add_modifier(Modifier::REVERSED)), Span::raw(" quit")]);
    frame.render_widget(Paragraph::new(keys), footer);
}

fn draw_header(frame: &mut Frame, area: Rect, state: &TopState) {
    let title = Span::styled(" gt top ", Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD));
    let (first, second) = match state.link() {
        Link::Waiting(_) => (
            Line::from(vec![title, Span::styled("  waiting for dispatcher…", Style::new().fg(Color::Yellow))]),
            Line::default(),
        ),
        Link::Watching { endpoint, pid } => {
            let mut first = vec![title, Span::raw("  "), Span::styled(endpoint.clone(), HEADING)];
            if let Some(pid) = pid {
                first.push(Span::styled(format!("  pid {pid}"), DIM));
            }
            if let Some(up) = state.uptime() {
                first.push(Span::raw(format!("  up {}", uptime(up))));
            }
            let workers = state.workers().values().filter(|w| w.gone_since.is_none()).count();
            let clients = state.clients().values().filter(|c| c.gone_since.is_none()).count();
            let mut second = vec![Span::raw(format!(
                " workers {workers}  clients {clients}  events {}/s",
                rate(state.events_per_s())
            ))];
            if state.bad_frames() > 0 {
                second.push(Span::styled(format!("  bad frames {}", state.bad_frames()), Style::new().fg(Color::Red)));
            }
            match state.quiet_for() {
                None => second.push(Span::styled("  connecting…", Style::new().fg(Color::Yellow))),
                // Gauges come every ~100 ms while anyone listens, so seconds of silence mean
                // the dispatcher is stuck or unreachable.
                Some(q) if q >= 2.0 => {
                    second.push(Span::styled(format!("  no events for {}", uptime(q)), Style::new().fg(Color::Yellow)))
                }
                Some(_) => {}
            }
            (Line::from(first), Line::from(second))
        }
    };
    frame.render_widget(Paragraph::new(vec![first, second]), area);
}

fn draw_waiting(frame: &mut Frame, area: Rect, looking: &str) {
    let mut text = vec![
        Line::default(),
        Line::styled("waiting for dispatcher…", Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)),
        Line::default(),
    ];
    if !looking.is_empty() {
        text.push(Line::styled(looking.to_string(), DIM));
    }
    text.push(Line::styled("(start one with `gt server -p PORT`, or run an embedded session with GT_MONITOR=1)", DIM));
    let block = Block::bordered().border_style(DIM);
    frame.render_widget(Paragraph::new(text).alignment(Alignment::Center).wrap(Wrap { trim: true }).block(block), area);
}

/// The bar's width for a terminal `width` wide, leaving room for the other columns.
pub(crate) fn bar_width(width: u16, name_w: u16) -> u16 {
    let wanted = ((f64::from(width) * BAR_SHARE) as u16).clamp(BAR_MIN, BAR_MAX);
    // Borders (2), seven columns' spacing (6), the fixed columns and a usable op list.
    let others = 2 + 6 + name_w + IDLE_W + RATE_W + BYTES_W + MEM_W + OPS_MIN;
    wanted.min(width.saturating_sub(others)).max(BAR_FLOOR)
}

/// A peer's name, marked when it has left.
fn label(name: &str, gone: bool) -> String {
    if gone {
        format!("{name} (gone)")
    } else {
        name.to_string()
    }
}

fn draw_workers(frame: &mut Frame, area: Rect, state: &TopState) {
    let name_w = state
        .workers()
        .iter()
        .map(|(n, w)| label(n, w.gone_since.is_some()).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(6, 24) as u16;
    let bar_w = bar_width(area.width, name_w);
    let ops_w = usize::from(area.width.saturating_sub(2 + 6 + name_w + bar_w + IDLE_W + RATE_W + BYTES_W + MEM_W));
    let right = |s: &'static str| Cell::from(Line::from(s).alignment(Alignment::Right));
    let header = Row::new(vec![
        Cell::from("worker"),
        Cell::from("activity"),
        Cell::from("ops"),
        right("idle"),
        right("instr/s"),
        right("bytes/s"),
        right("memory"),
    ])
    .style(HEADING);
    let mut rows: Vec<Row> = state
        .workers()
        .iter()
        .map(|(name, w)| {
            let gone = w.gone_since.is_some();
            let row = Row::new(vec![
                Cell::from(label(name, gone)),
                Cell::from(activity_bar(w, bar_w)),
                Cell::from(op_list(w, ops_w)),
                Cell::from(Line::from(percent(w.idle)).alignment(Alignment::Right)),
                Cell::from(Line::from(rate(w.instrs_per_s)).alignment(Alignment::Right)),
                Cell::from(Line::from(format!("{}/s", bytes(w.bytes_per_s))).alignment(Alignment::Right)),
                Cell::from(
                    Line::from(w.live_bytes.map_or("-".to_string(), |b| bytes(b as f64))).alignment(Alignment::Right),
                ),
            ]);
            if gone {
                row.style(DIM)
            } else {
                row
            }
        })
        .collect();
    if rows.is_empty() {
        rows.push(Row::new(vec![Cell::from(""), Cell::from(Span::styled("no workers yet", DIM))]));
    }
    let widths = [
        Constraint::Length(name_w),
        Constraint::Length(bar_w),
        Constraint::Fill(1),
        Constraint::Length(IDLE_W),
        Constraint::Length(RATE_W),
        Constraint::Length(BYTES_W),
        Constraint::Length(MEM_W),
    ];
    let table = Table::new(rows, widths).header(header).block(Block::bordered().title(" workers "));
    frame.render_widget(table, area);
}

/// The stacked bar: each op's share of `width` cells in its family's colour, the rest idle.
/// Cells are shared out by largest remainder, so the op cells add up to the rounded busy
/// share.
fn activity_bar(w: &Worker, width: u16) -> Line<'static> {
    let width = usize::from(width);
    let mut ops: Vec<_> = w.ops.iter().filter(|o| o.share > 0.0).collect();
    ops.sort_by(|a, b| b.share.total_cmp(&a.share));
    let busy_cells = ((w.busy() * width as f64).round() as usize).min(width);
    let exact: Vec<f64> = ops.iter().map(|o| o.share * width as f64).collect();
    let mut cells: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let mut given: usize = cells.iter().sum();
    let mut by_remainder: Vec<usize> = (0..ops.len()).collect();
    by_remainder.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for &i in by_remainder.iter().cycle().take(ops.len() * 2) {
        if given >= busy_cells {
            break;
        }
        cells[i] += 1;
        given += 1;
    }
    // Rounding the other way (shares summing over the busy share) takes from the smallest.
    for i in (0..cells.len()).rev() {
        while given > busy_cells && cells[i] > 0 {
            cells[i] -= 1;
            given -= 1;
        }
    }
    let mut spans: Vec<Span> = ops
        .iter()
        .zip(&cells)
        .filter(|(_, &n)| n > 0)
        .map(|(o, &n)| {
            let (r, g, b) = o.family.rgb();
            Span::styled("█".repeat(n), Style::new().fg(Color::Rgb(r, g, b)))
        })
        .collect();
    spans.push(Span::styled("░".repeat(width - given), DIM));
    Line::from(spans)
}

/// `matmul: 45.2% | add: 12.0%`, largest first, each name in its colour, as many whole
/// entries as fit in `width` (then `…`).
fn op_list(w: &Worker, width: usize) -> Line<'static> {
    let mut ops: Vec<_> = w.ops.iter().filter(|o| o.share > HIDE_SHARE).collect();
    ops.sort_by(|a, b| b.share.total_cmp(&a.share));
    let mut spans = Vec::new();
    let mut used = 0;
    for (i, o) in ops.iter().enumerate() {
        let sep = if i > 0 { " | " } else { "" };
        let value = format!(": {}", percent(o.share));
        let len = sep.len() + o.op.chars().count() + value.len();
        // Room for this entry, and for the `…` if more follow.
        let reserve = if i + 1 < ops.len() { 2 } else { 0 };
        let fits = used + len + reserve <= width;
        // The largest op is shown whenever it fits at all, even with no room left to say
        // that more follow.
        if fits || i == 0 && len <= width {
            used += len;
            spans.push(Span::styled(sep, DIM));
            let (r, g, b) = o.family.rgb();
            spans.push(Span::styled(o.op.clone(), Style::new().fg(Color::Rgb(r, g, b))));
            spans.push(Span::raw(value));
        }
        if !fits {
            if used + 2 <= width {
                spans.push(Span::styled(if used > 0 { " …" } else { "…" }, DIM));
            }
            break;
        }
    }
    Line::from(spans)
}

fn draw_clients(frame: &mut Frame, area: Rect, state: &TopState) {
    let right = |s: &'static str| Cell::from(Line::from(s).alignment(Alignment::Right));
    let header = Row::new(vec![Cell::from("client"), right("queued instrs"), right("queued bytes"), right("instr/s")])
        .style(HEADING);
    // Live clients first, then those that left; each by number (client ids are numbers).
    let mut clients: Vec<_> = state.clients().iter().collect();
    clients.sort_by_key(|(name, c)| (c.gone_since.is_some(), name.parse::<u64>().ok(), name.to_string()));
    let mut rows: Vec<Row> = clients
        .into_iter()
        .map(|(name, c)| {
            let gone = c.gone_since.is_some();
            let right = |s: String| Cell::from(Line::from(s).alignment(Alignment::Right));
            let row = Row::new(vec![
                Cell::from(label(name, gone)),
                right(c.queue_instrs.map_or("-".to_string(), |n| n.to_string())),
                right(c.queue_bytes.map_or("-".to_string(), |b| bytes(b as f64))),
                right(rate(c.instrs_per_s)),
            ]);
            if gone {
                row.style(DIM)
            } else {
                row
            }
        })
        .collect();
    if rows.is_empty() {
        rows.push(Row::new(vec![Cell::from(Span::styled("no clients yet", DIM))]));
    }
    let widths = [Constraint::Length(16), Constraint::Length(14), Constraint::Length(14), Constraint::Length(10)];
    let table = Table::new(rows, widths).header(header).block(Block::bordered().title(" clients "));
    frame.render_widget(table, area);
}

/// `42.8%`.
fn percent(share: f64) -> String {
    format!("{:.1}%", (share * 100.0).clamp(0.0, 100.0))
}

/// A count per second: `0`, `12.5`, `320`, `1.2k`, `3.4M`.
pub(crate) fn rate(x: f64) -> String {
    let x = if x.is_finite() { x.max(0.0) } else { 0.0 };
    if x < 0.05 {
        "0".to_string()
    } else if x < 100.0 {
        format!("{x:.1}")
    } else if x < 1e4 {
        format!("{x:.0}")
    } else if x < 1e6 {
        format!("{:.1}k", x / 1e3)
    } else if x < 1e9 {
        format!("{:.1}M", x / 1e6)
    } else {
        format!("{:.1}G", x / 1e9)
    }
}

/// A byte count: `512B`, `1.2KB`, `3.4MB`, `1.1GB` (powers of 1024, as the log writes).
pub(crate) fn bytes(x: f64) -> String {
    let x = if x.is_finite() { x.max(0.0) } else { 0.0 };
    const UNITS: [&str; 5] = ["KB", "MB", "GB", "TB", "PB"];
    if x < 1024.0 {
        return format!("{x:.0}B");
    }
    let mut v = x / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1}{unit}")
}

/// `12.3s`, `3m04s`, `2h05m`.
pub(crate) fn uptime(s: f64) -> String {
    let s = if s.is_finite() { s.max(0.0) } else { 0.0 };
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        let s = s as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = (s / 60.0) as u64;
        format!("{}h{:02}m", m / 60, m % 60)
    }
}
