//! The kube side of `get` and `summary`: list, watch, and hand the objects to the pure
//! code in `resources`, `watch` and `summary`.

use std::io::Write;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;
use trainyard_api::TrainingJob;

use crate::cli::OutputFormat;
use crate::error::CliError;
use crate::format::table;
use crate::resources::{Listed, Scope, View, header_row, qualified_name, row};
use crate::summary::{ClusterGpuLookup, cluster_gpus, render, summarise};
use crate::watch::{WatchPrinter, WatchState};

/// Most unfinished objects a timeout message names before "and N more".
const NAMED_IN_TIMEOUT: usize = 10;

/// What `trainyard get` was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetOptions {
    /// Namespaces to look in (ignored for cluster-scoped kinds).
    pub scope: Scope,
    /// Only these names; all when empty.
    pub names: Vec<String>,
    /// `-l`: a label selector.
    pub selector: Option<String>,
    /// `-o`.
    pub output: Option<OutputFormat>,
    /// `-w`, or implied by `--until-done`.
    pub watch: bool,
    /// `--until-done`.
    pub until_done: bool,
    /// `--timeout`.
    pub timeout: Option<Duration>,
}

fn scope_for<K: Listed>(scope: &Scope) -> Scope {
    if K::NAMESPACED {
        scope.clone()
    } else {
        Scope::AllNamespaces
    }
}

fn view_for<K: Listed>(scope: &Scope, output: Option<&OutputFormat>) -> View {
    View {
        namespace_column: K::NAMESPACED && *scope == Scope::AllNamespaces,
        wide: output == Some(&OutputFormat::Wide),
    }
}

/// kubectl's message for an empty list, on standard error so pipes stay clean.
fn nothing_found<K: Listed>(scope: &Scope) -> String {
    if K::NAMESPACED {
        format!("No {} found {}.", K::PLURAL, scope.describe())
    } else {
        format!("No {} found.", K::PLURAL)
    }
}

/// `trainyard get <kind>`: one list, or a watch.
pub async fn get<K: Listed>(
    client: Client,
    options: &GetOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    if options.until_done && !K::ENDS {
        return Err(CliError::Usage(format!(
            "--until-done needs a kind that finishes: {} have no end state",
            K::PLURAL
        )));
    }
    let scope = scope_for::<K>(&options.scope);
    check_names::<K>(&scope, options)?;
    let api = K::api(client, &scope);
    let deadline = options.timeout.map(|t| Instant::now() + t);
    if options.watch || options.until_done {
        watch::<K>(api, &scope, options, deadline, out, err).await
    } else {
        let listing = list_once(&api, &scope, options, out, err);
        match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, listing)
                .await
                .map_err(|_| timeout_error(options, format!("listing {}", K::PLURAL)))?,
            None => listing.await,
        }
    }
}

/// kubectl's rules for names: not with a selector, not across namespaces, and
/// one at a time while watching.
fn check_names<K: Listed>(scope: &Scope, options: &GetOptions) -> Result<(), CliError> {
    if options.names.is_empty() {
        return Ok(());
    }
    if options.selector.is_some() {
        return Err(CliError::Usage(
            "give names or a selector (-l), not both".to_owned(),
        ));
    }
    if K::NAMESPACED && *scope == Scope::AllNamespaces {
        return Err(CliError::Usage(format!(
            "{} are looked up by name in one namespace: drop -A or give -n",
            K::PLURAL
        )));
    }
    if (options.watch || options.until_done) && options.names.len() > 1 {
        return Err(CliError::Usage(
            "watch one name, or all (optionally with -l), not several names".to_owned(),
        ));
    }
    Ok(())
}

/// The named objects, in the order given, or every object the selector matches.
async fn fetch<K: Listed>(
    api: &Api<K>,
    scope: &Scope,
    options: &GetOptions,
) -> Result<Vec<K>, CliError> {
    if options.names.is_empty() {
        let params = ListParams {
            label_selector: options.selector.clone(),
            ..ListParams::default()
        };
        let mut items = api
            .list(&params)
            .await
            .map_err(CliError::kube(format!(
                "list {} {}",
                K::PLURAL,
                scope.describe()
            )))?
            .items;
        items.sort_by_key(|o| (o.namespace(), o.name_any()));
        return Ok(items);
    }
    let mut items = Vec::with_capacity(options.names.len());
    for name in &options.names {
        items.push(named(api, scope, name).await?);
    }
    Ok(items)
}

