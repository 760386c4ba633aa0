//! The route tree, in the spirit of Alertmanager's: matchers on the event's
//! labels, `continue`, receivers, grouping and timing inherited down the tree,
//! mute windows; plus per-object subscriptions from the `trainyard.dev/notify`
//! annotation, limited to what the operator allows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Datelike, Timelike, Utc};
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::duration;
use crate::error::CoreError;
use crate::event::{EVENT_TYPES, Event};
use crate::queued::QueuedThresholds;

/// The routing config file as written (YAML).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingFile {
    pub route: RouteSpec,
    #[serde(default)]
    pub receivers: Vec<ReceiverSpec>,
    #[serde(default)]
    pub time_intervals: Vec<TimeIntervalSpec>,
    #[serde(default)]
    pub subscriptions: SubscriptionSpec,
    #[serde(default)]
    pub queued_too_long: QueuedTooLongSpec,
}

/// When a job waiting in `Queued` becomes `job.queued_too_long`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueuedTooLongSpec {
    /// Default threshold (1h when unset).
    pub after: Option<String>,
    /// Thresholds of particular TrainingQueues, by queue name.
    #[serde(default)]
    pub queues: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub receiver: Option<String>,
    #[serde(default)]
    pub matchers: Vec<String>,
    #[serde(default, rename = "continue")]
    pub continue_matching: bool,
    pub group_by: Option<Vec<String>>,
    pub group_wait: Option<String>,
    pub group_interval: Option<String>,
    pub repeat_interval: Option<String>,
    /// This route's `job.queued_too_long` threshold, inherited by its children;
    /// beats the queue's and the default.
    pub queued_too_long_after: Option<String>,
    #[serde(default)]
    pub mute_time_intervals: Vec<String>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
}

/// A destination the operator configured. Secrets are files (a mounted Secret).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverSpec {
    pub name: String,
    pub slack: Option<SlackSpec>,
    pub webhook: Option<WebhookSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSpec {
    /// Channel for `chat.postMessage`, and the rate-limit key.
    pub channel: String,
    /// File holding an incoming-webhook URL.
    pub webhook_url_file: Option<String>,
    /// File holding a bot token (`xoxb-…`) for `chat.postMessage`.
    pub token_file: Option<String>,
    /// Slack Web API base; change only to point at a test server.
    #[serde(default = "default_slack_api")]
    pub api_url: String,
}

fn default_slack_api() -> String {
    "https://slack.com/api".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    pub url: String,
    /// File with one `whsec_…` signing secret per line; during a rotation every
    /// line signs, so receivers accept either key.
    pub secret_file: String,
}

/// Mute windows, UTC.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeIntervalSpec {
    pub name: String,
    #[serde(default)]
    pub weekdays: Vec<String>,
    /// `HH:MM`-`HH:MM` ranges; `end` may be `24:00`, and a range may wrap past midnight.
    #[serde(default)]
    pub times: Vec<TimeRangeSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeRangeSpec {
    pub start: String,
    pub end: String,
}

/// What `trainyard.dev/notify` annotations may ask for.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSpec {
    /// Slack receiver (with a bot token) that posts to annotated channels.
    pub slack_receiver: Option<String>,
    /// Channels annotations may name; `*` at the end matches a prefix (`#team-*`).
    #[serde(default)]
    pub allowed_channels: Vec<String>,
    /// Webhook receivers annotations may name (`webhook:<receiver>`).
    #[serde(default)]
    pub allowed_webhooks: Vec<String>,
    /// Event types subscriptions hear when `trainyard.dev/notify-on` is absent.
    pub default_events: Option<Vec<String>>,
}

/// Grouping and timing of one route, inherited by its children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupPolicy {
    pub group_by: Vec<String>,
    pub group_wait: Duration,
    pub group_interval: Duration,
    pub repeat_interval: Duration,
}

impl Default for GroupPolicy {
    fn default() -> Self {
        Self {
            group_by: vec!["event".into(), "namespace".into(), "owner".into()],
            group_wait: Duration::from_secs(10),
            group_interval: Duration::from_secs(60),
            repeat_interval: Duration::from_secs(4 * 3600),
        }
    }
}

/// Where a notification goes: a receiver, and for Slack subscriptions the channel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Destination {
    pub receiver: String,
    /// Overrides the receiver's channel (subscriptions to other channels).
    pub channel: Option<String>,
}

impl Destination {
    /// A stable key: `receiver` or `receiver/#channel`.
    pub fn key(&self) -> String {
        match &self.channel {
            Some(channel) => format!("{}/{channel}", self.receiver),
            None => self.receiver.clone(),
        }
    }
}

