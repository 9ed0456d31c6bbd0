//! `tollgate top`: each route's requests by outcome, then each limit's top keys, from a
//! running gateway's `/top/routes` and `/top`; refreshed every second until `q`, or printed
//! once with `--once`.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use super::commands::AdminTarget;

/// The keys listed per limit.
const KEYS_PER_LIMIT: usize = 10;

#[derive(clap::Args, Debug, Clone)]
pub struct TopArguments {
    /// Only this limit's top keys.
    #[arg(long)]
    pub limit: Option<String>,
    /// Rank keys by refusals or by tokens charged.
    #[arg(long, default_value = "refused", value_parser = ["refused", "charged"])]
    pub by: String,
    /// The window counted: 1m, 5m or 15m.
    #[arg(long, default_value = "1m", value_parser = ["1m", "5m", "15m"])]
    pub window: String,
    /// Print one table and exit (for scripts).
    #[arg(long)]
    pub once: bool,
    #[command(flatten)]
    pub target: AdminTarget,
}

/// What one refresh read: `/top/routes` and `/top`, or why not.
struct Reading {
    routes: Value,
    top: Value,
}

async fn read(
    admin: &str,
    token: Option<&str>,
    arguments: &TopArguments,
) -> Result<Reading, String> {
    let timeout = Duration::from_secs(3);
    let get = |url: String| async move {
        match super::call(http::Method::GET, &url, token, None, timeout).await {
            Ok((200, body)) => serde_json::from_str::<Value>(&body)
                .map_err(|error| format!("{url}: not JSON ({error})")),
            Ok((status, body)) => Err(format!("{url}: {status} {}", body.trim())),
            Err(error) => Err(error.to_string()),
        }
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("by", &arguments.by)
        .append_pair("window", &arguments.window)
        .append_pair("n", &KEYS_PER_LIMIT.to_string());
    if let Some(limit) = &arguments.limit {
        query.append_pair("limit", limit);
    }
    let routes = get(format!("{admin}/top/routes?window={}", arguments.window)).await?;
    let top = get(format!("{admin}/top?{}", query.finish())).await?;
    Ok(Reading { routes, top })
}

/// The table: routes with their outcomes, then each limit's keys (pure, for the tests).
pub fn render(routes: &Value, top: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    let window = routes["window_seconds"].as_u64().unwrap_or_default();
    lines.push(format!("ROUTES (last {window} s)"));
    lines.push(format!(
        "  {:<24} {:>10} {:>10} {:>10} {:>10}",
        "route", "requests", "allowed", "limited", "other"
    ));
    for route in routes["routes"].as_array().into_iter().flatten() {
        let outcomes = &route["outcomes"];
        let count = |outcome: &str| outcomes[outcome].as_u64().unwrap_or_default();
        let requests = route["requests"].as_u64().unwrap_or_default();
        let other = requests.saturating_sub(count("allowed") + count("limited"));
        lines.push(format!(
            "  {:<24} {:>10} {:>10} {:>10} {:>10}",
            shown(route["route"].as_str().unwrap_or_default(), 24),
            requests,
            count("allowed"),
            count("limited"),
            other
        ));
    }
    let answers = match top["limits"].as_array() {
        Some(limits) => limits.clone(),
        None => vec![top.clone()],
    };
    for answer in answers {
        lines.push(String::new());
        lines.push(format!(
            "{} by {} (last {} s, {})",
            answer["limit"].as_str().unwrap_or_default(),
            answer["by"].as_str().unwrap_or_default(),
            answer["window_seconds"].as_u64().unwrap_or_default(),
            answer["scope"].as_str().unwrap_or_default(),
        ));
        let keys = answer["keys"].as_array().cloned().unwrap_or_default();
        if keys.is_empty() {
            lines.push("  (none)".into());
        }
        for key in keys {
            lines.push(format!(
                "  {:<48} {:>10} ±{}",
                shown(key["key"].as_str().unwrap_or_default(), 48),
                key["count"],
                key["error"]
            ));
        }
    }
    lines
}

/// `text` cut to `width` characters, with its control characters made visible: keys are
/// chosen by clients, and a terminal must not run what they send.
fn shown(text: &str, width: usize) -> String {
    let visible: String = text.chars().flat_map(char::escape_debug).collect();
    if visible.chars().count() <= width {
        return visible;
    }
    let mut cut: String = visible.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `tollgate top`.
pub async fn top_command(arguments: TopArguments) -> ExitCode {
    let Some((admin, token)) = arguments.target.resolve() else {
        return ExitCode::FAILURE;
    };
    if arguments.once {
        return match read(&admin, token.as_deref(), &arguments).await {
            Ok(reading) => {
                for line in render(&reading.routes, &reading.top) {
                    println!("{line}");
                }
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("tollgate top: {error}");
                ExitCode::FAILURE
            }
        };
    }
    match terminal::run(&admin, token.as_deref(), &arguments).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tollgate top: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The refreshing view, drawn with ratatui on crossterm's alternate screen.
mod terminal {
    use std::time::Duration;

    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    use ratatui::widgets::{Block, Paragraph};

    use super::{read, render, TopArguments};

    pub(super) async fn run(
        admin: &str,
        token: Option<&str>,
        arguments: &TopArguments,
    ) -> std::io::Result<()> {
        let mut terminal = ratatui::init();
        let result = refresh_until_quit(&mut terminal, admin, token, arguments).await;
        ratatui::restore();
        result
    }

    async fn refresh_until_quit(
        terminal: &mut ratatui::DefaultTerminal,
        admin: &str,
        token: Option<&str>,
        arguments: &TopArguments,
    ) -> std::io::Result<()> {
        let title = format!(" tollgate top: {admin} (q quits) ");
        loop {
            let lines = match read(admin, token, arguments).await {
                Ok(reading) => render(&reading.routes, &reading.top),
                Err(error) => vec![format!("cannot read the gateway: {error}")],
            };
            let text = lines.join("\n");
            terminal.draw(|frame| {
                let view =
                    Paragraph::new(text.as_str()).block(Block::bordered().title(title.as_str()));
                frame.render_widget(view, frame.area());
            })?;
            if quit_within(Duration::from_secs(1))? {
                return Ok(());
            }
        }
    }

    /// Waits up to `period` for a key; true for q, Esc or Ctrl-C.
    fn quit_within(period: Duration) -> std::io::Result<bool> {
        let began = crate::limit::clock::instant();
        loop {
            let left = period.saturating_sub(crate::limit::clock::elapsed(began));
            if left.is_zero() || !event::poll(left)? {
                return Ok(false);
            }
            if let Event::Key(key) = event::read()? {
                let control_c =
                    key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
                if key.kind == KeyEventKind::Press
                    && (matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) || control_c)
                {
                    return Ok(true);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_lists_routes_then_each_limits_keys() {
        let routes = json!({"window_seconds": 60, "routes": [
            {"route": "login", "requests": 12, "outcomes": {"allowed": 5, "limited": 6, "banned": 1}}
        ]});
        let top = json!({"by": "refused", "window_seconds": 60, "scope": "fleet", "limits": [
            {"limit": "per_network", "by": "refused", "window_seconds": 60, "scope": "fleet",
             "keys": [{"key": "v4:203.0.113.0/24", "count": 6, "error": 0}]},
            {"limit": "per_account", "by": "refused", "window_seconds": 60, "scope": "fleet", "keys": []}
        ]});
        let lines = render(&routes, &top);
        assert_eq!(lines[0], "ROUTES (last 60 s)");
        assert!(
            lines[2].contains("login") && lines[2].ends_with("         1"),
            "{lines:?}"
        );
        assert!(lines.contains(&"per_network by refused (last 60 s, fleet)".to_string()));
        assert!(lines
            .iter()
            .any(|line| line.contains("v4:203.0.113.0/24") && line.ends_with("6 ±0")));
        assert_eq!(lines.last().unwrap(), "  (none)");
    }

    #[test]
    fn control_characters_in_keys_are_shown_not_sent_to_the_terminal() {
        assert_eq!(shown("a\u{1b}[2Jb", 20), "a\\u{1b}[2Jb");
        assert_eq!(shown("abcdef", 4), "abc…");
    }
}