/// The object `name` in `scope`, or a NotFound error naming where it was looked for.
pub async fn named<K: Listed>(api: &Api<K>, scope: &Scope, name: &str) -> Result<K, CliError> {
    api.get_opt(name)
        .await
        .map_err(CliError::kube(format!("get {} {name}", K::PLURAL)))?
        .ok_or_else(|| CliError::NotFound {
            resource: K::PLURAL.to_owned(),
            name: name.to_owned(),
            scope: if K::NAMESPACED {
                format!(" {}", scope.describe())
            } else {
                String::new()
            },
        })
}

/// Every TrainingJob in `scope`.
pub async fn list_jobs(client: Client, scope: &Scope) -> Result<Vec<TrainingJob>, CliError> {
    Ok(TrainingJob::api(client, scope)
        .list(&ListParams::default())
        .await
        .map_err(CliError::kube(format!(
            "list trainingjobs {}",
            scope.describe()
        )))?
        .items)
}

/// One object alone when one name was asked for, else a kubectl-style List.
fn document<K: Listed>(items: &[K], single: bool) -> Result<serde_json::Value, CliError> {
    Ok(match items {
        [one] if single => serde_json::to_value(one)?,
        _ => serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
    })
}

async fn list_once<K: Listed>(
    api: &Api<K>,
    scope: &Scope,
    options: &GetOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let output = options.output.as_ref();
    let items = fetch(api, scope, options).await?;
    let single = options.names.len() == 1;
    match output {
        Some(OutputFormat::Json) => {
            let document = document(&items, single)?;
            writeln!(out, "{}", serde_json::to_string_pretty(&document)?)?;
            return Ok(());
        }
        Some(OutputFormat::Yaml) => {
            out.write_all(yaml_serde::to_string(&document(&items, single)?)?.as_bytes())?;
            return Ok(());
        }
        Some(OutputFormat::Name) => {
            for item in &items {
                writeln!(out, "{}", qualified_name(item))?;
            }
            return Ok(());
        }
        Some(OutputFormat::JsonPath(template)) => {
            // As kubectl: nothing added after the template's own text.
            out.write_all(template.render(&document(&items, single)?).as_bytes())?;
            return Ok(());
        }
        Some(OutputFormat::Wide) | None => {}
    }
    if items.is_empty() {
        writeln!(err, "{}", nothing_found::<K>(scope))?;
        return Ok(());
    }
    let view = view_for::<K>(scope, output);
    let now = Timestamp::now();
    let mut rows = vec![header_row::<K>(view)];
    rows.extend(items.iter().map(|item| row(item, view, now)));
    out.write_all(table(&rows).as_bytes())?;
    Ok(())
}

async fn watch<K: Listed>(
    api: Api<K>,
    scope: &Scope,
    options: &GetOptions,
    deadline: Option<Instant>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let view = view_for::<K>(scope, options.output.as_ref());
    let mut state = WatchState::<K>::new(view);
    let mut printer = WatchPrinter::new(view, options.output.clone());
    let mut config = watcher::Config::default();
    if let Some(selector) = &options.selector {
        config = config.labels(selector);
    }
    if let [name] = options.names.as_slice() {
        config = config.fields(&format!("metadata.name={name}"));
    }
    let mut events = watcher(api, config).default_backoff().boxed();
    loop {
        let next = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(next) => next,
                Err(_) => return Err(watch_timeout(options, scope, &state)),
            },
            None => events.next().await,
        };
        let event = match next {
            None => {
                return Err(CliError::WatchEnded {
                    resource: K::PLURAL.to_owned(),
                });
            }
            Some(Ok(event)) => event,
            // Before the first list a failure is a real answer (no such resource,
            // forbidden, unreachable); after it, the watcher reconnects with backoff.
            Some(Err(error)) if !state.synced() => {
                return Err(CliError::Watch {
                    action: format!("watch {} {}", K::PLURAL, scope.describe()),
                    source: Box::new(error),
                });
            }
            Some(Err(error)) => {
                writeln!(err, "warning: watch interrupted, reconnecting: {error}")?;
                continue;
            }
        };
        let was_synced = state.synced();
        let changed = state.handle(event);
        for line in printer.lines(&changed, Timestamp::now())? {
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        if state.synced() && !was_synced && state.is_empty() {
            writeln!(err, "{}", nothing_found::<K>(scope))?;
        }
        if options.until_done && state.all_finished() {
            return Ok(());
        }
    }
}