/// An event routed to one destination, with the grouping it falls under.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Routed {
    pub destination: Destination,
    /// Events with the same key are sent together.
    pub group_key: String,
    pub policy: GroupPolicy,
}

/// Label matcher: `name="value"`, `name!="value"`, `name=~"regex"`, `name!~"regex"`.
#[derive(Debug, Clone)]
pub struct Matcher {
    name: String,
    op: MatchOp,
}

#[derive(Debug, Clone)]
enum MatchOp {
    Equal(String),
    NotEqual(String),
    Regex(Regex),
    NotRegex(Regex),
}

impl Matcher {
    pub fn parse(text: &str) -> Result<Self, String> {
        let position = text.find(['=', '!']).ok_or_else(|| {
            format!("{text:?} has no operator; write e.g. team=\"nlp\" or event=~\"job\\\\..*\"")
        })?;
        let name = text[..position].trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        {
            return Err(format!("{text:?}: {name:?} is not a label name"));
        }
        let rest = &text[position..];
        let (op, value) = ["=~", "!~", "!=", "="]
            .iter()
            .find_map(|op| rest.strip_prefix(op).map(|v| (*op, v.trim())))
            .ok_or_else(|| format!("{text:?}: the operator must be =, !=, =~ or !~"))?;
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value)
            .to_string();
        let regex = |v: &str| {
            Regex::new(&format!("^(?:{v})$")).map_err(|err| format!("{text:?}: bad regex: {err}"))
        };
        let op = match op {
            "=" => MatchOp::Equal(value),
            "!=" => MatchOp::NotEqual(value),
            "=~" => MatchOp::Regex(regex(&value)?),
            _ => MatchOp::NotRegex(regex(&value)?),
        };
        Ok(Self {
            name: name.to_string(),
            op,
        })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.name).map(String::as_str).unwrap_or("");
        match &self.op {
            MatchOp::Equal(v) => value == v,
            MatchOp::NotEqual(v) => value != v,
            MatchOp::Regex(r) => r.is_match(value),
            MatchOp::NotRegex(r) => !r.is_match(value),
        }
    }
}

#[derive(Debug, Clone)]
struct Route {
    /// Position in the tree, e.g. `0.2`, part of the group key.
    path: String,
    receiver: String,
    matchers: Vec<Matcher>,
    continue_matching: bool,
    policy: GroupPolicy,
    queued_after: Option<Duration>,
    mute: Vec<String>,
    routes: Vec<Route>,
}

#[derive(Debug, Clone)]
struct TimeInterval {
    weekdays: BTreeSet<u32>,
    /// Minutes since midnight, `[start, end)`; `start > end` wraps midnight.
    times: Vec<(u32, u32)>,
}

impl TimeInterval {
    fn contains(&self, at: DateTime<Utc>) -> bool {
        let weekday = at.weekday().num_days_from_monday();
        if !self.weekdays.is_empty() && !self.weekdays.contains(&weekday) {
            return false;
        }
        let minute = at.hour() * 60 + at.minute();
        self.times.is_empty()
            || self.times.iter().any(|&(start, end)| {
                if start <= end {
                    (start..end).contains(&minute)
                } else {
                    minute >= start || minute < end
                }
            })
    }
}

/// A validated routing config.
#[derive(Debug, Clone)]
pub struct Routing {
    root: Route,
    receivers: BTreeMap<String, ReceiverSpec>,
    intervals: BTreeMap<String, TimeInterval>,
    subscriptions: SubscriptionSpec,
    default_events: Vec<String>,
    queued: QueuedThresholds,
}

/// What routing decided for one event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteOutcome {
    pub routed: Vec<Routed>,
    /// Routes that matched but were muted at the event's time.
    pub muted: usize,
    /// Annotation destinations refused (not allowed by the operator), with why.
    pub refused: Vec<String>,
}

impl Routing {
    /// Parses and validates a routing file; every error names the field.
    pub fn from_yaml(text: &str) -> Result<Self, CoreError> {
        let file: RoutingFile = yaml_serde::from_str(text)?;
        Self::new(file)
    }

    pub fn new(file: RoutingFile) -> Result<Self, CoreError> {
        let mut receivers = BTreeMap::new();
        for (i, receiver) in file.receivers.iter().enumerate() {
            let field = format!("receivers[{i}]");
            if receiver.name.is_empty() {
                return Err(CoreError::config(
                    format!("{field}.name"),
                    "must not be empty",
                ));
            }
            match (&receiver.slack, &receiver.webhook) {
                (Some(slack), None) => {
                    if slack.webhook_url_file.is_some() == slack.token_file.is_some() {
                        return Err(CoreError::config(
                            format!("{field}.slack"),
                            "set exactly one of webhook_url_file (incoming webhook) or token_file (bot token)",
                        ));
                    }
                }
                (None, Some(webhook)) => {
                    if !(webhook.url.starts_with("http://") || webhook.url.starts_with("https://"))
                    {
                        return Err(CoreError::config(
                            format!("{field}.webhook.url"),
                            format!("{:?} must be an http:// or https:// URL", webhook.url),
                        ));
                    }
                }
                _ => {
                    return Err(CoreError::config(
                        field,
                        "set exactly one of slack or webhook",
                    ));
                }
            }
            if receivers
                .insert(receiver.name.clone(), receiver.clone())
                .is_some()
            {
                return Err(CoreError::config(
                    format!("{field}.name"),
                    format!("receiver {:?} is defined twice", receiver.name),
                ));
            }
        }
        let mut intervals = BTreeMap::new();
        for (i, interval) in file.time_intervals.iter().enumerate() {
            let field = format!("time_intervals[{i}]");
            let weekdays = interval
                .weekdays
                .iter()
                .map(|d| {
                    weekday(d).ok_or_else(|| {
                        CoreError::config(
                            format!("{field}.weekdays"),
                            format!("{d:?} is not a weekday (monday … sunday)"),
                        )
                    })
                })
                .collect::<Result<BTreeSet<u32>, _>>()?;
            let times = interval
                .times
                .iter()
                .enumerate()
                .map(|(j, range)| {
                    let at = |text: &str, what: &str| {
                        minutes(text).ok_or_else(|| {
                            CoreError::config(
                                format!("{field}.times[{j}].{what}"),
                                format!("{text:?} is not HH:MM (00:00 to 24:00)"),
                            )
                        })
                    };
                    Ok((at(&range.start, "start")?, at(&range.end, "end")?))
                })
                .collect::<Result<Vec<_>, CoreError>>()?;
            intervals.insert(interval.name.clone(), TimeInterval { weekdays, times });
        }
        let root_receiver = file.route.receiver.clone().ok_or_else(|| {
            CoreError::config("route.receiver", "the root route needs a receiver")
        })?;
        let root = build_route(
            &file.route,
            "route",
            "0",
            &root_receiver,
            (&GroupPolicy::default(), None),
            &receivers,
            &intervals,
        )?;
        let queued = queued_thresholds(&file.queued_too_long)?;
        let subs = &file.subscriptions;
        if let Some(name) = &subs.slack_receiver {
            match receivers.get(name) {
                Some(r) if r.slack.as_ref().is_some_and(|s| s.token_file.is_some()) => {}
                Some(_) => {
                    return Err(CoreError::config(
                        "subscriptions.slack_receiver",
                        format!(
                            "receiver {name:?} must be a Slack receiver with a token_file (chat.postMessage can post to any channel; an incoming webhook cannot)"
                        ),
                    ));
                }
                None => {
                    return Err(CoreError::config(
                        "subscriptions.slack_receiver",
                        format!("unknown receiver {name:?}"),
                    ));
                }
            }
        }
        for (i, name) in subs.allowed_webhooks.iter().enumerate() {
            if receivers.get(name).is_none_or(|r| r.webhook.is_none()) {
                return Err(CoreError::config(
                    format!("subscriptions.allowed_webhooks[{i}]"),
                    format!("{name:?} is not a webhook receiver"),
                ));
            }
        }
        let default_events = subs.default_events.clone().unwrap_or_else(|| {
            [
                "job.failed",
                "job.completed",
                "job.restarted",
                "sweep.best_trial",
                "sweep.finished",
            ]
            .map(String::from)
            .to_vec()
        });
        for (i, event) in default_events.iter().enumerate() {
            if !EVENT_TYPES.contains(&event.as_str()) {
                return Err(CoreError::config(
                    format!("subscriptions.default_events[{i}]"),
                    format!(
                        "unknown event type {event:?}; known: {}",
                        EVENT_TYPES.join(", ")
                    ),
                ));
            }
        }
        Ok(Self {
            root,
            receivers,
            intervals,
            subscriptions: file.subscriptions,
            default_events,
            queued,
        })
    }

    pub fn receiver(&self, name: &str) -> Option<&ReceiverSpec> {
        self.receivers.get(name)
    }