fn timeout_error(options: &GetOptions, detail: String) -> CliError {
    CliError::Timeout {
        seconds: options.timeout.map_or(0, |t| t.as_secs()),
        detail,
    }
}

fn watch_timeout<K: Listed>(
    options: &GetOptions,
    scope: &Scope,
    state: &WatchState<K>,
) -> CliError {
    let what = format!("{} {}", K::PLURAL, scope.describe());
    let detail = if !state.synced() {
        format!("the first list of {what} did not arrive")
    } else if !options.until_done {
        format!("stopped watching {what}")
    } else if state.is_empty() {
        format!("no {what} exist yet, so none could finish")
    } else {
        let unfinished = state.unfinished();
        let mut named: Vec<String> = unfinished.iter().take(NAMED_IN_TIMEOUT).cloned().collect();
        if unfinished.len() > NAMED_IN_TIMEOUT {
            named.push(format!("and {} more", unfinished.len() - NAMED_IN_TIMEOUT));
        }
        format!(
            "{} of {} {what} not finished: {}",
            unfinished.len(),
            state.len(),
            named.join(", ")
        )
    };
    timeout_error(options, detail)
}

/// `trainyard summary`: lists TrainingJobs and Nodes, prints the summary.
pub async fn summary(
    client: Client,
    scope: &Scope,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let jobs = list_jobs(client.clone(), scope).await?;
    let cluster = node_gpus(client).await?;
    let summary = summarise(scope.describe(), &jobs, cluster);
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        out.write_all(render(&summary, *scope == Scope::AllNamespaces).as_bytes())?;
    }
    Ok(())
}

/// The cluster's GPUs; a user who may not list Nodes still gets the rest of the summary.
async fn node_gpus(client: Client) -> Result<ClusterGpuLookup, CliError> {
    match Api::<Node>::all(client).list(&ListParams::default()).await {
        Ok(nodes) => Ok(Ok(cluster_gpus(&nodes.items)?)),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(Err(format!(
            "cannot list Nodes ({}), so the cluster's GPUs are not known",
            status.message
        ))),
        Err(error) => Err(CliError::kube("list nodes")(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_api::{Sweep, TrainingQueue};

    #[test]
    fn empty_messages_read_like_kubectl() {
        assert_eq!(
            nothing_found::<TrainingJob>(&Scope::Namespace("ml".into())),
            "No trainingjobs found in namespace ml."
        );
        assert_eq!(
            nothing_found::<Sweep>(&Scope::AllNamespaces),
            "No sweeps found in any namespace."
        );
        assert_eq!(
            nothing_found::<TrainingQueue>(&Scope::AllNamespaces),
            "No trainingqueues found."
        );
    }

    #[test]
    fn queues_ignore_the_namespace_and_never_get_a_namespace_column() {
        let scope = Scope::Namespace("ml".into());
        assert_eq!(scope_for::<TrainingQueue>(&scope), Scope::AllNamespaces);
        assert_eq!(scope_for::<TrainingJob>(&scope), scope);
        assert!(!view_for::<TrainingQueue>(&Scope::AllNamespaces, None).namespace_column);
        let view = view_for::<TrainingJob>(&Scope::AllNamespaces, Some(&OutputFormat::Wide));
        assert!(view.namespace_column && view.wide);
    }
}