    pub fn receivers(&self) -> impl Iterator<Item = &ReceiverSpec> {
        self.receivers.values()
    }

    /// Where `event` goes: every matching route (depth first, stopping after
    /// the first match at a level unless it has `continue`), then the
    /// subscriptions its object asked for. One destination hears an event once.
    pub fn route(&self, event: &Event) -> RouteOutcome {
        self.route_with_thresholds(event).0
    }

    /// Where a `job.queued_too_long` event goes, each destination with the
    /// wait after which it is told: its route's `queued_too_long_after`, else
    /// the queue's threshold, else the default.
    pub fn route_queued(&self, event: &Event) -> Vec<(Routed, Duration)> {
        let (outcome, overrides) = self.route_with_thresholds(event);
        let fallback = self.queued.for_queue(event.queue.as_deref());
        outcome
            .routed
            .into_iter()
            .zip(overrides)
            .map(|(routed, threshold)| (routed, threshold.unwrap_or(fallback)))
            .collect()
    }

    /// The outcome, and per routed destination its route's own queued threshold.
    fn route_with_thresholds(&self, event: &Event) -> (RouteOutcome, Vec<Option<Duration>>) {
        let labels = event.route_labels();
        let mut thresholds = Vec::new();
        let mut outcome = RouteOutcome::default();
        let mut matched = Vec::new();
        if !walk(&self.root, &labels, &mut matched) {
            matched.push(&self.root);
        }
        let mut seen = BTreeSet::new();
        for route in matched {
            if route.mute.iter().any(|name| {
                self.intervals
                    .get(name)
                    .is_some_and(|interval| interval.contains(event.time))
            }) {
                outcome.muted += 1;
                continue;
            }
            let destination = Destination {
                receiver: route.receiver.clone(),
                channel: None,
            };
            if seen.insert(destination.clone()) {
                outcome
                    .routed
                    .push(routed(destination, &route.path, &route.policy, &labels));
                thresholds.push(route.queued_after);
            }
        }
        self.subscribe(event, &labels, &mut seen, &mut outcome);
        thresholds.resize(outcome.routed.len(), None);
        (outcome, thresholds)
    }

    fn subscribe(
        &self,
        event: &Event,
        labels: &BTreeMap<String, String>,
        seen: &mut BTreeSet<Destination>,
        outcome: &mut RouteOutcome,
    ) {
        if event.subscriptions.is_empty() {
            return;
        }
        let wanted = if event.subscribed_events.is_empty() {
            &self.default_events
        } else {
            &event.subscribed_events
        };
        if !wanted.contains(&event.kind) {
            return;
        }
        for subscription in &event.subscriptions {
            let destination = match subscription.split_once(':') {
                Some(("slack", channel)) => {
                    let channel = channel.trim();
                    let allowed = self
                        .subscriptions
                        .allowed_channels
                        .iter()
                        .any(|pattern| glob(pattern, channel));
                    match (&self.subscriptions.slack_receiver, allowed) {
                        (Some(receiver), true) => Destination {
                            receiver: receiver.clone(),
                            channel: Some(channel.to_string()),
                        },
                        (None, _) => {
                            outcome.refused.push(format!(
                                "{subscription}: no subscriptions.slack_receiver is configured"
                            ));
                            continue;
                        }
                        (_, false) => {
                            outcome.refused.push(format!(
                                "{subscription}: channel not in subscriptions.allowed_channels"
                            ));
                            continue;
                        }
                    }
                }
                Some(("webhook", name))
                    if self
                        .subscriptions
                        .allowed_webhooks
                        .iter()
                        .any(|w| w == name.trim()) =>
                {
                    Destination {
                        receiver: name.trim().to_string(),
                        channel: None,
                    }
                }
                _ => {
                    outcome.refused.push(format!(
                        "{subscription}: not an allowed destination (slack:#channel or webhook:<receiver> named in subscriptions)"
                    ));
                    continue;
                }
            };
            if seen.insert(destination.clone()) {
                outcome
                    .routed
                    .push(routed(destination, "sub", &self.root.policy, labels));
            }
        }
    }
}

fn routed(
    destination: Destination,
    path: &str,
    policy: &GroupPolicy,
    labels: &BTreeMap<String, String>,
) -> Routed {
    let values: Vec<String> = policy
        .group_by
        .iter()
        .map(|name| {
            format!(
                "{name}={}",
                labels.get(name).map(String::as_str).unwrap_or("")
            )
        })
        .collect();
    Routed {
        group_key: format!("{}|{path}|{}", destination.key(), values.join(",")),
        destination,
        policy: policy.clone(),
    }
}

/// Collects matching leaves; true if any route below `route` matched.
fn walk<'a>(route: &'a Route, labels: &BTreeMap<String, String>, out: &mut Vec<&'a Route>) -> bool {
    let mut any = false;
    for child in &route.routes {
        if !child.matchers.iter().all(|m| m.matches(labels)) {
            continue;
        }
        any = true;
        if !walk(child, labels, out) {
            out.push(child);
        }
        if !child.continue_matching {
            break;
        }
    }
    any
}

fn build_route(
    spec: &RouteSpec,
    field: &str,
    path: &str,
    parent_receiver: &str,
    (parent, parent_queued_after): (&GroupPolicy, Option<Duration>),
    receivers: &BTreeMap<String, ReceiverSpec>,
    intervals: &BTreeMap<String, TimeInterval>,
) -> Result<Route, CoreError> {
    let receiver = spec
        .receiver
        .clone()
        .unwrap_or_else(|| parent_receiver.to_string());
    if !receivers.contains_key(&receiver) {
        return Err(CoreError::config(
            format!("{field}.receiver"),
            format!(
                "unknown receiver {receiver:?}; defined: {}",
                receivers.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let matchers = spec
        .matchers
        .iter()
        .enumerate()
        .map(|(i, text)| {
            Matcher::parse(text).map_err(|m| CoreError::config(format!("{field}.matchers[{i}]"), m))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, name) in spec.mute_time_intervals.iter().enumerate() {
        if !intervals.contains_key(name) {
            return Err(CoreError::config(
                format!("{field}.mute_time_intervals[{i}]"),
                format!("unknown time interval {name:?}"),
            ));
        }
    }
    let time = |text: &Option<String>, name: &str, inherited: Duration| match text {
        None => Ok(inherited),
        Some(text) => {
            duration::parse(text).map_err(|m| CoreError::config(format!("{field}.{name}"), m))
        }
    };
    let policy = GroupPolicy {
        group_by: spec
            .group_by
            .clone()
            .unwrap_or_else(|| parent.group_by.clone()),
        group_wait: time(&spec.group_wait, "group_wait", parent.group_wait)?,
        group_interval: time(
            &spec.group_interval,
            "group_interval",
            parent.group_interval,
        )?,
        repeat_interval: time(
            &spec.repeat_interval,
            "repeat_interval",
            parent.repeat_interval,
        )?,
    };
    let queued_after = match &spec.queued_too_long_after {
        None => parent_queued_after,
        Some(text) => Some(
            duration::parse(text)
                .map_err(|m| CoreError::config(format!("{field}.queued_too_long_after"), m))?,
        ),
    };
    if policy.group_interval.is_zero() {
        return Err(CoreError::config(
            format!("{field}.group_interval"),
            "must be more than 0",
        ));
    }
    let routes = spec
        .routes
        .iter()
        .enumerate()
        .map(|(i, child)| {
            build_route(
                child,
                &format!("{field}.routes[{i}]"),
                &format!("{path}.{i}"),
                &receiver,
                (&policy, queued_after),
                receivers,
                intervals,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Route {
        path: path.to_string(),
        receiver,
        matchers,
        continue_matching: spec.continue_matching,
        policy,
        queued_after,
        mute: spec.mute_time_intervals.clone(),
        routes,
    })
}

fn queued_thresholds(spec: &QueuedTooLongSpec) -> Result<QueuedThresholds, CoreError> {
    let mut thresholds = QueuedThresholds::default();
    if let Some(text) = &spec.after {
        thresholds.after =
            duration::parse(text).map_err(|m| CoreError::config("queued_too_long.after", m))?;
    }
    for (queue, text) in &spec.queues {
        let after = duration::parse(text)
            .map_err(|m| CoreError::config(format!("queued_too_long.queues.{queue}"), m))?;
        thresholds.queues.insert(queue.clone(), after);
    }
    Ok(thresholds)
}

fn weekday(name: &str) -> Option<u32> {
    let days = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    days.iter()
        .position(|d| d.eq_ignore_ascii_case(name.trim()))
        .map(|p| p as u32)
}

fn minutes(text: &str) -> Option<u32> {
    let (h, m) = text.trim().split_once(':')?;
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (m < 60 && (h < 24 || (h == 24 && m == 0))).then_some(h * 60 + m)
}

/// `#team-*` matches `#team-a`; anything else must be equal.
fn glob(pattern: &str, value: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => pattern == value,
    }
}
